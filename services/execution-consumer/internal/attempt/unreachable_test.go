package attempt

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/outcome"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken/tokentest"
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

	keys := tokentest.New(t, dbtest.TestAdapter)
	pool := adaptercall.NewPool(adaptercall.WithSigner(keys.Signer))
	pool.SetConnectWait(300 * time.Millisecond)
	t.Cleanup(func() { _ = pool.Close() })
	h := New(store.New(s.Pool), pool, settlementv1.NewSettlementServiceClient(sconn),
		func(d time.Duration) time.Duration { return d }, zap.NewNop())
	b := &bundle{schema: s, handler: h}

	var nudges atomic.Int32
	h.WithNudge(func() { nudges.Add(1) })

	id := s.InsertExecution(t, dbtest.Execution{})
	msg := message(t, id, 1, time.Now().Add(-time.Second))
	for i := range 2 {
		res := h.Handle(context.Background(), msg)
		require.Equal(t, mq.Ack().String(), res.String(), "the retry lives in Postgres, not in a copy of the message")
		status, attempt, rows := b.current(t, id)
		require.Equal(t, "pending", status)
		require.Zero(t, attempt, "no attempt spent")
		require.Zero(t, rows, "no attempt row left")
		in := b.dispatchDueIn(t, id, 1)
		require.NotNil(t, in, "the attempt is rescheduled as a dispatch record")
		require.InDelta(t, unreachableMinDelay.Seconds(), in.Seconds(), 0.5, "due after the least delay")
		require.EqualValues(t, i+1, nudges.Load(), "the dispatcher is nudged")
		b.deleteDispatches(t, id) // as the dispatcher does once it published the record
	}
	require.Empty(t, settlement.failed, "nothing reported: there was no attempt")

	// The adapter comes up on the port.
	asrv := grpc.NewServer()
	calls := 0
	var mu sync.Mutex
	ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result {
		mu.Lock()
		calls++
		mu.Unlock()
		return adapter.Complete(map[string]any{"ok": true})
	}, adapter.Options{AdapterID: dbtest.TestAdapter, PlatformKeys: []ed25519.PublicKey{keys.Public}})
	require.NoError(t, err)
	ad.Register(asrv)
	alis := listen(t, addr)
	go func() { _ = asrv.Serve(alis) }()
	t.Cleanup(asrv.Stop)

	// Within a second or so the consumer finds it (its reconnect backoff is capped at 1 s; until
	// then a dispatch answers NotSent at once and is rescheduled again).
	require.Eventually(t, func() bool {
		require.Equal(t, mq.Ack().String(), h.Handle(context.Background(), msg).String())
		status, _, _ := b.current(t, id)
		return status == "running"
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
	keys := tokentest.New(t, dbtest.TestAdapter)
	ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result {
		return adapter.Complete(map[string]any{"ok": true})
	}, adapter.Options{AdapterID: dbtest.TestAdapter, PlatformKeys: []ed25519.PublicKey{keys.Public}})
	require.NoError(t, err)
	ad.Register(asrv)
	alis := listen(t, "127.0.0.1:0")
	go func() { _ = asrv.Serve(alis) }()
	t.Cleanup(asrv.Stop)
	_, err = s.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, alis.Addr().String())
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
	pool := adaptercall.NewPool(adaptercall.WithSigner(keys.Signer))
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

// dispatchDueIn is how long until the dispatch record of the execution's attempt n is due, by the
// database's clock, or nil if there is none.
func (b *bundle) dispatchDueIn(t *testing.T, id string, n int32) *time.Duration {
	t.Helper()
	var secs []float64
	rows, err := b.schema.Pool.Query(context.Background(),
		`SELECT extract(epoch FROM due_at - now())::float8 FROM dispatches WHERE execution_id = $1 AND attempt = $2`, id, n)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var v float64
		require.NoError(t, rows.Scan(&v))
		secs = append(secs, v)
	}
	require.NoError(t, rows.Err())
	if len(secs) == 0 {
		return nil
	}
	d := time.Duration(secs[0] * float64(time.Second))
	return &d
}

func (b *bundle) deleteDispatches(t *testing.T, id string) {
	t.Helper()
	_, err := b.schema.Pool.Exec(context.Background(), `DELETE FROM dispatches WHERE execution_id = $1`, id)
	require.NoError(t, err)
}

// unreachableHandler is a Handler whose adapter endpoint has nothing listening, with a short
// connect wait, and whose settlement is the returned recorder.
func unreachableHandler(t *testing.T) (*bundle, *recordingSettlement) {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
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
	pool.SetConnectWait(500 * time.Millisecond)
	t.Cleanup(func() { _ = pool.Close() })
	h := New(store.New(s.Pool), pool, settlementv1.NewSettlementServiceClient(sconn),
		func(d time.Duration) time.Duration { return d }, zap.NewNop())
	return &bundle{schema: s, handler: h}, settlement
}

// TestUnreachableWhileACopyWasDroppedLeavesTheRetry: while one handler waits for an unreachable
// adapter, a redelivered copy of its dispatch (its broker connection closed meanwhile) finds the
// attempt running and is dropped. When the first handler then undoes the start, the attempt must
// still be retried — its subscription may be dead, so a deferred copy of the message cannot carry
// the retry: the dispatch record written with the undo does.
func TestUnreachableWhileACopyWasDroppedLeavesTheRetry(t *testing.T) {
	t.Parallel()
	b, settlement := unreachableHandler(t)
	id := b.schema.InsertExecution(t, dbtest.Execution{})
	msg := message(t, id, 1, time.Now())

	first := make(chan mq.Result, 1)
	go func() { first <- b.handler.Handle(context.Background(), msg) }()
	require.Eventually(t, func() bool {
		status, _, _ := b.current(t, id)
		return status == "running"
	}, 5*time.Second, 5*time.Millisecond, "the first handler started the attempt")
	require.Equal(t, mq.Ack().String(), b.handler.Handle(context.Background(), msg).String(), "the copy is dropped")

	res := <-first
	require.Equal(t, mq.Ack().String(), res.String())
	status, attempt, rows := b.current(t, id)
	require.Equal(t, []any{"pending", int32(0), int32(0)}, []any{status, attempt, rows}, "no attempt spent")
	require.NotNil(t, b.dispatchDueIn(t, id, 1), "the retry lives in Postgres")
	require.Empty(t, settlement.failed)
}

// TestUnreachableAtTheDeadlineReportsTheFailure: with no time left for another try the failure is
// reported, as for any attempt, and nothing is rescheduled.
func TestUnreachableAtTheDeadlineReportsTheFailure(t *testing.T) {
	t.Parallel()
	b, settlement := unreachableHandler(t)
	id := b.schema.InsertExecution(t, dbtest.Execution{Deadline: time.Now().Add(1200 * time.Millisecond)})

	require.Equal(t, mq.Ack().String(), b.handler.Handle(context.Background(), message(t, id, 1, time.Now())).String())
	require.Nil(t, b.dispatchDueIn(t, id, 1), "nothing rescheduled past the deadline")
	settlement.mu.Lock()
	defer settlement.mu.Unlock()
	require.Len(t, settlement.failed, 1, "the failure is reported")
	require.EqualValues(t, 1, settlement.failed[0].GetAttempt())
}
