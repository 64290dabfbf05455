package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/store"
)

// Redriven is how many dead-lettered dispatches this recoverer sent back.
func (r *Recoverer) Redriven() int64 { return r.redriven.Load() }

// Cleared is how many dead-lettered dispatches this recoverer discarded as explained.
func (r *Recoverer) Cleared() int64 { return r.cleared.Load() }

// TestDeadLetteredDispatchIsSentBack: dispatches dead-lettered while the consumer could not do
// its work (here, a handler that fails until the "database" is back). Once it works again, the
// recoverer sends back the one whose attempt can still start — it reaches the consumer in well
// under a second, rather than its execution waiting for the sweeper to fail it at its deadline —
// discards the one whose attempt started meanwhile, and leaves the ones the database does not
// explain (no such execution), that a waiting record will dispatch anyway, or whose execution's
// deadline passed (the sweeper settles it; no adapter should start work for it).
func TestDeadLetteredDispatchIsSentBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	stranded := s.InsertExecution(t, dbtest.Execution{})                             // pending, attempt 1 not started
	started := s.InsertExecution(t, dbtest.Execution{Status: "running", Attempt: 1}) // started by a duplicate
	waiting := s.InsertExecution(t, dbtest.Execution{})                              // its record waits
	_, err := s.Pool.Exec(ctx, `INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, 1, now() + interval '1 hour')`, waiting)
	require.NoError(t, err)
	expired := s.InsertExecution(t, dbtest.Execution{Deadline: time.Now().Add(-time.Second)}) // the sweeper's
	unknown := uuid.NewString()

	route := mq.Route{Name: routes.Executions.Name, Retry: mq.RetryPolicy{Delays: []time.Duration{10 * time.Millisecond}, MaxAttempts: 2}}
	b, err := mq.Dial(ctx, mq.Config{URL: amqpURL(), Scope: "recovertest-" + uuid.NewString()[:8]})
	require.NoError(t, err)
	require.NoError(t, b.Declare(ctx, route))
	declared := time.Now()
	t.Cleanup(func() {
		time.Sleep(time.Until(declared.Add(time.Second)))
		assert.NoError(t, b.DeleteRoutes(context.Background(), route))
		assert.NoError(t, b.Close())
	})

	var dbUp atomic.Bool
	got := make(chan string, 10)
	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- b.Consume(cctx, route.Name, 2, func(_ context.Context, m *mq.Message) mq.Result {
			if !dbUp.Load() {
				return mq.Fail(fmt.Errorf("start attempt: %w", context.DeadlineExceeded))
			}
			got <- m.ID
			return mq.Ack()
		})
	}()
	defer func() {
		stop()
		assert.NoError(t, <-consumed)
	}()
	var msgs []mq.Outgoing
	for _, exec := range []string{stranded, started, waiting, expired, unknown} {
		body, err := proto.Marshal(&queuev1.ExecutionDispatch{ExecutionId: exec, Attempt: 1, DueTime: timestamppb.Now()})
		require.NoError(t, err)
		msgs = append(msgs, mq.Outgoing{ID: exec + ":1", Body: body})
	}
	for _, err := range b.PublishAll(ctx, route.Name, msgs) {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.Counters(route.Name).DeadLettered == 5 }, 15*time.Second, 10*time.Millisecond)

	dbUp.Store(true)
	rec := NewRecoverer(store.New(s.Pool), b, zap.NewNop(), time.Second)
	back := time.Now()
	require.NoError(t, rec.Pass(ctx))
	select {
	case id := <-got:
		assert.Equal(t, stranded+":1", id)
		t.Logf("sent back and handled %v after the consumer could work again", time.Since(back))
	case <-time.After(10 * time.Second):
		t.Fatal("the stranded dispatch never came back")
	}
	assert.EqualValues(t, 1, rec.Redriven())
	assert.EqualValues(t, 1, rec.Cleared())
	dls, err := b.DeadLetters(ctx, route.Name, 10)
	require.NoError(t, err)
	var left []string
	for _, dl := range dls {
		left = append(left, dl.ID)
	}
	assert.ElementsMatch(t, []string{waiting + ":1", expired + ":1", unknown + ":1"}, left)

	// The next pass finds nothing more to do.
	require.NoError(t, rec.Pass(ctx))
	assert.EqualValues(t, 1, rec.Redriven())
	assert.EqualValues(t, 1, rec.Cleared())
	select {
	case id := <-got:
		t.Fatalf("%s handled again", id)
	default:
	}
}

// TestPoisonDispatchRedrivesAreCapped: a dispatch whose handling fails every budget for its own
// sake (not a blip) is redriven MaxRedrives times, then left in the DLQ with its count, rather
// than being sent back on every pass until its deadline.
func TestPoisonDispatchRedrivesAreCapped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	poison := s.InsertExecution(t, dbtest.Execution{}) // pending, attempt 1 not started

	route := mq.Route{Name: routes.Executions.Name, Retry: mq.RetryPolicy{Delays: []time.Duration{10 * time.Millisecond}, MaxAttempts: 2}}
	b, err := mq.Dial(ctx, mq.Config{URL: amqpURL(), Scope: "recovertest-" + uuid.NewString()[:8]})
	require.NoError(t, err)
	require.NoError(t, b.Declare(ctx, route))
	declared := time.Now()
	t.Cleanup(func() {
		time.Sleep(time.Until(declared.Add(time.Second)))
		assert.NoError(t, b.DeleteRoutes(context.Background(), route))
		assert.NoError(t, b.Close())
	})
	var handled atomic.Int32
	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- b.Consume(cctx, route.Name, 1, func(context.Context, *mq.Message) mq.Result {
			handled.Add(1)
			return mq.Fail(fmt.Errorf("start attempt: %w", errors.New("ERROR: value too long (SQLSTATE 22001)")))
		})
	}()
	defer func() {
		stop()
		assert.NoError(t, <-consumed)
	}()
	body, err := proto.Marshal(&queuev1.ExecutionDispatch{ExecutionId: poison, Attempt: 1, DueTime: timestamppb.Now()})
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, route.Name, mq.Outgoing{ID: poison + ":1", Body: body}))

	rec := NewRecoverer(store.New(s.Pool), b, zap.NewNop(), time.Second)
	for pass := 1; pass <= MaxRedrives+2; pass++ {
		dead := uint64(min(pass, MaxRedrives+1))
		require.Eventually(t, func() bool { return b.Counters(route.Name).DeadLettered == dead }, 15*time.Second, 10*time.Millisecond,
			"pass %d: dead-lettered %d times", pass, dead)
		require.NoError(t, rec.Pass(ctx))
		assert.EqualValues(t, min(pass, MaxRedrives), rec.Redriven(), "pass %d", pass)
	}
	dls, err := b.DeadLetters(ctx, route.Name, 10)
	require.NoError(t, err)
	require.Len(t, dls, 1, "left in the DLQ")
	assert.Equal(t, MaxRedrives, dls[0].Redriven)
	assert.EqualValues(t, 2*(MaxRedrives+1), handled.Load(), "two attempts per budget, no more after the cap")
	assert.Zero(t, rec.Cleared())
}
