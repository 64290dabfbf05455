package attempt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

// TestPastDeadlineSettlesInsteadOfStarting: a dispatch whose execution's deadline has passed
// starts no attempt and calls no adapter (the handler has none): the execution is settled failed
// with retry_exhausted.budget through the settlement service's Settle, from PENDING at the
// attempt before, with the execution's last failure class. A settlement service that cannot be
// reached leaves the message to the port's retry.
func TestPastDeadlineSettlesInsteadOfStarting(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	settlement := &recordingSettlement{down: 1}
	slis := listen(t, "127.0.0.1:0")
	ssrv := grpc.NewServer()
	settlementv1.RegisterSettlementServiceServer(ssrv, settlement)
	go func() { _ = ssrv.Serve(slis) }()
	t.Cleanup(ssrv.Stop)
	sconn, err := grpc.NewClient(slis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sconn.Close() })
	h := New(store.New(s.Pool), nil, settlementv1.NewSettlementServiceClient(sconn),
		func(d time.Duration) time.Duration { return d }, zap.NewNop())
	b := &bundle{schema: s, handler: h}

	var dbNow time.Time
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&dbNow))
	id := s.InsertExecution(t, dbtest.Execution{Status: "pending", Attempt: 1, Deadline: dbNow.Add(-time.Second)})
	s.InsertAttempts(t, id, dbtest.Attempt{N: 1, Outcome: "failed"})
	_, err = s.Pool.Exec(context.Background(), `UPDATE executions SET failure_class = 'provider' WHERE id = $1`, id)
	require.NoError(t, err)

	msg := message(t, id, 2, dbNow.Add(-time.Second))
	res := h.Handle(context.Background(), msg)
	require.Error(t, res.Err(), "settlement unavailable: the port retries")
	require.Equal(t, mq.Ack().String(), h.Handle(context.Background(), msg).String())

	status, attempt, rows := b.current(t, id)
	require.Equal(t, []any{"pending", int32(1), int32(1)}, []any{status, attempt, rows}, "no attempt started")
	settlement.mu.Lock()
	defer settlement.mu.Unlock()
	require.Empty(t, settlement.failed)
	require.Len(t, settlement.settled, 1)
	got := settlement.settled[0]
	require.Equal(t, id, got.GetExecutionId())
	require.EqualValues(t, 1, got.GetAttempt(), "the attempt the execution is pending at")
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING, got.GetFromStatus())
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED, got.GetStatus())
	require.Equal(t, execution.ReasonBudget, got.GetFailure().GetReason())
	require.Equal(t, "provider", got.GetFailure().GetClass(), "the last attempt's class")
}
