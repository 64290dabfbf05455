package attempt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/adapter"
	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/outcome"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

// recordingSettlement stands in for the settlement service (a separate process): it records the
// settlements asked of it.
type recordingSettlement struct {
	settlementv1.UnimplementedSettlementServiceServer
	mu sync.Mutex
	// down answers this many calls UNAVAILABLE first, as a settlement service restarting.
	down    int
	calls   int
	settled []*settlementv1.SettleRequest
	failed  []*settlementv1.FailAttemptRequest
}

func (r *recordingSettlement) Settle(_ context.Context, req *settlementv1.SettleRequest) (*settlementv1.SettleResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls++; r.calls <= r.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	r.settled = append(r.settled, req)
	return &settlementv1.SettleResponse{Execution: &executionv1.Execution{Id: req.GetExecutionId(), Status: req.GetStatus()}}, nil
}

func (r *recordingSettlement) FailAttempt(_ context.Context, req *settlementv1.FailAttemptRequest) (*settlementv1.FailAttemptResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, req)
	return &settlementv1.FailAttemptResponse{Execution: &executionv1.Execution{Id: req.GetExecutionId()}}, nil
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	return lis
}

// TestUnreachableAdapterSpendsNoAttempt: while the adapter cannot be reached, a dispatch is
// deferred and the attempt it started is taken back (the execution stays pending at attempt 0,
// no attempt row); once the adapter is back, the same dispatch runs attempt 1 and it settles.
func TestUnreachableAdapterSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	// A port of our own with nothing listening on it, for the adapter to come up on later.
	probe := listen(t, "127.0.0.1:0")
	addr := probe.Addr().String()
	require.NoError(t, probe.Close())
	_, err := s.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, addr)
	require.NoError(t, err)

	settlement := &recordingSettlement{}
	slis := listen(t, "127.0.0.1:0")
	ssrv := grpc.NewServer()
	settlementv1.RegisterSettlementServiceServer(ssrv, settlement)
	go func() { _ = ssrv.Serve(slis) }()
	t.Cleanup(ssrv.Stop)
	sconn, err := grpc.NewClient(slis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sconn.Close() })

	pool := adaptercall.NewPool()
	pool.SetConnectWait(300 * time.Millisecond)
	t.Cleanup(func() { _ = pool.Close() })
	h := New(store.New(s.Pool), pool, settlementv1.NewSettlementServiceClient(sconn),
		func(d time.Duration) time.Duration { return d }, zap.NewNop())
	b := &bundle{schema: s, handler: h}

	id := s.InsertExecution(t, dbtest.Execution{})
	msg := message(t, id, 1, time.Now().Add(-time.Second))
	for range 2 {
		res := h.Handle(context.Background(), msg)
		require.True(t, strings.HasPrefix(res.String(), "defer "), "got %s", res)
		require.NoError(t, res.Err())
		status, attempt, rows := b.current(t, id)
		require.Equal(t, "pending", status)
		require.Zero(t, attempt, "no attempt spent")
		require.Zero(t, rows, "no attempt row left")
	}
	require.Empty(t, settlement.failed, "nothing reported: there was no attempt")

	// The adapter comes up on the port.
	asrv := grpc.NewServer()
	calls := 0
	var mu sync.Mutex
	adapter.New(func(context.Context, *adapter.Request) adapter.Result {
		mu.Lock()
		calls++
		mu.Unlock()
		return adapter.Complete(map[string]any{"ok": true})
	}, adapter.Options{}).Register(asrv)
	alis := listen(t, addr)
	go func() { _ = asrv.Serve(alis) }()
	t.Cleanup(asrv.Stop)

	// Within the connect wait the consumer finds it (its reconnect backoff is capped at 1 s).
	require.Eventually(t, func() bool {
		return h.Handle(context.Background(), msg).String() == mq.Ack().String()
	}, 5*time.Second, 10*time.Millisecond)
	status, attempt, rows := b.current(t, id)
	require.Equal(t, "running", status, "the fake settlement does not write")
	require.EqualValues(t, 1, attempt)
	require.EqualValues(t, 1, rows)
	require.Equal(t, 1, calls)
	require.Len(t, settlement.settled, 1)
	require.EqualValues(t, 1, settlement.settled[0].GetAttempt())
	require.Empty(t, settlement.failed)
}

// TestOutcomeRetriedThroughASettlementOutage: an outcome in hand is reported until settlement
// takes it, not given up after a few tries.
func TestOutcomeRetriedThroughASettlementOutage(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	asrv := grpc.NewServer()
	adapter.New(func(context.Context, *adapter.Request) adapter.Result {
		return adapter.Complete(map[string]any{"ok": true})
	}, adapter.Options{}).Register(asrv)
	alis := listen(t, "127.0.0.1:0")
	go func() { _ = asrv.Serve(alis) }()
	t.Cleanup(asrv.Stop)
	_, err := s.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, alis.Addr().String())
	require.NoError(t, err)

	settlement := &recordingSettlement{down: 5}
	slis := listen(t, "127.0.0.1:0")
	ssrv := grpc.NewServer()
	settlementv1.RegisterSettlementServiceServer(ssrv, settlement)
	go func() { _ = ssrv.Serve(slis) }()
	t.Cleanup(ssrv.Stop)
	sconn, err := grpc.NewClient(slis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sconn.Close() })
	pool := adaptercall.NewPool()
	t.Cleanup(func() { _ = pool.Close() })
	h := New(store.New(s.Pool), pool, settlementv1.NewSettlementServiceClient(sconn),
		func(d time.Duration) time.Duration { return d }, zap.NewNop())

	id := s.InsertExecution(t, dbtest.Execution{})
	require.Equal(t, mq.Ack().String(), h.Handle(context.Background(), message(t, id, 1, time.Now())).String())

	settlement.mu.Lock()
	defer settlement.mu.Unlock()
	require.Equal(t, 6, settlement.calls, "retried through the outage")
	require.Len(t, settlement.settled, 1, "recorded once")
}

func TestClassifyDB(t *testing.T) {
	t.Parallel()
	require.Equal(t, outcome.Retry, classifyDB(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")))
	require.Equal(t, outcome.Retry, classifyDB(fmt.Errorf("record: %w", &pgconn.PgError{Code: "57P01"})), "admin shutdown")
	require.Equal(t, outcome.Retry, classifyDB(&pgconn.PgError{Code: "08006"}))
	require.Equal(t, outcome.Retry, classifyDB(&pgconn.PgError{Code: "40001"}), "serialization failure")
	require.Equal(t, outcome.ClassRefused, classifyDB(&pgconn.PgError{Code: "23505"}), "a constraint is not a blip")
	require.Equal(t, outcome.ClassMovedOn, classifyDB(errMovedOn))
}
