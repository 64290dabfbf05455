package adaptercheck_test

import (
	"context"
	"crypto/ed25519"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// sabotage names the one thing a wireAdapter gets wrong.
type sabotage int

const (
	conformant sabotage = iota
	// skipsTokenCheck runs every call, whatever its token.
	skipsTokenCheck
	// wrongMarkerDomain refuses tokens with the marker under the platform services' domain.
	wrongMarkerDomain
	// neverRenews does accepted work without renewing its lease.
	neverRenews
	// ignoresCancel answers Cancel stopped=true and finishes the work anyway.
	ignoresCancel
	// completesTwice sends its Complete a second time after it was accepted.
	completesTwice
	// givesUpOutcome sends its Complete once, whatever the answer.
	givesUpOutcome
)

// wireAdapter is an adapter written against the wire protocol alone (the generated stubs, no
// sdk/go/adapter), as an author in another language would: it verifies the token and answers the
// marker, acknowledges receipt, answers a sync call at once, accepts async work of
// payload.later_ms milliseconds and renews its lease, completes through the callbacks with retries,
// and honours Cancel — except for the one thing its sabotage breaks.
type wireAdapter struct {
	adapterv1.UnimplementedAdapterServiceServer
	sabotage   sabotage
	verifier   *platformtoken.Verifier
	callbacks  adapterv1.AdapterCallbackServiceClient
	credential string

	mu sync.Mutex
	// work holds, per execution, the cancellation of its work and a channel closed when a Cancel
	// for it arrived.
	work map[string]*work
	wg   sync.WaitGroup
	base context.Context
	stop context.CancelFunc
}

type work struct {
	cancel    context.CancelFunc
	cancelled chan struct{}
}

// askedLease is the lease the wire adapter asks for; the check grants at most its own.
const askedLease = 5 * time.Second

func newWireAdapter(s sabotage, adapterID string, key ed25519.PublicKey, callbacks *grpc.ClientConn, credential string) *wireAdapter {
	v, err := platformtoken.NewVerifier(adapterID, []ed25519.PublicKey{key})
	if err != nil {
		panic(err)
	}
	base, stop := context.WithCancel(context.Background())
	return &wireAdapter{sabotage: s, verifier: v, callbacks: adapterv1.NewAdapterCallbackServiceClient(callbacks),
		credential: credential, work: map[string]*work{}, base: base, stop: stop}
}

// close stops every work and waits for it.
func (w *wireAdapter) close() {
	w.stop()
	w.wg.Wait()
}

func (w *wireAdapter) verify(ctx context.Context, method string, id string, n int32, req proto.Message) error {
	if w.sabotage == skipsTokenCheck {
		return nil
	}
	var tok string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(platformtoken.Header); len(v) == 1 {
			tok = v[0]
		}
	}
	_, err := w.verifier.Verify(tok, platformtoken.Call{ExecutionID: id, Attempt: n, Method: method, Request: req})
	if err == nil {
		return nil
	}
	if w.sabotage == wrongMarkerDomain {
		st, _ := status.New(codes.Unauthenticated, err.Error()).WithDetails(&errdetails.ErrorInfo{
			Domain: "integrations", Reason: platformtoken.RefusalReason,
			Metadata: map[string]string{platformtoken.RefusalCheckKey: platformtoken.Check(err)}})
		return st.Err()
	}
	return platformtoken.RefusalStatus(err).Err()
}

func (w *wireAdapter) Execute(ctx context.Context, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	if err := w.verify(ctx, adapterv1.AdapterService_Execute_FullMethodName, req.GetExecutionId(), req.GetAttempt(), req); err != nil {
		return nil, err
	}
	_ = grpc.SendHeader(ctx, metadata.Pairs("integrations-received", "1"))
	later := req.GetPayload().GetFields()["later_ms"].GetNumberValue()
	if req.GetMode() == executionv1.Mode_MODE_SYNC || later == 0 {
		return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Completed{Completed: &adapterv1.Completed{
			Result: &structpb.Struct{Fields: map[string]*structpb.Value{"ok": structpb.NewBoolValue(true)}}}}}, nil
	}
	ctx, cancel := context.WithCancel(w.base)
	wk := &work{cancel: cancel, cancelled: make(chan struct{})}
	w.mu.Lock()
	w.work[req.GetExecutionId()] = wk
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer cancel()
		w.run(ctx, req, wk, time.Duration(later)*time.Millisecond)
	}()
	return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Accepted{Accepted: &adapterv1.Accepted{Lease: durationpb.New(askedLease)}}}, nil
}

func (w *wireAdapter) Cancel(ctx context.Context, req *adapterv1.CancelRequest) (*adapterv1.CancelResponse, error) {
	if err := w.verify(ctx, adapterv1.AdapterService_Cancel_FullMethodName, req.GetExecutionId(), req.GetAttempt(), req); err != nil {
		return nil, err
	}
	w.mu.Lock()
	wk := w.work[req.GetExecutionId()]
	delete(w.work, req.GetExecutionId())
	w.mu.Unlock()
	if wk == nil {
		return &adapterv1.CancelResponse{}, nil
	}
	close(wk.cancelled)
	if w.sabotage != ignoresCancel {
		wk.cancel()
	}
	return &adapterv1.CancelResponse{Stopped: true}, nil
}

func (w *wireAdapter) outgoing(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+w.credential)
}

// run does the work of one attempt: renews its lease every third of the lease granted while
// the work lasts, then delivers its outcome.
func (w *wireAdapter) run(ctx context.Context, req *adapterv1.ExecuteRequest, wk *work, d time.Duration) {
	ref := func() (string, int32, string) { return req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken() }
	done := time.NewTimer(d)
	defer done.Stop()
	renew := time.NewTimer(0)
	defer renew.Stop()
	cancelled := wk.cancelled
	for finished := false; !finished; {
		select {
		case <-ctx.Done():
			return
		case <-cancelled:
			if w.sabotage != ignoresCancel {
				return
			}
			// The work goes on, and ends now: the check sees a success after its Cancel.
			finished = true
			cancelled = nil
		case <-done.C:
			finished = true
		case <-renew.C:
			if w.sabotage == neverRenews {
				continue
			}
			id, n, tok := ref()
			resp, err := w.callbacks.RenewLease(w.outgoing(ctx), &adapterv1.RenewLeaseRequest{
				ExecutionId: id, Attempt: n, CallbackToken: tok, Lease: durationpb.New(askedLease)})
			switch {
			case err == nil:
				renew.Reset(resp.GetLease().AsDuration() / 3)
			case status.Code(err) == codes.Unavailable:
				renew.Reset(100 * time.Millisecond)
			default:
				return // refused: the attempt is over
			}
		}
	}
	id, n, tok := ref()
	complete := &adapterv1.CompleteRequest{ExecutionId: id, Attempt: n, CallbackToken: tok,
		Outcome: &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{Result: &structpb.Struct{}}}}
	until := time.Now().Add(15 * time.Second)
	for {
		_, err := w.callbacks.Complete(w.outgoing(ctx), complete)
		if err == nil && w.sabotage == completesTwice {
			_, _ = w.callbacks.Complete(w.outgoing(ctx), complete)
			return
		}
		if err == nil || status.Code(err) != codes.Unavailable || w.sabotage == givesUpOutcome || time.Now().After(until) {
			return
		}
		retry := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-retry.C:
		}
	}
}
