package adapter_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken/tokentest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	credential = "adapter-credential"
	token      = "callback-token"
)

// fakeCallbacks is a real AdapterCallbackService served in the test process; it records what
// the SDK sends and can be told to refuse.
type fakeCallbacks struct {
	adapterv1.UnimplementedAdapterCallbackServiceServer

	// completeUnavailable is how many Complete calls to answer UNAVAILABLE before accepting.
	completeUnavailable int
	// completeCodes are answered, in order, to the first Complete calls after those.
	completeCodes []codes.Code
	// refuseResult refuses every succeeded outcome as the platform refuses a result it cannot
	// store (INVALID_ARGUMENT naming the result).
	refuseResult bool
	// renewRefusal, if not OK, refuses every renewal with that code.
	renewRefusal codes.Code

	mu      sync.Mutex
	bearers []string
	// traceparents are the callbacks' traceparent metadata, in order ("" for none).
	traceparents []string
	renewals     []*adapterv1.RenewLeaseRequest
	progress     []*adapterv1.ReportProgressRequest
	completes    []*adapterv1.CompleteRequest
	completeN    int

	completed chan *adapterv1.CompleteRequest
}

func (f *fakeCallbacks) seen(ctx context.Context) {
	auth := metadata.ValueFromIncomingContext(ctx, "authorization")
	f.bearers = append(f.bearers, strings.TrimPrefix(strings.Join(auth, ","), "Bearer "))
	tp := metadata.ValueFromIncomingContext(ctx, "traceparent")
	f.traceparents = append(f.traceparents, strings.Join(tp, ","))
}

func (f *fakeCallbacks) RenewLease(ctx context.Context, in *adapterv1.RenewLeaseRequest) (*adapterv1.RenewLeaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen(ctx)
	if f.renewRefusal != codes.OK {
		return nil, status.Error(f.renewRefusal, "attempt is no longer current")
	}
	f.renewals = append(f.renewals, in)
	return &adapterv1.RenewLeaseResponse{LeaseExpireTime: timestamppb.New(time.Now().Add(in.GetLease().AsDuration()))}, nil
}

func (f *fakeCallbacks) ReportProgress(ctx context.Context, in *adapterv1.ReportProgressRequest) (*adapterv1.ReportProgressResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen(ctx)
	f.progress = append(f.progress, in)
	return &adapterv1.ReportProgressResponse{}, nil
}

func (f *fakeCallbacks) Complete(ctx context.Context, in *adapterv1.CompleteRequest) (*adapterv1.CompleteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen(ctx)
	f.completeN++
	if f.completeN <= f.completeUnavailable {
		return nil, status.Error(codes.Unavailable, "restarting")
	}
	if len(f.completeCodes) > 0 {
		c := f.completeCodes[0]
		f.completeCodes = f.completeCodes[1:]
		return nil, status.Error(c, "settlement: transport is closing")
	}
	if _, ok := in.GetOutcome().(*adapterv1.CompleteRequest_Succeeded); ok && f.refuseResult {
		// As the platform refuses a result it cannot store: INVALID_ARGUMENT naming the field.
		st, err := status.New(codes.InvalidArgument, "result: not a JSON object: json: unsupported value: NaN").WithDetails(
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "result", Description: "not a JSON object"}}})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	f.completes = append(f.completes, in)
	f.completed <- in
	return &adapterv1.CompleteResponse{}, nil
}

func (f *fakeCallbacks) renewalCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.renewals)
}

type bundle struct {
	client adapterv1.AdapterServiceClient
	server *adapter.Server
	fake   *fakeCallbacks
}

// setup serves h through the SDK on a localhost listener, with fake as its callback service.
func setup(t *testing.T, fake *fakeCallbacks, h adapter.Handler) *bundle {
	t.Helper()
	fake.completed = make(chan *adapterv1.CompleteRequest, 10)
	return serve(t, grpc.NewServer(), fake, fake, h)
}

// serve serves h through the SDK on a localhost listener, its callbacks going to cb on cbSrv
// (fake is what cb records into), dialled with callbackDial.
func serve(t *testing.T, cbSrv *grpc.Server, cb adapterv1.AdapterCallbackServiceServer, fake *fakeCallbacks,
	h adapter.Handler, callbackDial ...grpc.DialOption) *bundle {
	t.Helper()
	cbLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adapterv1.RegisterAdapterCallbackServiceServer(cbSrv, cb)
	go func() { _ = cbSrv.Serve(cbLis) }()

	keys := tokentest.New(t, "test-adapter")
	s, err := adapter.New(h, adapter.Options{CallbackAddr: cbLis.Addr().String(), Credential: credential, Logger: zaptest.NewLogger(t),
		DialOptions: callbackDial, AdapterID: keys.AdapterID, PlatformKeys: []ed25519.PublicKey{keys.Public}})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	s.Register(srv)
	go func() { _ = srv.Serve(lis) }()

	// Calls are signed as the platform signs them: the SDK's check is on in every test.
	conn, err := dialTest(lis.Addr().String(), keys.DialOption())
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		require.NoError(t, s.Close())
		cbSrv.Stop()
	})
	return &bundle{client: adapterv1.NewAdapterServiceClient(conn), server: s, fake: fake}
}

func execute(t *testing.T, b *bundle, payload map[string]any, mode executionv1.Mode) *adapterv1.ExecuteResponse {
	t.Helper()
	st, err := structpb.NewStruct(payload)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := b.client.Execute(ctx, &adapterv1.ExecuteRequest{
		ExecutionId: "exec-1", Attempt: 3, Capability: "test.cap", Payload: st,
		DeadlineTime: timestamppb.New(time.Now().Add(time.Minute)), CallbackToken: token, Mode: mode,
	})
	require.NoError(t, err)
	return resp
}

func awaitComplete(t *testing.T, f *fakeCallbacks) *adapterv1.CompleteRequest {
	t.Helper()
	select {
	case c := <-f.completed:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no Complete callback received")
		return nil
	}
}

func TestExecuteCompleted(t *testing.T) {
	t.Parallel()
	var got *adapter.Request
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		got = req
		_, hasDeadline := ctx.Deadline()
		return adapter.Complete(map[string]any{
			"to": req.Payload["to"], "deadline": hasDeadline,
			// Not a structpb type: converted through JSON.
			"tags": []string{"a", "b"},
		})
	})

	resp := execute(t, b, map[string]any{"to": "+33600000000"}, executionv1.Mode_MODE_ASYNC)

	require.Equal(t, map[string]any{"to": "+33600000000", "deadline": true, "tags": []any{"a", "b"}},
		resp.GetCompleted().GetResult().AsMap())
	require.Equal(t, "exec-1", got.ExecutionID)
	require.EqualValues(t, 3, got.Attempt)
	require.Equal(t, "test.cap", got.Capability)
	require.Equal(t, adapter.ModeAsync, got.Mode)
	require.WithinDuration(t, time.Now().Add(time.Minute), got.Deadline, 10*time.Second)
}

func TestExecuteFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Fail(adapter.ClassTransient, "rate_limited", "provider throttled", true).RetryAfter(1500 * time.Millisecond)
	})

	f := execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetFailed()

	require.NotNil(t, f)
	require.Equal(t, adapter.ClassTransient, f.GetClass())
	require.Equal(t, "rate_limited", f.GetCode())
	require.Equal(t, "provider throttled", f.GetMessage())
	require.True(t, f.GetRetryable())
	require.Equal(t, 1500*time.Millisecond, f.GetRetryAfter().AsDuration())
}

func TestExecuteInvalidResults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		h        adapter.Handler
		wantCode string
	}{
		{"panic", func(context.Context, *adapter.Request) adapter.Result { panic("boom with a secret") }, adapter.CodeHandlerPanic},
		{"zero result", func(context.Context, *adapter.Request) adapter.Result { return adapter.Result{} }, adapter.CodeInvalidResult},
		{"nil Later", func(context.Context, *adapter.Request) adapter.Result { return adapter.Later(time.Second, nil) }, adapter.CodeInvalidResult},
		{"not JSON", func(context.Context, *adapter.Request) adapter.Result {
			return adapter.Complete(map[string]any{"ch": make(chan int)})
		}, adapter.CodeInvalidResult},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &fakeCallbacks{}, tt.h)

			f := execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetFailed()

			require.NotNil(t, f)
			require.Equal(t, adapter.ClassPermanent, f.GetClass())
			require.False(t, f.GetRetryable())
			require.Equal(t, tt.wantCode, f.GetCode())
			require.NotContains(t, f.GetMessage(), "secret")
		})
	}
}

func TestLaterCompletesThroughCallback(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(ctx context.Context, cb *adapter.Callbacks) adapter.Result {
			<-release // the Accepted answer comes first
			if err := cb.ReportProgress(ctx, map[string]any{"percent": 50}); err != nil {
				return adapter.Fail(adapter.ClassTransient, "", err.Error(), true)
			}
			return adapter.Complete(map[string]any{"id": req.Payload["id"]})
		})
	})

	resp := execute(t, b, map[string]any{"id": "x"}, executionv1.Mode_MODE_ASYNC)
	require.Equal(t, time.Minute, resp.GetAccepted().GetLease().AsDuration())
	close(release)

	c := awaitComplete(t, b.fake)
	require.Equal(t, "exec-1", c.GetExecutionId())
	require.EqualValues(t, 3, c.GetAttempt())
	require.Equal(t, token, c.GetCallbackToken())
	require.Equal(t, map[string]any{"id": "x"}, c.GetSucceeded().GetResult().AsMap())

	b.server.Wait()
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.Len(t, b.fake.progress, 1)
	require.Equal(t, map[string]any{"percent": 50.0}, b.fake.progress[0].GetProgress().AsMap())
	require.Equal(t, token, b.fake.progress[0].GetCallbackToken())
	// Progress and Complete, and the first lease renewal if it went out before the work ended:
	// every callback carries the adapter's credential.
	require.GreaterOrEqual(t, len(b.fake.bearers), 2)
	for _, bearer := range b.fake.bearers {
		require.Equal(t, credential, bearer)
	}
}

func TestLaterRenewsLease(t *testing.T) {
	t.Parallel()
	const lease = 150 * time.Millisecond
	fake := &fakeCallbacks{}
	b := setup(t, fake, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(lease, func(ctx context.Context, cb *adapter.Callbacks) adapter.Result {
			// Long work: it ends only once the SDK renewed the lease three times.
			for fake.renewalCount() < 3 {
				select {
				case <-ctx.Done():
					return adapter.Fail(adapter.ClassTimeout, "", "cancelled", true)
				case <-time.After(10 * time.Millisecond):
				}
			}
			return adapter.Complete(map[string]any{"done": true})
		})
	})

	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())

	c := awaitComplete(t, b.fake)
	require.True(t, c.GetSucceeded().GetResult().AsMap()["done"].(bool))
	b.server.Wait()
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.GreaterOrEqual(t, len(b.fake.renewals), 3)
	for _, r := range b.fake.renewals {
		require.Equal(t, lease, r.GetLease().AsDuration())
		require.Equal(t, token, r.GetCallbackToken())
		require.EqualValues(t, 3, r.GetAttempt())
	}
	for _, bearer := range b.fake.bearers {
		require.Equal(t, credential, bearer)
	}
}

func TestLaterPanicFailsPermanently(t *testing.T) {
	t.Parallel()
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(context.Context, *adapter.Callbacks) adapter.Result { panic("boom") })
	})

	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())

	f := awaitComplete(t, b.fake).GetFailed()
	require.Equal(t, adapter.ClassPermanent, f.GetClass())
	require.Equal(t, adapter.CodeHandlerPanic, f.GetCode())
	require.False(t, f.GetRetryable())
}

func TestLaterRetriesCompleteWhileUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, &fakeCallbacks{completeUnavailable: 2}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(context.Context, *adapter.Callbacks) adapter.Result {
			return adapter.Fail(adapter.ClassTransient, "busy", "provider busy", true).RetryAfter(time.Second)
		})
	})

	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())

	f := awaitComplete(t, b.fake).GetFailed()
	require.Equal(t, "busy", f.GetCode())
	require.Equal(t, time.Second, f.GetRetryAfter().AsDuration())
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.Equal(t, 3, b.fake.completeN)
}

// A finished outcome is not dropped when the callback service answers something other than
// UNAVAILABLE: INTERNAL, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED are retried too, and the outcome
// lands exactly once.
func TestLaterRetriesCompleteOnEveryRetryableCode(t *testing.T) {
	t.Parallel()
	b := setup(t, &fakeCallbacks{completeCodes: []codes.Code{codes.Internal, codes.Unavailable, codes.ResourceExhausted, codes.Internal, codes.DeadlineExceeded}},
		func(ctx context.Context, req *adapter.Request) adapter.Result {
			return adapter.Later(time.Minute, func(context.Context, *adapter.Callbacks) adapter.Result {
				return adapter.Complete(map[string]any{"sent": true})
			})
		})

	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())
	require.True(t, awaitComplete(t, b.fake).GetSucceeded().GetResult().GetFields()["sent"].GetBoolValue())
	b.server.Wait()
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.Equal(t, 6, b.fake.completeN)
	require.Len(t, b.fake.completes, 1, "delivered once")
}

// A result the platform refuses is delivered again as a permanent protocol failure, so that the
// attempt ends now instead of at its lease.
func TestLaterRefusedResultBecomesAProtocolFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, &fakeCallbacks{refuseResult: true}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(context.Context, *adapter.Callbacks) adapter.Result {
			return adapter.Complete(map[string]any{"sent": true})
		})
	})

	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())
	f := awaitComplete(t, b.fake).GetFailed()
	require.Equal(t, adapter.ClassProtocol, f.GetClass())
	require.Equal(t, adapter.CodeInvalidResult, f.GetCode())
	require.False(t, f.GetRetryable())
	require.Contains(t, f.GetMessage(), "adapter result refused")
	b.server.Wait()
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.Equal(t, 2, b.fake.completeN)
}

func TestLaterAbandonedWhenRenewalRefused(t *testing.T) {
	t.Parallel()
	cause := make(chan error, 1)
	b := setup(t, &fakeCallbacks{renewRefusal: codes.FailedPrecondition}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(60*time.Millisecond, func(ctx context.Context, _ *adapter.Callbacks) adapter.Result {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return adapter.Fail(adapter.ClassTimeout, "", "cancelled", true)
		})
	})

	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())

	require.ErrorIs(t, <-cause, adapter.ErrAttemptGone)
	b.server.Wait()
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.Zero(t, b.fake.completeN, "an outcome for a closed attempt must not be sent")
}

func TestCloseCancelsBackgroundWorkAndDeliversItsOutcome(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(ctx context.Context, _ *adapter.Callbacks) adapter.Result {
			close(started)
			<-ctx.Done()
			return adapter.Fail(adapter.ClassUnavailable, "shutdown", "adapter stopped", true)
		})
	})
	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())
	<-started

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.NoError(t, b.server.Shutdown(ctx))

	f := awaitComplete(t, b.fake).GetFailed()
	require.Equal(t, "shutdown", f.GetCode())
	require.True(t, f.GetRetryable())

	// After shutdown, new long work is refused with a retryable failure.
	f = execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetFailed()
	require.Equal(t, adapter.CodeShuttingDown, f.GetCode())
	require.True(t, f.GetRetryable())
}

// Shutdown is a bound: with the callback service down, a finished outcome's delivery (which
// would retry until the attempt's lease, a minute here) stops a short grace after Shutdown's ctx
// ended, and Shutdown returns.
func TestShutdownIsBoundedWhileTheCallbackServiceIsDown(t *testing.T) {
	t.Parallel()
	finished := make(chan struct{})
	b := setup(t, &fakeCallbacks{completeUnavailable: 1 << 20}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		// A ten-minute lease: Shutdown returning within 20 s can only be its own bound.
		return adapter.Later(10*time.Minute, func(context.Context, *adapter.Callbacks) adapter.Result {
			defer close(finished)
			return adapter.Complete(map[string]any{"done": true})
		})
	})
	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())
	<-finished
	require.Eventually(t, func() bool {
		b.fake.mu.Lock()
		defer b.fake.mu.Unlock()
		return b.fake.completeN >= 2
	}, 5*time.Second, 10*time.Millisecond, "the delivery is retrying")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.NoError(t, b.server.Shutdown(ctx), "the work itself ended")
	// The grace is a couple of seconds, the lease ten minutes: 20 s tells them apart with room for a
	// loaded machine.
	require.Less(t, time.Since(start), 20*time.Second, "Shutdown returns a short grace after its ctx ended, not at the lease's end")
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.Empty(t, b.fake.completes, "nothing was delivered")
}

// Shutdown is a bound even for work that ignores its cancellation: it returns
// ErrShutdownIncomplete instead of waiting for it.
func TestShutdownDoesNotWaitForWorkIgnoringCancellation(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(context.Context, *adapter.Callbacks) adapter.Result {
			close(started)
			<-release
			return adapter.Complete(nil)
		})
	})
	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())
	<-started

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.ErrorIs(t, b.server.Shutdown(ctx), adapter.ErrShutdownIncomplete)
	// The work never ends by itself: returning at all is the point; 20 s leaves room for a loaded
	// machine above the grace.
	require.Less(t, time.Since(start), 20*time.Second)
	close(release)
	b.server.Wait()
}

func TestLaterRunsInlineForSync(t *testing.T) {
	t.Parallel()
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(ctx context.Context, cb *adapter.Callbacks) adapter.Result {
			if err := errors.Join(cb.ReportProgress(ctx, map[string]any{"percent": 50}), cb.RenewLease(ctx, time.Minute)); err != nil {
				return adapter.Fail(adapter.ClassPermanent, "", err.Error(), false)
			}
			return adapter.Complete(map[string]any{"mode": req.Mode})
		})
	})

	resp := execute(t, b, nil, executionv1.Mode_MODE_SYNC)

	require.Equal(t, map[string]any{"mode": adapter.ModeSync}, resp.GetCompleted().GetResult().AsMap())
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.Empty(t, b.fake.bearers, "a sync execution gets no callbacks")
}

func TestLaterWithoutCallbackAddrIsRefused(t *testing.T) {
	t.Parallel()
	keys := tokentest.New(t, "test-adapter")
	s, err := adapter.New(func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(context.Context, *adapter.Callbacks) adapter.Result {
			return adapter.Complete(nil)
		})
	}, adapter.Options{Logger: zaptest.NewLogger(t), AdapterID: keys.AdapterID, PlatformKeys: []ed25519.PublicKey{keys.Public}})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	s.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	conn, err := dialTest(lis.Addr().String(), keys.DialOption())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop(); require.NoError(t, s.Close()) })

	resp, err := adapterv1.NewAdapterServiceClient(conn).Execute(context.Background(), &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})

	require.NoError(t, err)
	require.Equal(t, adapter.CodeNoCallbackAddr, resp.GetFailed().GetCode())
	require.True(t, resp.GetFailed().GetRetryable())
}

func TestCancelStopsLaterWorkAndSendsNoOutcome(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	cause := make(chan error, 1)
	fake := &fakeCallbacks{}
	b := setup(t, fake, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(60*time.Millisecond, func(ctx context.Context, _ *adapter.Callbacks) adapter.Result {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			// What work typically answers when stopped; the SDK must not send it.
			return adapter.Complete(map[string]any{"partial": true})
		})
	})
	require.NotNil(t, execute(t, b, nil, executionv1.Mode_MODE_ASYNC).GetAccepted())
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	other, err := b.client.Cancel(ctx, &adapterv1.CancelRequest{ExecutionId: "exec-1", Attempt: 2})
	require.NoError(t, err)
	require.False(t, other.GetStopped(), "another attempt's cancellation leaves the work alone")
	resp, err := b.client.Cancel(ctx, &adapterv1.CancelRequest{ExecutionId: "exec-1", Attempt: 3})
	require.NoError(t, err)
	require.True(t, resp.GetStopped())

	require.ErrorIs(t, <-cause, adapter.ErrCancelled)
	b.server.Wait()
	fake.mu.Lock()
	renewals := len(fake.renewals)
	require.Zero(t, fake.completeN, "no outcome is sent for cancelled work")
	fake.mu.Unlock()

	// The work is gone: a second Cancel finds nothing, and renewals stopped with it (Wait
	// returns only after the renewal loop ended).
	again, err := b.client.Cancel(ctx, &adapterv1.CancelRequest{ExecutionId: "exec-1", Attempt: 3})
	require.NoError(t, err)
	require.False(t, again.GetStopped())
	fake.mu.Lock()
	defer fake.mu.Unlock()
	require.Equal(t, renewals, len(fake.renewals))
}

func TestCancelStopsAnExecuteInProgress(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		close(started)
		<-ctx.Done()
		return adapter.Fail(adapter.ClassUnavailable, "stopped", context.Cause(ctx).Error(), true)
	})
	type answer struct {
		resp *adapterv1.ExecuteResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := b.client.Execute(context.Background(), &adapterv1.ExecuteRequest{
			ExecutionId: "exec-1", Attempt: 3, Capability: "test.cap", Mode: executionv1.Mode_MODE_SYNC,
		})
		answered <- answer{resp, err}
	}()
	<-started

	resp, err := b.client.Cancel(context.Background(), &adapterv1.CancelRequest{ExecutionId: "exec-1", Attempt: 3})
	require.NoError(t, err)
	require.True(t, resp.GetStopped())

	a := <-answered
	require.NoError(t, a.err)
	f := a.resp.GetFailed()
	require.Equal(t, "stopped", f.GetCode())
	require.Equal(t, adapter.ErrCancelled.Error(), f.GetMessage())
}

// Later work continues the trace of the Execute call that accepted it: its progress report and
// its outcome's delivery (on a context of its own) carry the caller's trace, also when the
// adapter's gRPC server is a plain one (as here) and tracing is off.
func TestLaterCallbacksContinueTheCallersTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, &fakeCallbacks{}, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(ctx context.Context, cb *adapter.Callbacks) adapter.Result {
			if err := cb.ReportProgress(ctx, map[string]any{"percent": 50}); err != nil {
				return adapter.Fail(adapter.ClassTransient, "", err.Error(), true)
			}
			return adapter.Complete(map[string]any{})
		})
	})
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	st, err := structpb.NewStruct(map[string]any{})
	require.NoError(t, err)
	_, err = b.client.Execute(ctx, &adapterv1.ExecuteRequest{
		ExecutionId: "exec-1", Attempt: 1, Capability: "test.cap", Payload: st,
		DeadlineTime: timestamppb.New(time.Now().Add(time.Minute)), CallbackToken: token, Mode: executionv1.Mode_MODE_ASYNC,
	})
	require.NoError(t, err)
	awaitComplete(t, b.fake)
	b.server.Wait()

	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	require.GreaterOrEqual(t, len(b.fake.traceparents), 2, "progress and complete at least")
	for i, tp := range b.fake.traceparents {
		parts := strings.Split(tp, "-")
		require.Len(t, parts, 4, "callback %d's traceparent %q", i, tp)
		require.Equal(t, traceID, parts[1], "callback %d continues the caller's trace", i)
	}
}

// dialTest is a plaintext client of an adapter or fake served on the loopback.
func dialTest(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
}
