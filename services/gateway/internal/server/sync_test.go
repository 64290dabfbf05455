package server

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/freeport"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// syncSetup is setup with the test capability open to sync calls, whose timeout is syncTimeout.
func syncSetup(t *testing.T, syncTimeout time.Duration) *bundle {
	t.Helper()
	b := setup(t)
	_, err := b.schema.Pool.Exec(context.Background(),
		`UPDATE capabilities SET modes = ARRAY['async', 'sync'], sync_timeout_ms = $1`, syncTimeout.Milliseconds())
	require.NoError(t, err)
	return b
}

func invokeSync(b *bundle) (*gatewayv1.InvokeCapabilityResponse, error) {
	return b.server.InvokeCapability(b.ctx, &gatewayv1.InvokeCapabilityRequest{
		Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_SYNC})
}

// A settlement outage (UNAVAILABLE, a transport's INTERNAL) while the sync call reports is
// retried: the caller gets the adapter's result, which was settled once.
func TestSyncOutcomeRetriedThroughASettlementOutage(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, 10*time.Second)
	b.settlement.errs = []error{status.Error(codes.Unavailable, "down"), status.Error(codes.Internal, "transport is closing"),
		status.Error(codes.Unavailable, "down")}

	resp, err := invokeSync(b)

	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, resp.GetExecution().GetStatus())
	require.Len(t, b.settlement.requests(), 4)
	require.Equal(t, 1, b.settlement.recorded)
}

// A result the settlement service refuses (NaN in it, say) is the adapter's protocol failure,
// recorded through FailAttempt; the caller gets the failed execution, not an error about a
// result field it never sent.
func TestSyncRefusedResultSettlesAProtocolFailure(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, 10*time.Second)
	b.settlement.errs = []error{grpcx.ToStatus(apperr.Invalid("result", "not a JSON object: json: unsupported value: NaN")).Err()}

	resp, err := invokeSync(b)

	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED, resp.GetExecution().GetStatus())
	b.settlement.mu.Lock()
	defer b.settlement.mu.Unlock()
	require.Len(t, b.settlement.failures, 1)
	f := b.settlement.failures[0]
	require.Equal(t, execution.ClassProtocol, f.GetFailure().GetClass())
	require.False(t, f.GetRetryable())
	require.Contains(t, f.GetFailure().GetMessage(), "adapter result refused")
}

// When settlement stays unreachable past the sync deadline, the caller gets a retryable
// UNAVAILABLE, and the report goes on in the background: the outcome is recorded once
// settlement is back.
func TestSyncOutcomeNotRecordedByTheDeadlineIsReportedLater(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, 300*time.Millisecond)
	b.settlement.mu.Lock()
	b.settlement.downUntil = time.Now().Add(syncAnswerFloor + 300*time.Millisecond)
	b.settlement.mu.Unlock()

	_, err := invokeSync(b)

	c, reason := code(err)
	require.Equal(t, codes.Unavailable, c, "retryable: %v", err)
	require.Equal(t, "OUTCOME_PENDING", reason)
	require.Eventually(t, func() bool {
		b.settlement.mu.Lock()
		defer b.settlement.mu.Unlock()
		return b.settlement.recorded == 1
	}, syncReportGrace+time.Second, 20*time.Millisecond, "the outcome is settled once settlement is back")
	settles := b.settlement.requests()
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, settles[len(settles)-1].GetStatus())
}

// A shutdown waits for the sync calls in flight and their outcome reports — also a report still
// going on after the caller got OUTCOME_PENDING — and, once it began, refuses new sync calls with
// a retryable UNAVAILABLE that writes nothing. Its wait is bounded by its context.
func TestSyncShutdownWaitsForReportsAndRefusesNewCalls(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, 300*time.Millisecond)
	b.settlement.mu.Lock()
	b.settlement.downUntil = time.Now().Add(syncAnswerFloor + time.Second)
	b.settlement.mu.Unlock()

	answered := make(chan error, 1)
	go func() {
		_, err := invokeSync(b)
		answered <- err
	}()
	// The call is in flight (its execution written): shutdown begins.
	require.Eventually(t, func() bool {
		return countExecutions(t, b) == 1
	}, 5*time.Second, 5*time.Millisecond)
	b.server.StopSync()

	_, err := invokeSync(b)
	c, reason := code(err)
	require.Equal(t, codes.Unavailable, c, "retryable: %v", err)
	require.Equal(t, "SHUTTING_DOWN", reason)
	require.Equal(t, 1, countExecutions(t, b), "the refused call wrote nothing")

	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.server.WaitSync(short), context.DeadlineExceeded, "the wait is bounded")

	wctx, wcancel := context.WithTimeout(context.Background(), syncAnswerFloor+syncReportGrace+5*time.Second)
	defer wcancel()
	require.NoError(t, b.server.WaitSync(wctx))
	c, reason = code(<-answered)
	require.Equal(t, codes.Unavailable, c)
	require.Equal(t, "OUTCOME_PENDING", reason, "the caller was answered before settlement came back")
	b.settlement.mu.Lock()
	defer b.settlement.mu.Unlock()
	require.Equal(t, 1, b.settlement.recorded, "the wait ended once the outcome was recorded")
}

func countExecutions(t *testing.T, b *bundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM executions`).Scan(&n))
	return n
}

// A sync call whose adapter cannot be reached (nothing of the request went out) spends no
// attempt: the accept is taken back — no execution, no attempt row, no event, no report — and the
// caller gets a retryable UNAVAILABLE, so that its retry with the same Idempotency-Key, once the
// adapter is up, starts afresh and succeeds at attempt 1.
func TestSyncAdapterUnreachableIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, 10*time.Second)
	// An address nothing listens on, kept for the adapter to come up at later.
	addr, err := freeport.Addr() // outside the ephemeral range: a closed port there can connect to itself
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, addr)
	require.NoError(t, err)
	call := func() (*gatewayv1.InvokeCapabilityResponse, error) {
		return b.server.InvokeCapability(b.ctx, &gatewayv1.InvokeCapabilityRequest{
			Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_SYNC, IdempotencyKey: "unreachable-1"})
	}

	_, err = call()

	c, reason := code(err)
	require.Equal(t, codes.Unavailable, c, "retryable: %v", err)
	require.Equal(t, "ADAPTER_UNAVAILABLE", reason)
	require.NotContains(t, grpcx.ToStatus(err).Message(), addr, "the adapter's address is not shown")
	require.Zero(t, countExecutions(t, b), "the execution was taken back")
	var attempts, events int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM execution_attempts), (SELECT count(*) FROM integration_events)`).Scan(&attempts, &events))
	require.Zero(t, attempts, "no attempt row")
	require.Zero(t, events, "no completion event")
	require.Empty(t, b.settlement.requests(), "nothing was reported")

	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := grpc.NewServer()
	adapterv1.RegisterAdapterServiceServer(srv, &fakeAdapter{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	// The gateway's connection finds the adapter within its reconnect backoff; until then each
	// retry is taken back the same way.
	var resp *gatewayv1.InvokeCapabilityResponse
	require.Eventually(t, func() bool {
		resp, err = call()
		if err != nil {
			c, reason := code(err)
			require.Equal(t, codes.Unavailable, c, "retryable: %v", err)
			require.Equal(t, "ADAPTER_UNAVAILABLE", reason)
			require.Zero(t, countExecutions(t, b))
			return false
		}
		return true
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, resp.GetExecution().GetStatus())
	require.Equal(t, int32(1), resp.GetExecution().GetAttempt(), "the retry started afresh at attempt 1")
	require.Equal(t, 1, countExecutions(t, b))
	var attempt int32
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT attempt FROM executions WHERE idempotency_key = 'unreachable-1'`).Scan(&attempt))
	require.Equal(t, int32(1), attempt)
	require.Len(t, b.settlement.requests(), 1, "one outcome reported, the retry's")
}
