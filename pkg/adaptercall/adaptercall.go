// Package adaptercall calls adapters: one client connection per adapter endpoint, and every
// answer — including a transport failure — normalised into an execution.Outcome that the caller settles or
// retries. Both the gateway (sync attempts) and the execution-consumer (async attempts) use it.
package adaptercall

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec responseCodec wraps
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// maxMessage bounds an adapter's failure message as stored.
const maxMessage = 1024

// maxCode bounds an adapter's failure class and code as stored.
const maxCode = 128

// Adapter names the adapter a call goes to: its catalog id (the token's audience) and endpoint.
type Adapter struct {
	ID       string
	Endpoint string
}

// Option configures a Pool.
type Option func(*Pool)

// WithSigner makes every call carry a platform token signed by s (sdk/go/platformtoken), bound to
// the adapter, the execution, the attempt and the method. The services that call adapters always
// set it; a Pool without it sends no token (tests of adapters that do not check).
func WithSigner(s *platformtoken.Signer) Option { return func(p *Pool) { p.signer = s } }

// Pool holds one client connection per adapter endpoint.
type Pool struct {
	mu    sync.Mutex
	conns map[string]*endpoint
	// connectWait bounds how long Execute waits for a ready connection.
	connectWait time.Duration
	signer      *platformtoken.Signer
}

// DefaultConnectWait is how long Execute waits, at most, for a ready connection to the adapter
// before it answers NotSent: long enough to see an adapter that is back (connection attempts are
// at most reconnectMaxDelay apart), short enough not to hold a consumer slot through an outage.
const DefaultConnectWait = 3 * time.Second

// reconnectMaxDelay caps the backoff between connection attempts to an adapter: an adapter that
// is back is found within a second, instead of after the 5 s cap of grpcx.Dial, during which
// every call would fail fast.
const reconnectMaxDelay = time.Second

// failFastWindow is how recent a failed connection attempt must be for Execute to answer NotSent
// at once, without waiting, while the connection is in TRANSIENT_FAILURE: connection attempts are
// at most reconnectMaxDelay apart — plus gRPC's jitter of a fifth, applied after the cap, and
// however late a loaded host runs the timer — so during an outage there always is one this
// recent, and a burst of dispatches to a dead adapter does not each hold a consumer slot for the
// connect wait. (A quarter second of slack was less than the jitter alone.)
const failFastWindow = reconnectMaxDelay + reconnectMaxDelay/5 + time.Second

// endpoint is one adapter's connection, and when a connection attempt to it last failed.
type endpoint struct {
	conn *grpc.ClientConn
	// dialFailed is when a connection attempt last failed, in Unix nanoseconds (0: never).
	dialFailed atomic.Int64
	// acknowledges: this adapter has answered platformtoken.ReceivedHeader before (it runs the SDK), so a call
	// without it was not received.
	acknowledges atomic.Bool
}

// down reports whether the adapter is known to be unreachable right now: the connection is in
// TRANSIENT_FAILURE and an attempt to connect failed within failFastWindow.
func (e *endpoint) down() bool {
	last := e.dialFailed.Load()
	return e.conn.GetState() == connectivity.TransientFailure && last != 0 &&
		time.Since(time.Unix(0, last)) < failFastWindow
}

// dial is the endpoint's dialer: a plain TCP dial that records its failures.
func (e *endpoint) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		e.dialFailed.Store(time.Now().UnixNano())
	}
	return c, err
}

// NewPool returns an empty Pool.
func NewPool(opts ...Option) *Pool {
	p := &Pool{conns: map[string]*endpoint{}, connectWait: DefaultConnectWait}
	for _, o := range opts {
		o(p)
	}
	return p
}

// withToken returns ctx carrying a platform token for the call of req (unchanged without a
// signer). req must not change afterwards: the token is bound to its digest.
func (p *Pool) withToken(ctx context.Context, a Adapter, method, executionID string, attempt int32, req proto.Message) (context.Context, error) {
	if p.signer == nil {
		return ctx, nil
	}
	deadline, _ := ctx.Deadline()
	tok, err := p.signer.Sign(platformtoken.Call{
		AdapterID: a.ID, ExecutionID: executionID, Attempt: attempt, Method: method, Deadline: deadline, Request: req,
	})
	if err != nil {
		return nil, err
	}
	return metadata.AppendToOutgoingContext(ctx, platformtoken.Header, tok), nil
}

// SetConnectWait changes how long Execute waits for a ready connection (tests use it).
func (p *Pool) SetConnectWait(d time.Duration) { p.connectWait = d }

// endpoint is the adapter's at target, its connection made on first use.
func (p *Pool) endpoint(target string) (*endpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ep, ok := p.conns[target]
	if !ok {
		ep = &endpoint{}
		conn, err := grpcx.Dial(target,
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
				MinConnectTimeout: 5 * time.Second,
			}),
			grpc.WithContextDialer(ep.dial),
			grpc.WithStatsHandler(sentRecorder{}))
		if err != nil {
			return nil, err
		}
		ep.conn = conn
		p.conns[target] = ep
	}
	return ep, nil
}

// The ErrorInfo detail with which an adapter marks its refusal of a platform token, on the
// UNAUTHENTICATED it answers before doing anything: platformtoken's refusal marker, named here too
// for the platform's side. Its metadata's TokenRefusedCheckKey names the check that failed
// (platformtoken.Check).
const (
	TokenRefusedDomain   = platformtoken.RefusalDomain
	TokenRefusedCheckKey = platformtoken.RefusalCheckKey
)

// TokenRefusedReason is the marker's reason (errorsv1.ErrorReason_PLATFORM_TOKEN_REFUSED).
const TokenRefusedReason = platformtoken.RefusalReason

// IsTokenRefusal reports whether err (an adapter's answer, possibly wrapped) is an adapter's
// refusal of the platform's token: UNAUTHENTICATED with the well-formed TokenRefusedReason marker
// (platformtoken.ReadRefusal). A bare UNAUTHENTICATED is not: an adapter may answer it for its own
// provider's refusal.
func IsTokenRefusal(err error) bool {
	return platformtoken.ReadRefusal(err, false).Marked
}

// sentKey carries an Execute call's *callState.
type sentKey struct{}

// callState is what the connection's stats handler saw of one Execute call.
type callState struct {
	// sent: any of the request (its headers or payload) was handed to the transport.
	sent atomic.Bool
	// received: the adapter answered platformtoken.ReceivedHeader.
	received atomic.Bool
	// undecodable: the adapter's response reached us and could not be decoded (responseCodec).
	undecodable atomic.Bool
}

// responseCodec is the proto codec of one Execute call, marking in undecodable a response it
// could not decode. grpc-go answers such a response INTERNAL on the client side, as it does a
// broken transport; but an adapter that answered a result protobuf refuses (nested past its
// 10 000 levels, a string that is not UTF-8) answered, and will answer the same again: it is
// the adapter's protocol failure, permanent, not a transport failure to retry.
type responseCodec struct {
	encoding.CodecV2
	undecodable *atomic.Bool
}

func (c responseCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err != nil {
		c.undecodable.Store(true)
	}
	return err
}

// InvalidResult is the permanent protocol failure of an adapter whose answer the platform cannot
// take (it cannot decode it, or cannot store its result). why says what is wrong with it.
func InvalidResult(why string) execution.Outcome {
	return execution.Outcome{Kind: execution.OutcomeFailed, Failure: execution.Failure{
		Class: execution.ClassProtocol, Code: InvalidResultCode,
		Message: safetext.Truncate("adapter result refused: "+why, maxMessage),
	}}
}

// InvalidResultCode is the failure code of InvalidResult.
const InvalidResultCode = "adapter.invalid_result"

// sentRecorder is the stats.Handler of adapter connections that tells a call whose request left
// this process (its headers or its payload were handed to a transport) from one that failed
// before: only for the latter is it certain that the adapter has not started the work.
type sentRecorder struct{}

func (sentRecorder) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (sentRecorder) HandleRPC(ctx context.Context, s stats.RPCStats) {
	st, ok := ctx.Value(sentKey{}).(*callState)
	if !ok {
		return
	}
	switch s := s.(type) {
	case *stats.OutHeader, *stats.OutPayload:
		st.sent.Store(true)
	case *stats.InHeader:
		if len(s.Header.Get(platformtoken.ReceivedHeader)) > 0 {
			st.received.Store(true)
		}
	}
}
func (sentRecorder) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (sentRecorder) HandleConn(context.Context, stats.ConnStats)                       {}

// waitReady waits until conn is ready, or ctx ends.
func waitReady(ctx context.Context, conn *grpc.ClientConn) bool {
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready:
			return true
		case connectivity.Idle:
			conn.Connect()
		case connectivity.Shutdown:
			return false
		}
		if !conn.WaitForStateChange(ctx, s) {
			return false
		}
	}
}

// Close closes every connection.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for target, ep := range p.conns {
		errs = append(errs, ep.conn.Close())
		delete(p.conns, target)
	}
	return errors.Join(errs...)
}

// errNotSentInTime is the cause of a call cancelled because none of it went out within the
// connect wait.
var errNotSentInTime = errors.New("adapter call not sent within the connect wait")

// Execute calls the adapter at endpoint within ctx's deadline and normalises its answer. A
// transport failure or a deadline is a retryable failure of class unavailable or timeout; an
// answer with no outcome is a permanent protocol failure.
//
// It first waits for a ready connection (at most the Pool's connect wait, within ctx), and the
// call itself waits for readiness too (WaitForReady) rather than failing fast while the
// connection is between two attempts — but only until the connect wait after the call began: a
// call none of whose headers went out by then (the adapter died after the ready check) is
// cancelled, rather than waiting until its deadline (the lease). When the connection never became
// ready, or the call failed before any of its headers or payload went out (the connection's stats
// handler records that), the failure is NotSent: the adapter cannot have started the work. While
// the adapter is known to be down (the connection in TRANSIENT_FAILURE and a connection attempt
// failed within the last two seconds or so) Execute answers NotSent at once, without waiting.
//
// The call carries a platform token (WithSigner). An adapter whose SDK refuses it did nothing: the
// failure is NotSent and Refused, so the attempt is not spent and is tried again as for an
// unreachable adapter, until the execution's deadline — what an operator wants while a key
// rotation reaches the adapters in the wrong order. Only the SDK's own refusal counts, which it
// marks (IsTokenRefusal): any other UNAUTHENTICATED answer — an adapter not on the SDK whose
// provider refused its key, perhaps after doing the work — spends the attempt like any failure;
// one carrying a malformed marker does too, and says what is wrong with it (MalformedRefusal).
func (p *Pool) Execute(ctx context.Context, a Adapter, req *adapterv1.ExecuteRequest) execution.Outcome {
	ep, err := p.endpoint(a.Endpoint)
	if err != nil {
		return transportFailure(err)
	}
	ctx, err = p.withToken(ctx, a, adapterv1.AdapterService_Execute_FullMethodName, req.GetExecutionId(), req.GetAttempt(), req)
	if err != nil {
		out := transportFailure(err)
		out.NotSent = true
		return out
	}
	if ep.down() {
		return notReachable()
	}
	wctx, cancel := context.WithTimeout(ctx, p.connectWait)
	ready := waitReady(wctx, ep.conn)
	cancel()
	if !ready {
		return notReachable()
	}
	call := new(callState)
	sent := &call.sent
	callCtx, cancelCall := context.WithCancelCause(context.WithValue(ctx, sentKey{}, call))
	defer cancelCall(nil)
	notSentTimer := time.AfterFunc(p.connectWait, func() {
		if !sent.Load() {
			// Racing a header going out just now is harmless: NotSent is decided below from
			// sent, so such a call counts as sent.
			cancelCall(errNotSentInTime)
		}
	})
	resp, err := adapterv1.NewAdapterServiceClient(ep.conn).Execute(callCtx, req, grpc.WaitForReady(true),
		grpc.ForceCodecV2(responseCodec{CodecV2: encoding.GetCodecV2("proto"), undecodable: &call.undecodable}))
	notSentTimer.Stop()
	if call.received.Load() {
		ep.acknowledges.Store(true)
	}
	if err != nil && call.undecodable.Load() {
		out := InvalidResult("its response could not be decoded (a result nested too deep, or text that is not UTF-8)")
		out.Cause = err
		return out
	}
	if err != nil {
		if !sent.Load() {
			if errors.Is(context.Cause(callCtx), errNotSentInTime) {
				return notReachable()
			}
			out := transportFailure(err)
			out.NotSent = true
			return out
		}
		refusal := platformtoken.ReadRefusal(err, call.received.Load())
		if refusal.Marked {
			out := transportFailure(err)
			out.Failure.Message = "adapter refused the platform's credential"
			out.MalformedRefusal = refusal.Detail
			if refusal.Check == platformtoken.CheckReplayed {
				// We sign afresh for every call: someone else used this call's token first, with
				// this very request (the token is bound to it), so the work may have run. Spent.
				out.Replayed = true
				return out
			}
			out.NotSent, out.Refused = true, true
			return out
		}
		out := transportFailure(err)
		out.MalformedRefusal = refusal.Detail
		// Sent onto a connection whose adapter had just died (gRPC calls a request sent once it
		// is queued on the transport, before the peer is known to be gone): an adapter that
		// acknowledges receipt and did not, on a connection that broke, never ran its handler.
		// Only a broken connection counts — a deadline may pass while the adapter works.
		out.NotSent = ep.acknowledges.Load() && !call.received.Load() && status.Code(err) == codes.Unavailable
		return out
	}
	switch o := resp.GetOutcome().(type) {
	case *adapterv1.ExecuteResponse_Completed:
		return execution.Outcome{Kind: execution.OutcomeCompleted, Result: o.Completed.GetResult()}
	case *adapterv1.ExecuteResponse_Failed:
		return FromFailed(o.Failed)
	case *adapterv1.ExecuteResponse_Accepted:
		return execution.Outcome{Kind: execution.OutcomeAccepted, Lease: o.Accepted.GetLease().AsDuration()}
	}
	return execution.Outcome{Kind: execution.OutcomeFailed, Failure: execution.Failure{Class: execution.ClassProtocol, Message: "adapter answered no outcome"}}
}

// notReachable is the outcome of a call that did not reach the adapter: nothing was sent.
func notReachable() execution.Outcome {
	out := transportFailure(status.Error(codes.Unavailable, "adapter not reachable"))
	out.NotSent = true
	return out
}

// FromFailed normalises an adapter's Failed message (also used for callbacks).
func FromFailed(f *adapterv1.Failed) execution.Outcome {
	// The adapter's class and code are stored as text like its message: cleaned and bounded
	// the same way, so that an adapter's NUL byte cannot fail the settlement and leave the
	// attempt running until its lease ends.
	class := safetext.Truncate(f.GetClass(), maxCode)
	if class == "" {
		class = execution.ClassTransient
		if !f.GetRetryable() {
			class = execution.ClassPermanent
		}
	}
	return execution.Outcome{
		Kind:       execution.OutcomeFailed,
		Failure:    execution.Failure{Class: class, Code: safetext.Truncate(f.GetCode(), maxCode), Message: safetext.Truncate(f.GetMessage(), maxMessage)},
		Retryable:  f.GetRetryable(),
		RetryAfter: f.GetRetryAfter().AsDuration(),
	}
}

func transportFailure(err error) execution.Outcome {
	class := execution.ClassUnavailable
	if status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
		class = execution.ClassTimeout
	}
	return execution.Outcome{Kind: execution.OutcomeFailed, Retryable: true, Cause: err, Failure: execution.Failure{
		Class: class, Code: status.Code(err).String(), Message: safetext.Truncate(transportMessage(err), maxMessage),
	}}
}

// transportMessage is the failure message stored (and shown to the client) for a call that got no
// answer of the adapter's own. gRPC's local errors name the adapter's address and the dialler's
// wording ("dial tcp 10.0.3.7:9096: connect: connection refused"), which is ours to log, not the
// client's to read; a status the adapter itself sent keeps its message.
func transportMessage(err error) string {
	switch status.Code(err) {
	case codes.Unavailable:
		return "adapter unavailable"
	case codes.DeadlineExceeded:
		return "adapter did not answer within the attempt's deadline"
	case codes.Canceled:
		return "adapter call cancelled"
	case codes.Unknown, codes.Internal:
		return "adapter call failed: " + status.Code(err).String()
	}
	return fmt.Sprintf("adapter answered %s: %s", status.Code(err), status.Convert(err).Message())
}

// Cancel asks the adapter at endpoint to stop the work of a cancelled execution's attempt. It is
// best effort: an adapter may not implement it (UNIMPLEMENTED), and the execution is settled
// whatever it answers. It reports whether the adapter found running work to stop.
func (p *Pool) Cancel(ctx context.Context, a Adapter, executionID string, attempt int32) (bool, error) {
	ep, err := p.endpoint(a.Endpoint)
	if err != nil {
		return false, err
	}
	req := &adapterv1.CancelRequest{ExecutionId: executionID, Attempt: attempt}
	ctx, err = p.withToken(ctx, a, adapterv1.AdapterService_Cancel_FullMethodName, executionID, attempt, req)
	if err != nil {
		return false, fmt.Errorf("cancel attempt %d of %s: %w", attempt, executionID, err)
	}
	resp, err := adapterv1.NewAdapterServiceClient(ep.conn).Cancel(ctx, req)
	if err != nil {
		return false, fmt.Errorf("cancel attempt %d of %s at the adapter: %w", attempt, executionID, err)
	}
	return resp.GetStopped(), nil
}
