package dispatch

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/store"
)

func amqpURL() string {
	if u := os.Getenv("INTEGRATIONS_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// received is a dispatch as a consumer handled it, at or after its due time.
type received struct {
	attempt int32
	due, at time.Time
}

// TestPassPublishesWithinTheHorizon runs a pass against real Postgres and RabbitMQ, with the
// executions route's name (what the dispatcher publishes to) on a scope of its own and short
// delay levels: a due record and one due within the horizon are published and deleted, the
// second into its delay level, and both reach a consumer that defers early arrivals no earlier
// than their due time; a record beyond the horizon stays in Postgres, and the dispatcher plans to
// wake when it comes within reach.
func TestPassPublishesWithinTheHorizon(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	exec := s.InsertExecution(t, dbtest.Execution{})

	route := mq.Route{Name: routes.Executions.Name, DelayLevels: []time.Duration{100 * time.Millisecond, time.Second}}
	b, err := mq.Dial(ctx, mq.Config{URL: amqpURL(), Scope: "dispatchtest-" + uuid.NewString()[:8]})
	require.NoError(t, err)
	require.NoError(t, b.Declare(ctx, route))
	declared := time.Now()
	t.Cleanup(func() {
		// Never delete at-least-once queues right after declaring them (see pkg/mq deadLetterVia).
		time.Sleep(time.Until(declared.Add(time.Second)))
		assert.NoError(t, b.DeleteRoutes(context.Background(), route))
		assert.NoError(t, b.Close())
	})

	insert := func(n int, dueIn time.Duration) time.Time {
		var due time.Time
		require.NoError(t, s.Pool.QueryRow(ctx, `
			INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, $2, now() + make_interval(secs => $3))
			RETURNING due_at`, exec, n, dueIn.Seconds()).Scan(&due))
		return due
	}
	insert(1, -time.Second)
	insert(2, 700*time.Millisecond)
	beyond := insert(3, 5*time.Second)

	got := make(chan received, 4)
	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- b.Consume(cctx, route.Name, 2, func(_ context.Context, m *mq.Message) mq.Result {
			var d queuev1.ExecutionDispatch
			if err := proto.Unmarshal(m.Body, &d); err != nil {
				return mq.Reject(err)
			}
			if early := time.Until(d.GetDueTime().AsTime()); early > 0 {
				return mq.Defer(early)
			}
			got <- received{attempt: d.GetAttempt(), due: d.GetDueTime().AsTime(), at: time.Now()}
			return mq.Ack()
		})
	}()
	defer func() {
		stop()
		assert.NoError(t, <-consumed)
	}()

	d := New(store.New(s.Pool), b, zap.NewNop(), Config{
		Interval: time.Hour, ClaimTTL: 30 * time.Second, Horizon: time.Second, BatchSize: 10,
	})
	wake, err := d.pass(ctx)
	require.NoError(t, err)

	var left []int32
	rows, err := s.Pool.Query(ctx, `SELECT attempt FROM dispatches ORDER BY attempt`)
	require.NoError(t, err)
	for rows.Next() {
		var n int32
		require.NoError(t, rows.Scan(&n))
		left = append(left, n)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []int32{3}, left, "only the record beyond the horizon waits in Postgres")
	c := b.Counters(route.Name)
	assert.EqualValues(t, 2, c.Published)
	assert.EqualValues(t, 2, c.Confirmed)

	assert.InDelta(t, time.Until(beyond.Add(-time.Second)).Seconds(), wake.Seconds(), 0.5,
		"the next pass is when the last record comes within the horizon")

	for _, want := range []int32{1, 2} {
		var r received
		select {
		case r = <-got:
		case <-time.After(15 * time.Second):
			t.Fatalf("dispatch %d never arrived", want)
		}
		assert.Equal(t, want, r.attempt, "in due order")
		assert.False(t, r.at.Before(r.due), "attempt %d handled %v before it was due", r.attempt, r.due.Sub(r.at))
	}
}

// stoppedPublisher is stopped while it publishes (the service's stop cancels the pass's context)
// and answers every publish as not confirmed.
type stoppedPublisher struct{ stop context.CancelFunc }

func (p stoppedPublisher) PublishAfter(ctx context.Context, _ string, msgs []mq.Outgoing, _ []time.Duration) []error {
	p.stop()
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = context.Canceled
	}
	return errs
}

// TestUnpublishedRecordsAreReleased: records a pass claimed but could not publish — the broker did
// not confirm them, or the dispatcher was being stopped (its context cancelled) — are released at
// once, so the next pass publishes them instead of waiting out the 30 s claim.
func TestUnpublishedRecordsAreReleased(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	exec := s.InsertExecution(t, dbtest.Execution{})
	_, err := s.Pool.Exec(context.Background(), `INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, 1, now())`, exec)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := New(store.New(s.Pool), stoppedPublisher{stop: cancel}, zap.NewNop(), Config{
		Interval: time.Hour, ClaimTTL: 30 * time.Second, Horizon: time.Second, BatchSize: 10,
	})
	_, err = d.batch(ctx)
	require.NoError(t, err)

	var claimed *time.Time
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT claimed_until FROM dispatches WHERE execution_id = $1`, exec).Scan(&claimed))
	assert.Nil(t, claimed, "the record is claimable again at once")
}

// TestRetryDueInALevelTakesOneHop: a record due in exactly one delay level's delay — a retry just
// written by the settlement service, claimed a little later — is published into that level, not
// the next shorter one, and a consumer that takes an arrival early by less than the route's delay
// tolerance as on time (as the execution-consumer does) handles it on its first delivery: one
// holding-queue hop, no deferral. Before the level's slack the delay came out short of the 1 s
// level, went to the 300 ms one, and was deferred down the levels.
//
// The claim comes after the write by however long this machine takes: a few milliseconds idle,
// tens under a loaded make test (issue 22 measured up to 46 ms at a load average of 9). The
// promise holds for a claim within the level's slack (a tenth of it, pkg/mq levelSlack); a round
// whose claim came later than that has not met the premise, says so, and is run again on a fresh
// record and scope (at most five rounds), so the test never passes without the one-hop case.
func TestRetryDueInALevelTakesOneHop(t *testing.T) {
	t.Parallel()
	const level = time.Second
	const slack = level / 10
	for round := 1; ; round++ {
		r := retryRound(t, level)
		if r.delay < level-slack {
			t.Logf("round %d: claimed %v after the write, beyond the level's slack of %v: not the premise; again", round, level-r.delay, slack)
			require.Less(t, round, 5, "five rounds and no claim within %v of the write: the machine is too loaded for this test's premise", slack)
			continue
		}
		t.Logf("round %d: published %v ahead of its due time, handled %v after it", round, r.delay, r.at.Sub(r.due))
		assert.GreaterOrEqual(t, r.at.Sub(r.published), level-mq.DelayTolerance, "it waited in the 1 s level")
		assert.False(t, r.at.Before(r.due.Add(-mq.DelayTolerance)), "handled %v before it was due", r.due.Sub(r.at))
		assert.EqualValues(t, 1, r.counters.Published, "one publish, into one holding queue")
		assert.Zero(t, r.counters.Deferred, "no deferral: no second holding-queue hop")
		assert.Zero(t, r.counters.Retried+r.counters.Requeued+r.counters.DeadLettered)
		return
	}
}

// retryRun is one round of TestRetryDueInALevelTakesOneHop: the delay the dispatcher computed for
// the record, when it was published and handled, and the route's counters once it was acked.
type retryRun struct {
	received
	delay     time.Duration
	published time.Time
	counters  mq.Counters
}

// retryRound writes a dispatch record due in level from the database's now(), runs one pass on a
// route of its own with levels 100 ms, 300 ms and level, and waits for a consumer to handle it.
func retryRound(t *testing.T, level time.Duration) retryRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	exec := s.InsertExecution(t, dbtest.Execution{})

	route := mq.Route{Name: routes.Executions.Name, DelayLevels: []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, level}}
	b, err := mq.Dial(ctx, mq.Config{URL: amqpURL(), Scope: "dispatchtest-" + uuid.NewString()[:8]})
	require.NoError(t, err)
	require.NoError(t, b.Declare(ctx, route))
	declared := time.Now()
	t.Cleanup(func() {
		time.Sleep(time.Until(declared.Add(time.Second)))
		assert.NoError(t, b.DeleteRoutes(context.Background(), route))
		assert.NoError(t, b.Close())
	})
	tolerance := b.DelayTolerance(route.Name)
	require.Equal(t, mq.DelayTolerance, tolerance)

	got := make(chan received, 1)
	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- b.Consume(cctx, route.Name, 2, func(_ context.Context, m *mq.Message) mq.Result {
			var d queuev1.ExecutionDispatch
			if err := proto.Unmarshal(m.Body, &d); err != nil {
				return mq.Reject(err)
			}
			if early := time.Until(d.GetDueTime().AsTime()); early >= tolerance {
				return mq.Defer(early)
			}
			got <- received{attempt: d.GetAttempt(), due: d.GetDueTime().AsTime(), at: time.Now()}
			return mq.Ack()
		})
	}()
	defer func() {
		stop()
		assert.NoError(t, <-consumed)
	}()

	// Due in exactly the level's delay from the database's now(); the claim comes after.
	require.NoError(t, s.Pool.QueryRow(ctx, `
		INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, 2, now() + make_interval(secs => $2))
		RETURNING due_at`, exec, level.Seconds()).Scan(new(time.Time)))
	run := retryRun{published: time.Now()}
	pub := &delaysSeen{Publisher: b}
	d := New(store.New(s.Pool), pub, zap.NewNop(), Config{
		Interval: time.Hour, ClaimTTL: 30 * time.Second, Horizon: level, BatchSize: 10,
	})
	require.NoError(t, d.Pass(ctx))
	require.Len(t, pub.delays, 1, "one record published")
	run.delay = pub.delays[0]

	select {
	case run.received = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("the dispatch never arrived")
	}
	require.Eventually(t, func() bool { return b.Counters(route.Name).Acknowledged == 1 }, 10*time.Second, 10*time.Millisecond)
	run.counters = b.Counters(route.Name)
	return run
}

// delaysSeen is a Publisher that records the delays it was asked to publish with.
type delaysSeen struct {
	Publisher
	delays []time.Duration
}

func (p *delaysSeen) PublishAfter(ctx context.Context, route string, msgs []mq.Outgoing, delays []time.Duration) []error {
	p.delays = append(p.delays, delays...)
	return p.Publisher.PublishAfter(ctx, route, msgs, delays)
}
