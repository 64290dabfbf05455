package mq

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// brokerClockGrain: the broker stamps and expires messages in whole milliseconds, so a lower bound
// on a wait allows it that much against our clock.
const brokerClockGrain = 2 * time.Millisecond

func TestPlanDelayLevels(t *testing.T) {
	t.Parallel()
	top, err := plan("s", 0.5, Route{Name: "jobs",
		Retry:       RetryPolicy{Delays: []time.Duration{time.Second}},
		DelayLevels: []time.Duration{10 * time.Second, time.Second, 2 * time.Second, 1500 * time.Microsecond},
	})
	require.NoError(t, err)
	// Scaled, rounded to whole milliseconds (at least 1), sorted, one queue per distinct level;
	// separate from the retry holding queues even where the TTL is the same.
	assert.Equal(t, []time.Duration{time.Millisecond, 500 * time.Millisecond, time.Second, 5 * time.Second}, top.delayTTLs)
	assert.Equal(t, []string{
		"s.jobs", "s.jobs.dlq", "s.jobs.retry.500ms",
		"s.jobs.delay.1ms", "s.jobs.delay.500ms", "s.jobs.delay.1000ms", "s.jobs.delay.5000ms",
	}, top.queues())
	// The tolerance scales with the levels: 50 ms at 0.5 is 25 ms.
	tol := top.delayTolerance
	require.Equal(t, 25*time.Millisecond, tol)
	for _, tc := range []struct {
		d    time.Duration
		want string // "" → the work queue
	}{
		{-time.Second, ""},
		{0, ""},                                // due already: nothing to wait for, whatever the tolerance
		{time.Microsecond, "s.jobs.delay.1ms"}, // the 1 ms level is within the tolerance of it
		{time.Millisecond, "s.jobs.delay.1ms"},
		// Each level's slack: a tenth of it up to a second, a hundredth if more, at least tol —
		// 50 ms at 500 ms, 100 ms at 1 s, 500 ms at 5 s.
		{500*time.Millisecond - 51*time.Millisecond, "s.jobs.delay.1ms"}, // short by more than 50 ms
		{500*time.Millisecond - 50*time.Millisecond, "s.jobs.delay.500ms"},
		{500*time.Millisecond - tol, "s.jobs.delay.500ms"},
		{500 * time.Millisecond, "s.jobs.delay.500ms"},
		{999 * time.Millisecond, "s.jobs.delay.1000ms"},
		{time.Second - 100*time.Millisecond, "s.jobs.delay.1000ms"},                   // a loaded machine's claim lag
		{time.Second - 100*time.Millisecond - time.Microsecond, "s.jobs.delay.500ms"}, // short by more
		{4 * time.Second, "s.jobs.delay.1000ms"},
		{5*time.Second - 3*time.Millisecond, "s.jobs.delay.5000ms"}, // a due time minus a claim's ms
		{5*time.Second - 500*time.Millisecond, "s.jobs.delay.5000ms"},
		{5*time.Second - 501*time.Millisecond, "s.jobs.delay.1000ms"}, // short by more
		{5 * time.Second, "s.jobs.delay.5000ms"},
		{time.Hour, "s.jobs.delay.5000ms"},
	} {
		q, ttl, ok := top.delayQueue(tc.d)
		assert.Equal(t, tc.want != "", ok, "delay %v", tc.d)
		assert.Equal(t, tc.want, q, "delay %v", tc.d)
		if ok {
			assert.LessOrEqual(t, ttl, tc.d+max(tol, min(ttl/10, time.Second), ttl/100), "the level is never past the delay by more than its slack")
		}
	}

	none, err := plan("s", 1, Route{Name: "plain"})
	require.NoError(t, err)
	_, _, ok := none.delayQueue(time.Hour)
	assert.False(t, ok, "a route without levels publishes straight to its work queue")
	assert.Zero(t, none.delayTolerance)

	_, err = plan("s", 1, Route{Name: "x", DelayLevels: []time.Duration{time.Second, 0}})
	assert.ErrorContains(t, err, "delay level 1 is 0s")
	_, err = plan("s", 1, Route{Name: "x.delay.5ms"})
	assert.ErrorIs(t, err, ErrInvalidName, "a route named like another's delay queue")
}

func TestDelayToleranceScalesWithAFloor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scale float64
		want  time.Duration
	}{
		{1, DelayTolerance},
		{0.5, 25 * time.Millisecond},
		{0.01, delayToleranceFloor}, // 0.5 ms scaled: the milliseconds spent are real ones
	} {
		top, err := plan("s", tc.scale, Route{Name: "jobs", DelayLevels: []time.Duration{time.Minute}})
		require.NoError(t, err)
		assert.Equal(t, tc.want, top.delayTolerance, "scale %v", tc.scale)
	}
	// Small against the levels it is applied to: a twentieth of the smallest default level.
	assert.LessOrEqual(t, DelayTolerance*20, time.Second)
}

// arrival is when a message reached the handler, and how.
type arrival struct {
	id      string
	attempt int
	at      time.Time
}

func TestPublishAfterArrivesNoEarlierThanItsLevel(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	levels := []time.Duration{300 * time.Millisecond, time.Second}
	route := Route{Name: "sched", DelayLevels: levels}
	require.NoError(t, tb.b.Declare(tb.ctx, route))
	assert.Equal(t, levels, tb.b.DelayLevels("sched"))
	assert.Nil(t, tb.b.DelayLevels("never-declared"))

	got := make(chan arrival, 8)
	tb.consume(t, "sched", 4, func(_ context.Context, m *Message) Result {
		got <- arrival{id: m.ID, attempt: m.Attempt, at: time.Now()}
		return Ack()
	})
	// level: the least each waits; the most is only bounded loosely (a shared machine).
	cases := map[string]struct{ delay, level time.Duration }{
		"now":        {0, 0},
		"past":       {-time.Minute, 0},
		"short":      {200 * time.Millisecond, 0}, // below the smallest level (and its tolerance): straight to work
		"mid":        {700 * time.Millisecond, 300 * time.Millisecond},
		"long":       {1500 * time.Millisecond, time.Second},
		"exactlyTop": {time.Second, time.Second},
	}
	var msgs []Outgoing
	var delays []time.Duration
	for id, c := range cases {
		msgs = append(msgs, Outgoing{ID: id})
		delays = append(delays, c.delay)
	}
	start := time.Now()
	for i, err := range tb.b.PublishAfter(tb.ctx, "sched", msgs, delays) {
		require.NoError(t, err, "message %s", msgs[i].ID)
	}
	for range cases {
		a := receive(t, got, "scheduled messages")
		c := cases[a.id]
		waited := a.at.Sub(start)
		t.Logf("%s: delay %v, level %v, arrived after %v", a.id, c.delay, c.level, waited)
		assert.GreaterOrEqual(t, waited, c.level-brokerClockGrain, "%s arrived before its level", a.id)
		assert.Less(t, waited, c.level+5*time.Second, "%s", a.id)
		assert.Equal(t, 1, a.attempt)
	}
	c := tb.b.Counters("sched")
	assert.EqualValues(t, len(cases), c.Published)
	assert.EqualValues(t, len(cases), c.Confirmed)
	require.Eventually(t, func() bool { return tb.b.Counters("sched").Acknowledged == uint64(len(cases)) }, waitFor, 10*time.Millisecond)
	for _, q := range tb.b.declared()[0].queues() {
		assert.Zero(t, tb.depth(t, q), "queue %s is empty", q)
	}
}

func TestPublishAfterRefusals(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "sched", DelayLevels: []time.Duration{time.Second}}))
	errs := tb.b.PublishAfter(tb.ctx, "undeclared", []Outgoing{{ID: "a"}}, []time.Duration{time.Second})
	assert.ErrorIs(t, errs[0], ErrUnknownRoute, "the levels come from Declare")
	errs = tb.b.PublishAfter(tb.ctx, "sched", []Outgoing{{ID: "a"}, {ID: "b"}}, []time.Duration{time.Second})
	assert.ErrorContains(t, errs[0], "2 messages but 1 delays")
	assert.ErrorContains(t, errs[1], "2 messages but 1 delays")
	assert.Zero(t, tb.b.Counters("sched").Published)
}

// TestLongDelayDoesNotHoldBackShort: A is scheduled 2 s ahead, then B 300 ms ahead. In one queue
// with per-message TTLs B would wait behind A (RabbitMQ expires only at a queue's head); with a
// queue per level B arrives first, on time.
func TestLongDelayDoesNotHoldBackShort(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "sched",
		DelayLevels: []time.Duration{300 * time.Millisecond, 2 * time.Second}}))
	got := make(chan arrival, 2)
	tb.consume(t, "sched", 2, func(_ context.Context, m *Message) Result {
		got <- arrival{id: m.ID, at: time.Now()}
		return Ack()
	})
	start := time.Now()
	require.NoError(t, tb.b.PublishAfter(tb.ctx, "sched", []Outgoing{{ID: "A"}}, []time.Duration{2 * time.Second})[0])
	require.NoError(t, tb.b.PublishAfter(tb.ctx, "sched", []Outgoing{{ID: "B"}}, []time.Duration{300 * time.Millisecond})[0])

	first, second := receive(t, got, "first"), receive(t, got, "second")
	t.Logf("%s after %v, %s after %v", first.id, first.at.Sub(start), second.id, second.at.Sub(start))
	require.Equal(t, "B", first.id)
	require.Equal(t, "A", second.id)
	// Behind A, B would come at A's 2 s or later (the order above says it did not): before 2 s
	// is the most that can be asked of B without a tighter bound than a loaded machine keeps.
	assert.Less(t, first.at.Sub(start), 2*time.Second, "B did not wait for A")
	assert.GreaterOrEqual(t, second.at.Sub(start), 2*time.Second-brokerClockGrain)
}

// TestDelayQueuesDiagnosedAndDeleted: Diagnose misses a deleted delay queue; DeleteRoutes deletes
// them all.
func TestDelayQueuesDiagnosedAndDeleted(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	route := Route{Name: "sched", DelayLevels: []time.Duration{time.Second, time.Minute}}
	require.NoError(t, tb.b.Declare(tb.ctx, route))
	stop := tb.consume(t, "sched", 1, func(context.Context, *Message) Result { return Ack() })
	require.Eventually(t, func() bool {
		return tb.b.Diagnose(tb.ctx, []Route{route}, 5*time.Second)[0].OK
	}, waitFor, 20*time.Millisecond, "healthy with its delay queues")
	missing := tb.b.QueueName("sched") + ".delay.60000ms"
	tb.dlxGrace()
	_, err := tb.ch.QueueDelete(missing, false, false, false)
	require.NoError(t, err)
	d := tb.b.Diagnose(tb.ctx, []Route{route}, 5*time.Second)[0]
	assert.Equal(t, []string{"holding queue " + missing + " missing"}, d.Problems)

	// Stopped first: a consumer whose queue is deleted resubscribes, declaring it again.
	stop()
	require.NoError(t, tb.b.Declare(tb.ctx, route))
	tb.dlxGrace()
	require.NoError(t, tb.b.DeleteRoutes(tb.ctx, route))
	conn, err := amqp.Dial(testURL())
	require.NoError(t, err)
	defer conn.Close()
	for _, q := range []string{tb.b.QueueName("sched") + ".delay.1000ms", missing} {
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		var ae *amqp.Error
		require.ErrorAs(t, err, &ae, "queue %s", q)
		assert.Equal(t, amqp.NotFound, ae.Code, "queue %s deleted", q)
	}
}

// hops is how many holding-queue hops a message due in d takes when its consumer defers what is
// left whenever it arrives early by at least early (below the smallest level the rest is held in
// the worker: no hop): the walk PublishAfter and Defer make through top's levels.
func hops(top *topology, d, early time.Duration) int {
	n := 0
	for left := d; left >= early && left >= top.delayTTLs[0]-top.levelSlack(top.delayTTLs[0]); n++ {
		_, ttl, ok := top.delayQueue(left)
		if !ok {
			break
		}
		left -= ttl
	}
	return n
}

// TestRetryDueInALevelTakesOneHop: with the executions route's levels, a retry due in exactly
// one level's delay, computed short of it by the time between the settlement's commit and the
// dispatcher's claim — milliseconds when idle, hundreds under load — takes one holding-queue hop;
// before the slack it walked down the levels — the 10 (1 m) to 22 (2 h) hops issue 13 measured.
func TestRetryDueInALevelTakesOneHop(t *testing.T) {
	t.Parallel()
	levels := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour}
	top, err := plan("s", 1, Route{Name: "executions", DelayLevels: levels})
	require.NoError(t, err)
	for _, l := range levels {
		// A loaded machine's lag, within each level's slack: a tenth of it up to a second, or a
		// hundredth if more.
		spent := max(min(l/10, time.Second), l/100)
		assert.Equal(t, 1, hops(top, l-5*time.Millisecond, DelayTolerance), "a retry due in %v, 5 ms short", l)
		assert.Equal(t, 1, hops(top, l-spent, DelayTolerance), "a retry due in %v, %v short", l, spent)
	}
	assert.Equal(t, 1, hops(top, time.Second-90*time.Millisecond, DelayTolerance), "1 s, 90 ms short (a loaded two-core machine)")
	assert.Equal(t, 1, hops(top, time.Minute-400*time.Millisecond, DelayTolerance), "1 m, 400 ms short (a busy settlement batch)")
	assert.Greater(t, hops(top, 5*time.Second-600*time.Millisecond, DelayTolerance), 1, "short by more than the slack: the shorter levels")
	assert.Greater(t, hops(top, time.Minute-1500*time.Millisecond, DelayTolerance), 1, "short by more than the slack: the shorter levels")
}
