package adapter

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// Codes the SDK itself puts on failures it answers on the handler's behalf, so that they can
// be told apart from provider codes in the execution's failure.
const (
	CodeHandlerPanic   = "adapter.handler_panic"
	CodeInvalidResult  = "adapter.invalid_result"
	CodeShuttingDown   = "adapter.shutting_down"
	CodeNoCallbackAddr = "adapter.no_callback_addr"
)

// Options configures a Server.
type Options struct {
	// CallbackAddr is the adapter-callback service (host:port). Required for Later work in
	// async executions; without it such work is refused with a retryable failure.
	//
	// It is dialled in plaintext unless DialOptions carry transport credentials: Credential and
	// every outcome then travel unencrypted. That default suits a callback service on loopback or
	// in a trusted private network only; anywhere else pass TLS credentials in DialOptions.
	CallbackAddr string
	// Credential is the adapter's own credential, sent as `authorization: Bearer` on every
	// callback (in the clear unless DialOptions carry TLS credentials).
	Credential string
	// Logger receives the SDK's logs; nil logs nothing.
	Logger *zap.Logger
	// DialOptions are added when dialling CallbackAddr, after the SDK's own, so that they take
	// precedence. Without a grpc.WithTransportCredentials among them the connection is plaintext
	// (insecure.NewCredentials()): the default, for a callback service on loopback or in a trusted
	// private network. To use TLS, pass its credentials, e.g.
	//
	//	grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	DialOptions []grpc.DialOption

	// AdapterID is this adapter's id in the platform's catalog: the audience the platform's
	// tokens are addressed to. Required, with PlatformKeys, unless InsecureSkipPlatformAuth.
	AdapterID string
	// PlatformKeys are the platform's public keys (sdk/go/platformtoken): every Execute and Cancel
	// must carry a token signed by one of them, or is refused with UNAUTHENTICATED before the
	// handler runs. Several during a key rotation: the new one added before the platform signs
	// with it, the old one removed after. platformtoken.ParsePublicKeys reads them from text.
	PlatformKeys []ed25519.PublicKey
	// InsecureSkipPlatformAuth serves calls without checking the platform's token: anyone who
	// reaches the port can run the handler. For tests and local experiments only.
	InsecureSkipPlatformAuth bool
}

// Server serves AdapterService for one Handler and owns the background work of Later results.
type Server struct {
	h    Handler
	opts Options
	log  *zap.Logger
	// verifier checks the platform's token on every call; nil only with InsecureSkipPlatformAuth.
	verifier *platformtoken.Verifier
	// refusals samples the log lines of refused calls: anyone who reaches the port can cause one.
	refusals refusalSampler

	// base is the parent of every background work context; cancelling it is how Close stops
	// the work.
	base       context.Context
	cancelBase context.CancelFunc
	// delivering is the context outcomes are delivered on: it outlives the work (cancelled work
	// still reports how it ended) and ends shutdownGrace after Shutdown's ctx ended.
	delivering     context.Context
	stopDelivering context.CancelFunc

	mu      sync.Mutex
	idle    *sync.Cond // signalled when running drops to zero
	running int
	closed  bool
	// work holds the cancel functions of each attempt's work in progress (an Execute call, Later
	// work), for Cancel.
	work     map[workKey]map[uint64]context.CancelCauseFunc
	nextWork uint64

	dialOnce sync.Once
	conn     *grpc.ClientConn
	client   adapterv1.AdapterCallbackServiceClient
	dialErr  error

	closeOnce sync.Once
}

// New returns a Server running h. Nothing is dialled until the first Later work needs the
// callback service. It fails when the platform's credential cannot be checked: no AdapterID or
// no PlatformKeys (and InsecureSkipPlatformAuth not set) — an adapter must not start open to
// anyone by omission.
func New(h Handler, opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	var verifier *platformtoken.Verifier
	if !opts.InsecureSkipPlatformAuth {
		var err error
		if verifier, err = platformtoken.NewVerifier(opts.AdapterID, opts.PlatformKeys); err != nil {
			return nil, fmt.Errorf("adapter: %w (set Options.AdapterID and Options.PlatformKeys; InsecureSkipPlatformAuth only in tests)", err)
		}
	} else {
		log.Warn("platform token checks are off: anyone who reaches this adapter can run its handler")
	}
	base, cancel := context.WithCancel(context.Background())
	delivering, stopDelivering := context.WithCancel(context.Background())
	s := &Server{h: h, opts: opts, log: log, verifier: verifier, base: base, cancelBase: cancel,
		delivering: delivering, stopDelivering: stopDelivering, work: map[workKey]map[uint64]context.CancelCauseFunc{}}
	s.idle = sync.NewCond(&s.mu)
	return s, nil
}

// authenticate checks the platform's token on a call for an attempt, req being the request
// received, before anything of the call is acted on. A refusal is UNAUTHENTICATED with the
// refusal marker (platformtoken.RefusalStatus), sent before the received header: the platform
// knows that nothing ran (it treats the adapter as one it could not use, and spends no attempt).
func (s *Server) authenticate(ctx context.Context, method, executionID string, attempt int32, req proto.Message) error {
	if s.verifier == nil {
		return nil
	}
	var token string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(platformtoken.Header); len(v) == 1 {
			token = v[0]
		}
	}
	_, err := s.verifier.Verify(token, platformtoken.Call{ExecutionID: executionID, Attempt: attempt, Method: method, Request: req})
	if err != nil {
		// The reason only, never the token; the ids are bounded by what the platform stores, but
		// an unauthenticated caller chose them: cut to a safe length. At most one line a second
		// (with the count of those not logged): a caller without a token must not be able to
		// flood the adapter's logs.
		if ok, unlogged := s.refusals.sample(); ok {
			s.log.Warn("call refused: platform token", zap.String("method", method),
				zap.String("execution_id", truncate(executionID, 64)), logAttempt(attempt), zap.Error(err),
				zap.Int("refused_unlogged", unlogged))
		}
		return platformtoken.Refuse(err)
	}
	return nil
}

// refusalEvery is the least time between two log lines of refused calls.
const refusalEvery = time.Second

// refusalSampler lets through one refusal's log line per refusalEvery and counts the others.
type refusalSampler struct {
	mu       sync.Mutex
	last     time.Time
	unlogged int
	now      func() time.Time // nil: time.Now
}

// sample reports whether this refusal is logged and, if so, how many were not since the last
// line.
func (r *refusalSampler) sample() (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.now != nil {
		now = r.now()
	}
	if !r.last.IsZero() && now.Sub(r.last) < refusalEvery {
		r.unlogged++
		return false, 0
	}
	n := r.unlogged
	r.last, r.unlogged = now, 0
	return true, n
}

// Register registers AdapterService on g (a *grpc.Server, or any grpc.ServiceRegistrar).
func (s *Server) Register(g grpc.ServiceRegistrar) {
	adapterv1.RegisterAdapterServiceServer(g, service{s: s})
}

// Wait blocks until no background work is running. Work started after Wait returns is not
// awaited; to stop taking new work first, use Shutdown.
func (s *Server) Wait() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.running > 0 {
		s.idle.Wait()
	}
}

// shutdownGrace is how long, after Shutdown's ctx ended, cancelled work still has to return and
// deliver its outcome. Shutdown returns by then (plus a moment for the deliveries to see their
// context end), whatever the callback service or the handler does: a bound a deploy can plan for.
// An outcome not delivered by then is left to the platform's lease, as an adapter that died.
const shutdownGrace = 2 * time.Second

// ErrShutdownIncomplete is returned by Shutdown when background work was still running at its
// bound (a handler that does not return when its context is cancelled).
var ErrShutdownIncomplete = errors.New("adapter: background work still running at the end of shutdown")

// Shutdown stops the Server for graceful shutdown: new Later work is refused (with a retryable
// failure, so another replica takes the next attempt), running work may finish until ctx ends,
// and is then cancelled; cancelled work then has shutdownGrace (2 s) to return and deliver its
// outcome, after which deliveries still retrying stop (each logs its outcome as not delivered).
// Shutdown returns by then — with ErrShutdownIncomplete if work still runs — and closes the
// callback connection. Call it after the gRPC server stopped taking calls.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()

	done := make(chan struct{})
	go func() { s.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		running := s.running
		s.mu.Unlock()
		if running > 0 {
			s.log.Info("cancelling background work for shutdown", zap.Int("running", running))
		}
		s.cancelBase()
		grace := time.NewTimer(shutdownGrace)
		select {
		case <-done:
		case <-grace.C:
			s.stopDelivering()
			// Deliveries return as soon as their context ends; work that ignores its
			// cancellation is not waited for.
			moment := time.NewTimer(shutdownGrace / 4)
			select {
			case <-done:
			case <-moment.C:
				s.mu.Lock()
				running = s.running
				s.mu.Unlock()
				s.log.Warn("background work still running at the end of shutdown", zap.Int("running", running))
				err = ErrShutdownIncomplete
			}
			moment.Stop()
		}
		grace.Stop()
	}
	s.cancelBase()
	s.stopDelivering()

	s.closeOnce.Do(func() {
		if s.conn != nil {
			if cerr := s.conn.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("close callback connection: %w", cerr))
			}
		}
	})
	return err
}

// Close is Shutdown without a grace period: running work is cancelled at once. Work that ends
// because of it should answer a retryable failure (for example Fail(ClassUnavailable, ...,
// true)), which is then delivered so that the next attempt need not wait for the lease to
// expire.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return s.Shutdown(ctx)
}

// startWork counts one background work in, unless the Server is shutting down.
func (s *Server) startWork() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.running++
	return true
}

func (s *Server) endWork() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if s.running == 0 {
		s.idle.Broadcast()
	}
}

// workKey names one attempt.
type workKey struct {
	executionID string
	attempt     int32
}

// track registers cancel as a way to stop the attempt's work, until the returned function is
// called.
func (s *Server) track(k workKey, cancel context.CancelCauseFunc) (untrack func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextWork++
	id := s.nextWork
	if s.work[k] == nil {
		s.work[k] = map[uint64]context.CancelCauseFunc{}
	}
	s.work[k][id] = cancel
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.work[k], id)
		if len(s.work[k]) == 0 {
			delete(s.work, k)
		}
	}
}

// cancelWork cancels every piece of work of the attempt with ErrCancelled and reports whether
// there was any.
func (s *Server) cancelWork(k workKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cancel := range s.work[k] {
		cancel(ErrCancelled)
	}
	return len(s.work[k]) > 0
}

func (s *Server) callbackClient() (adapterv1.AdapterCallbackServiceClient, error) {
	s.dialOnce.Do(func() {
		if s.opts.CallbackAddr == "" {
			s.dialErr = errors.New("no callback address configured")
			return
		}
		s.conn, s.dialErr = dial(s.opts.CallbackAddr, s.opts.DialOptions...)
		if s.dialErr == nil {
			s.client = adapterv1.NewAdapterCallbackServiceClient(s.conn)
		}
	})
	return s.client, s.dialErr
}

// service is the generated interface's implementation; it is separate from Server so that the
// Server's exported API stays the SDK's own.
type service struct {
	adapterv1.UnimplementedAdapterServiceServer
	s *Server
}

// Execute runs the handler for one attempt. It answers an error status only for a call without
// a valid platform token (UNAUTHENTICATED); every problem of the adapter is a Failed outcome,
// which the platform records and retries by its rules.
func (v service) Execute(ctx context.Context, in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	s := v.s
	if err := s.authenticate(ctx, adapterv1.AdapterService_Execute_FullMethodName, in.GetExecutionId(), in.GetAttempt(), in); err != nil {
		return nil, err
	}
	// The attempt's trace, whether or not the adapter's gRPC server has tracing interceptors: its
	// work and callbacks continue it.
	ctx = fromIncoming(ctx)
	// Acknowledge receipt before any work starts: a platform whose call then fails on a broken
	// connection without this header knows the handler never ran, and spends no attempt.
	_ = grpc.SendHeader(ctx, metadata.Pairs(platformtoken.ReceivedHeader, "1"))
	req := newRequest(in)
	log := s.log.With(logExecutionID(req.ExecutionID), logAttempt(req.Attempt), zap.String("capability", req.Capability))
	if !req.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	// The handler's own work can be cancelled too, while the call lasts.
	ctx, cancelCall := context.WithCancelCause(ctx)
	defer cancelCall(nil)
	defer s.track(workKey{req.ExecutionID, req.Attempt}, cancelCall)()

	res := s.run(ctx, log, func(ctx context.Context) Result { return s.h(ctx, req) })
	if res.kind == kindLater {
		if req.Mode == ModeSync {
			later := res.later
			cb := &Callbacks{executionID: req.ExecutionID, attempt: req.Attempt, inline: true}
			res = s.run(ctx, log, func(ctx context.Context) Result { return later(ctx, cb) })
			if res.kind == kindLater {
				res = invalidResult(log, "Later work returned Later")
			}
		} else {
			res = s.accept(ctx, log, req, in.GetCallbackToken(), res)
		}
	}
	resp, err := toResponse(res)
	if err != nil {
		log.Error("adapter result is not representable as JSON", zap.Error(err))
		resp, _ = toResponse(Fail(ClassPermanent, CodeInvalidResult, "adapter result is not representable as JSON", false))
	}
	log.Debug("execute answered", zap.String("outcome", outcomeName(resp)))
	return resp, nil
}

// run calls fn, turning a panic or an invalid Result into a permanent failure.
func (s *Server) run(ctx context.Context, log *zap.Logger, fn func(ctx context.Context) Result) (res Result) {
	defer func() {
		if r := recover(); r != nil {
			// The panic value may quote the payload; it goes to the log only, never into the
			// failure message that clients read.
			log.Error("adapter handler panicked", zap.String("panic", fmt.Sprint(r)), zap.ByteString("stack", debug.Stack()))
			res = Fail(ClassPermanent, CodeHandlerPanic, "adapter handler panicked", false)
		}
	}()
	res = fn(ctx)
	switch {
	case res.kind == kindNone:
		return invalidResult(log, "handler returned the zero Result")
	case res.kind == kindLater && res.later == nil:
		return invalidResult(log, "handler returned Later with a nil function")
	}
	return res
}

func invalidResult(log *zap.Logger, why string) Result {
	log.Error("adapter handler returned an invalid result", zap.String("reason", why))
	return Fail(ClassPermanent, CodeInvalidResult, "adapter returned an invalid result", false)
}

// accept starts Later work in the background and answers Accepted, or answers why it cannot. The
// work outlives call (the Execute call's context) but continues its trace.
func (s *Server) accept(call context.Context, log *zap.Logger, req *Request, token string, res Result) Result {
	// Counted in before dialling, so that Shutdown, which waits for the count, never races a
	// dial when it closes the connection.
	if !s.startWork() {
		return Fail(ClassUnavailable, CodeShuttingDown, "adapter is shutting down", true)
	}
	client, err := s.callbackClient()
	if err != nil {
		s.endWork()
		// A configuration fault of this adapter, which a fixed deployment can recover from:
		// retryable.
		log.Error("cannot start background work", zap.Error(err))
		return Fail(ClassUnavailable, CodeNoCallbackAddr, "adapter cannot reach the callback service", true)
	}
	cb := &Callbacks{
		client: client, credential: s.opts.Credential,
		executionID: req.ExecutionID, attempt: req.Attempt, token: token,
	}
	cb.lease.Store(int64(res.lease))
	// Until a renewal says what the platform granted, the lease is taken to run as asked.
	cb.leaseEnd.Store(time.Now().Add(res.lease).UnixNano())
	// Tracked before Accepted is answered, so that a Cancel that follows the answer finds the
	// work.
	ctx, cancel := context.WithCancelCause(trace.ContextWithSpanContext(s.base, trace.SpanContextFromContext(call)))
	untrack := s.track(workKey{req.ExecutionID, req.Attempt}, cancel)
	go func() {
		defer untrack()
		defer cancel(nil)
		s.background(ctx, cancel, log, req.Deadline, cb, res.later)
	}()
	return res
}

// Cancel implements AdapterService.Cancel: the attempt's work in progress is cancelled (its
// context's cause is ErrCancelled), its lease is no longer renewed, and no outcome is sent for
// it. Work that has already ended, or that this replica does not run, is not affected.
func (v service) Cancel(ctx context.Context, in *adapterv1.CancelRequest) (*adapterv1.CancelResponse, error) {
	if err := v.s.authenticate(ctx, adapterv1.AdapterService_Cancel_FullMethodName, in.GetExecutionId(), in.GetAttempt(), in); err != nil {
		return nil, err
	}
	stopped := v.s.cancelWork(workKey{in.GetExecutionId(), in.GetAttempt()})
	v.s.log.Info("cancel requested", logExecutionID(in.GetExecutionId()), logAttempt(in.GetAttempt()), zap.Bool("stopped", stopped))
	return &adapterv1.CancelResponse{Stopped: stopped}, nil
}

func newRequest(in *adapterv1.ExecuteRequest) *Request {
	req := &Request{
		ExecutionID: in.GetExecutionId(),
		Attempt:     in.GetAttempt(),
		Capability:  in.GetCapability(),
		Payload:     in.GetPayload().AsMap(),
		Mode:        ModeAsync,
	}
	if in.GetMode() == executionv1.Mode_MODE_SYNC {
		req.Mode = ModeSync
	}
	// The deadline on this host's clock: counted from the time left that the platform measured,
	// not read from deadline_time, which is on the platform's clock (an older platform sends only
	// that).
	switch {
	case in.GetDeadlineIn() != nil:
		req.Deadline = time.Now().Add(in.GetDeadlineIn().AsDuration())
	case in.GetDeadlineTime() != nil:
		req.Deadline = in.GetDeadlineTime().AsTime()
	}
	return req
}

func toResponse(r Result) (*adapterv1.ExecuteResponse, error) {
	switch r.kind {
	case kindCompleted:
		st, err := toStruct(r.result)
		if err != nil {
			return nil, err
		}
		return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Completed{Completed: &adapterv1.Completed{Result: st}}}, nil
	case kindLater:
		return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Accepted{Accepted: &adapterv1.Accepted{Lease: durationpb.New(r.lease)}}}, nil
	default:
		return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Failed{Failed: toFailed(r)}}, nil
	}
}

func toFailed(r Result) *adapterv1.Failed {
	f := &adapterv1.Failed{Class: r.class, Code: r.code, Message: r.message, Retryable: r.retryable}
	if r.retryAfter > 0 {
		f.RetryAfter = durationpb.New(r.retryAfter)
	}
	return f
}

// toStruct converts a JSON-like map. structpb accepts only the types encoding/json decodes
// into, so anything else (typed slices, structs with json tags) goes through a JSON round trip.
func toStruct(m map[string]any) (*structpb.Struct, error) {
	if st, err := structpb.NewStruct(m); err == nil {
		return st, nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	var plain map[string]any
	if err := json.Unmarshal(b, &plain); err != nil {
		return nil, fmt.Errorf("decode result: %w", err)
	}
	st, err := structpb.NewStruct(plain)
	if err != nil {
		return nil, fmt.Errorf("convert result: %w", err)
	}
	return st, nil
}

func outcomeName(resp *adapterv1.ExecuteResponse) string {
	switch resp.GetOutcome().(type) {
	case *adapterv1.ExecuteResponse_Completed:
		return "completed"
	case *adapterv1.ExecuteResponse_Accepted:
		return "accepted"
	default:
		return "failed"
	}
}
