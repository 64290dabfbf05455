package dummy_test

import (
	"context"
	"crypto/ed25519"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/cmd/internal/dummy"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken/tokentest"
)

// callbacks is a real AdapterCallbackService in the test process, recording what it receives.
type callbacks struct {
	adapterv1.UnimplementedAdapterCallbackServiceServer
	mu        sync.Mutex
	renewals  int
	progress  []map[string]any
	bearers   []string
	completed chan *adapterv1.CompleteRequest
}

func (c *callbacks) record(ctx context.Context) {
	bearer, _ := grpcx.BearerToken(ctx)
	c.bearers = append(c.bearers, bearer)
}

func (c *callbacks) RenewLease(ctx context.Context, _ *adapterv1.RenewLeaseRequest) (*adapterv1.RenewLeaseResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record(ctx)
	c.renewals++
	return &adapterv1.RenewLeaseResponse{}, nil
}

func (c *callbacks) ReportProgress(ctx context.Context, in *adapterv1.ReportProgressRequest) (*adapterv1.ReportProgressResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record(ctx)
	c.progress = append(c.progress, in.GetProgress().AsMap())
	return &adapterv1.ReportProgressResponse{}, nil
}

func (c *callbacks) Complete(ctx context.Context, in *adapterv1.CompleteRequest) (*adapterv1.CompleteResponse, error) {
	c.mu.Lock()
	c.record(ctx)
	c.mu.Unlock()
	c.completed <- in
	return &adapterv1.CompleteResponse{}, nil
}

type bundle struct {
	client adapterv1.AdapterServiceClient
	cb     *callbacks
}

// setup serves the dummy adapter on localhost, with a fake callback service.
func setup(t *testing.T) *bundle { return setupWithJournal(t, nil) }

// setupWithJournal is setup with the handler keeping journal j.
func setupWithJournal(t *testing.T, j *dummy.Journal) *bundle {
	t.Helper()
	cb := &callbacks{completed: make(chan *adapterv1.CompleteRequest, 4)}
	cbLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cbSrv := grpc.NewServer()
	adapterv1.RegisterAdapterCallbackServiceServer(cbSrv, cb)
	go func() { _ = cbSrv.Serve(cbLis) }()

	log := zaptest.NewLogger(t)
	keys := tokentest.New(t, "dummy")
	ad, err := adapter.New(dummy.NewHandler(log, j), adapter.Options{CallbackAddr: cbLis.Addr().String(), Credential: "cred", Logger: log,
		AdapterID: keys.AdapterID, PlatformKeys: []ed25519.PublicKey{keys.Public}})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	ad.Register(srv)
	go func() { _ = srv.Serve(lis) }()

	conn, err := grpcx.Dial(lis.Addr().String(), keys.DialOption())
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		require.NoError(t, ad.Close())
		cbSrv.Stop()
	})
	return &bundle{client: adapterv1.NewAdapterServiceClient(conn), cb: cb}
}

type call struct {
	attempt    int32
	payload    map[string]any
	mode       executionv1.Mode
	capability string
	timeout    time.Duration
}

func (b *bundle) execute(t *testing.T, c call) (*adapterv1.ExecuteResponse, error) {
	t.Helper()
	st, err := structpb.NewStruct(c.payload)
	require.NoError(t, err)
	if c.attempt == 0 {
		c.attempt = 1
	}
	if c.capability == "" {
		c.capability = dummy.Capability
	}
	if c.timeout == 0 {
		c.timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	return b.client.Execute(ctx, &adapterv1.ExecuteRequest{
		ExecutionId: "exec-1", Attempt: c.attempt, Capability: c.capability, Payload: st,
		CallbackToken: "tok", Mode: c.mode,
	})
}

func script(s map[string]any) map[string]any {
	return map[string]any{"msg": "hi", dummy.ScriptKey: s}
}

func echoed(attempt int) map[string]any {
	return map[string]any{"echo": map[string]any{"msg": "hi"}, "attempt": float64(attempt)}
}

func TestAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		call          call
		wantResult    map[string]any
		wantClass     string
		wantRetryable bool
		wantMessage   string
		wantAfter     time.Duration
	}{
		{name: "echo without script", call: call{payload: map[string]any{"msg": "hi"}}, wantResult: echoed(1)},
		{name: "echo with empty script", call: call{attempt: 4, payload: script(map[string]any{})}, wantResult: echoed(4)},
		{name: "transient attempt 1 of 2", call: call{attempt: 1, payload: script(map[string]any{"fail_transient": 2.0, "retry_after_ms": 500.0})},
			wantClass: adapter.ClassTransient, wantRetryable: true, wantAfter: 500 * time.Millisecond},
		{name: "transient attempt 2 of 2", call: call{attempt: 2, payload: script(map[string]any{"fail_transient": 2.0})},
			wantClass: adapter.ClassTransient, wantRetryable: true},
		{name: "transient exhausted", call: call{attempt: 3, payload: script(map[string]any{"fail_transient": 2.0})}, wantResult: echoed(3)},
		{name: "permanent", call: call{payload: script(map[string]any{"fail_permanent": true})}, wantClass: adapter.ClassPermanent},
		{name: "sleep", call: call{payload: script(map[string]any{"sleep_ms": 20.0})}, wantResult: echoed(1)},
		{name: "unknown key", call: call{payload: script(map[string]any{"fail_transent": 1.0})},
			wantClass: adapter.ClassPermanent, wantMessage: "dummy.fail_transent is not a known key"},
		{name: "bad value", call: call{payload: script(map[string]any{"sleep_ms": "long"})},
			wantClass: adapter.ClassPermanent, wantMessage: "dummy.sleep_ms must be a non-negative integer"},
		{name: "script not an object", call: call{payload: map[string]any{dummy.ScriptKey: true}},
			wantClass: adapter.ClassPermanent, wantMessage: "dummy must be an object"},
		{name: "unknown capability", call: call{capability: "other.cap"}, wantClass: adapter.ClassPermanent},
		{name: "complete_later inline for sync", call: call{mode: executionv1.Mode_MODE_SYNC, payload: script(map[string]any{"complete_later_ms": 20.0})},
			wantResult: echoed(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)

			resp, err := b.execute(t, tt.call)

			require.NoError(t, err)
			if tt.wantResult != nil {
				require.Equal(t, tt.wantResult, resp.GetCompleted().GetResult().AsMap())
				return
			}
			f := resp.GetFailed()
			require.NotNil(t, f, "want a failure, got %v", resp)
			require.Equal(t, tt.wantClass, f.GetClass())
			require.Equal(t, tt.wantRetryable, f.GetRetryable())
			require.Equal(t, tt.wantAfter, f.GetRetryAfter().AsDuration())
			require.Contains(t, f.GetMessage(), tt.wantMessage)
		})
	}
}

func TestCompleteLater(t *testing.T) {
	t.Parallel()
	b := setup(t)

	resp, err := b.execute(t, call{attempt: 2, payload: script(map[string]any{"complete_later_ms": 200.0, "lease_ms": 90.0})})

	require.NoError(t, err)
	require.Equal(t, 90*time.Millisecond, resp.GetAccepted().GetLease().AsDuration())
	var c *adapterv1.CompleteRequest
	select {
	case c = <-b.cb.completed:
	case <-time.After(10 * time.Second):
		t.Fatal("no completion callback")
	}
	require.Equal(t, "tok", c.GetCallbackToken())
	require.EqualValues(t, 2, c.GetAttempt())
	require.Equal(t, echoed(2), c.GetSucceeded().GetResult().AsMap())
	b.cb.mu.Lock()
	defer b.cb.mu.Unlock()
	require.Equal(t, []map[string]any{{"percent": 50.0}}, b.cb.progress)
	require.Positive(t, b.cb.renewals, "a 200ms task under a 90ms lease is renewed")
	for _, bearer := range b.cb.bearers {
		require.Equal(t, "cred", bearer)
	}
}

// progress_steps: N reports, evenly spread, each with its step, then the completion; 0: none.
func TestCompleteLaterProgressSteps(t *testing.T) {
	t.Parallel()
	for _, steps := range []float64{4, 0} {
		b := setup(t)
		_, err := b.execute(t, call{payload: script(map[string]any{"complete_later_ms": 100.0, "progress_steps": steps})})
		require.NoError(t, err)
		select {
		case <-b.cb.completed:
		case <-time.After(10 * time.Second):
			t.Fatal("no completion callback")
		}
		b.cb.mu.Lock()
		got := b.cb.progress
		b.cb.mu.Unlock()
		var want []map[string]any
		for i := 1; i <= int(steps); i++ {
			want = append(want, map[string]any{"percent": float64(100 * i / (int(steps) + 1)), "step": float64(i)})
		}
		require.Equal(t, want, got, "%v steps", steps)
	}
}

func TestHangNeverAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)

	start := time.Now()
	resp, err := b.execute(t, call{payload: script(map[string]any{"hang": true}), timeout: 100 * time.Millisecond})

	// The deadline reaches both ends at once: either the client gives up first (DEADLINE_EXCEEDED),
	// or the adapter, its context cancelled, answers a retryable failure just before. Never an
	// answer before the deadline, never a success.
	require.GreaterOrEqual(t, time.Since(start), 90*time.Millisecond, "hang answered before the deadline")
	if err != nil {
		require.Equal(t, codes.DeadlineExceeded, status.Code(err))
		return
	}
	require.NotNil(t, resp.GetFailed(), "hang must not succeed: %v", resp)
	require.True(t, resp.GetFailed().GetRetryable())
}

func TestOnlyAttemptsLimitsTheScript(t *testing.T) {
	t.Parallel()
	b := setup(t)

	resp, err := b.execute(t, call{payload: script(map[string]any{"fail_permanent": true, "only_attempts": 1})})
	require.NoError(t, err)
	require.NotNil(t, resp.GetFailed(), "attempt 1 follows the script")
	resp, err = b.execute(t, call{attempt: 2, payload: script(map[string]any{"fail_permanent": true, "only_attempts": 1})})
	require.NoError(t, err)
	require.Equal(t, echoed(2), resp.GetCompleted().GetResult().AsMap(), "attempt 2 echoes")
}

// TestJournal: every attempt received is journalled before its work, and the work's end with
// its outcome — for long work when the background work ends, not when Execute answers.
func TestJournal(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := dummy.OpenJournal(path)
	require.NoError(t, err)
	b := setupWithJournal(t, j)

	_, err = b.execute(t, call{attempt: 1, payload: script(map[string]any{"fail_transient": 1.0})})
	require.NoError(t, err)
	_, err = b.execute(t, call{attempt: 2, payload: script(map[string]any{"fail_transient": 1.0})})
	require.NoError(t, err)
	_, err = b.execute(t, call{attempt: 3, payload: script(map[string]any{"fail_permanent": true})})
	require.NoError(t, err)
	// The deadline reaches both ends at once (see TestHangNeverAnswers): the client gives up, or
	// the adapter, its context cancelled, answers a retryable failure just before.
	hung, err := b.execute(t, call{attempt: 4, payload: script(map[string]any{"hang": true}), timeout: 50 * time.Millisecond})
	if err != nil {
		require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	} else {
		require.True(t, hung.GetFailed().GetRetryable(), "hang must not succeed: %v", hung)
	}
	resp, err := b.execute(t, call{attempt: 5, payload: script(map[string]any{"complete_later_ms": 100.0})})
	require.NoError(t, err)
	require.NotNil(t, resp.GetAccepted())
	select {
	case <-b.cb.completed:
	case <-time.After(10 * time.Second):
		t.Fatal("no completion callback")
	}

	var lines []string
	require.Eventually(t, func() bool {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		lines = strings.Split(strings.TrimSpace(string(raw)), "\n")
		return len(lines) == 10
	}, 5*time.Second, 10*time.Millisecond, "five attempts, each received and done")
	pid := strconv.Itoa(os.Getpid())
	var got []string
	for _, l := range lines {
		f := strings.Split(l, "\t")
		require.Len(t, f, 6, l)
		require.Equal(t, pid, f[1])
		require.Equal(t, "exec-1", f[3])
		got = append(got, f[2]+" "+f[4]+" "+f[5])
	}
	want := []string{
		"recv 1 async", "done 1 transient",
		"recv 2 async", "done 2 succeeded",
		"recv 3 async", "done 3 permanent",
		"recv 4 async", "done 4 cancelled",
		"recv 5 async", "done 5 succeeded",
	}
	require.ElementsMatch(t, want, got)
	// Each attempt's work is received before it is done; across attempts the order is the
	// handlers' (attempt 4's cancellation may be written after attempt 5 was received).
	at := map[string]int{}
	for i, l := range got {
		at[l] = i
	}
	for i := 0; i < len(want); i += 2 {
		require.Less(t, at[want[i]], at[want[i+1]], "%q before %q", want[i], want[i+1])
	}
	require.NoError(t, j.Close())
}
