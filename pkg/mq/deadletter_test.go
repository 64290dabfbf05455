package mq

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ids(dls []DeadLetter) []string {
	out := make([]string, len(dls))
	for i, d := range dls {
		out[i] = d.ID
	}
	return out
}

// TestDeadLettersListAndRedrive: listing the same DLQ 25 times (the head of it, and all of it)
// neither loses nor reorders a message; Redrive moves exactly the selected ones, with a fresh
// budget, and leaves the rest in place and in order.
func TestDeadLettersListAndRedrive(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "dead"}))
	const n = 30
	msgs := make([]Outgoing, n)
	want := make([]string, n)
	for i := range msgs {
		want[i] = fmt.Sprintf("dl-%02d", i)
		msgs[i] = Outgoing{ID: want[i], Body: []byte(want[i]), Headers: map[string]any{"tenant": "acme"}}
	}
	// One handler, so the DLQ fills in publish order.
	stop := tb.consume(t, "dead", 1, func(_ context.Context, m *Message) Result {
		return Reject(fmt.Errorf("bad %s", m.ID))
	})
	for i, err := range tb.b.PublishAll(tb.ctx, "dead", msgs) {
		require.NoError(t, err, "message %d", i)
	}
	require.Eventually(t, func() bool { return tb.b.Counters("dead").DeadLettered == n }, waitFor, 10*time.Millisecond)
	stop()
	dlq := tb.b.QueueName("dead") + ".dlq"

	for i := range 25 {
		limit := 10
		if i%5 == 4 {
			limit = 100 // the whole DLQ now and then
		}
		dls, err := tb.b.DeadLetters(tb.ctx, "dead", limit)
		require.NoError(t, err)
		require.Equal(t, want[:min(limit, n)], ids(dls), "listing %d", i+1)
	}
	// The listings above already saw all n, in order. The depth is eventual: a classic queue
	// answers queue.declare's message count with priority over the requeue a listing ended with.
	require.Eventually(t, func() bool { return tb.depth(t, dlq) == n }, waitFor, 5*time.Millisecond, "nothing lost by listing")

	dls, err := tb.b.DeadLetters(tb.ctx, "dead", 1)
	require.NoError(t, err)
	dl := dls[0]
	assert.Equal(t, []byte("dl-00"), dl.Body)
	assert.Equal(t, deadReasonRejected, dl.Reason)
	assert.Equal(t, "bad dl-00", dl.LastError)
	assert.Equal(t, 1, dl.Attempts)
	assert.Equal(t, tb.b.QueueName("dead"), dl.SourceQueue)
	assert.WithinDuration(t, time.Now(), dl.DeadAt, time.Minute)
	assert.Equal(t, dl.DeadAt, dl.FirstFailureAt, "rejected on its first delivery")
	assert.Equal(t, dl.DeadAt, dl.LastFailureAt)
	assert.Equal(t, "acme", dl.Headers["tenant"])
	assert.NotContains(t, dl.Headers, hdrPublishTag)
	_, err = tb.b.DeadLetters(tb.ctx, "dead", 0)
	assert.Error(t, err)

	// Redrive three of them (and one id that is not there).
	moved, err := tb.b.Redrive(tb.ctx, "dead", []string{"dl-03", "dl-17", "dl-29", "no-such-id"})
	require.NoError(t, err)
	assert.Equal(t, 3, moved)
	rest := make([]string, 0, n-3)
	for _, id := range want {
		if id != "dl-03" && id != "dl-17" && id != "dl-29" {
			rest = append(rest, id)
		}
	}
	dls, err = tb.b.DeadLetters(tb.ctx, "dead", 100)
	require.NoError(t, err)
	assert.Equal(t, rest, ids(dls), "the others stay, in order")
	assert.EqualValues(t, 3, tb.b.Counters("dead").Redriven)

	for _, id := range []string{"dl-03", "dl-17", "dl-29"} {
		d := tb.getOne(t, tb.b.QueueName("dead"))
		assert.Equal(t, id, d.MessageId)
		assert.Equal(t, []byte(id), d.Body)
		assert.Equal(t, "acme", d.Headers["tenant"], "application headers survive")
		for k := range bookkeeping {
			if k != hdrPublishTag && k != hdrRedriven {
				assert.NotContains(t, d.Headers, k, "a fresh budget: %s stripped", k)
			}
		}
		assert.Equal(t, 1, attemptOf(d.Headers))
		assert.Equal(t, 1, redrivenOf(d.Headers), "the redrive is counted")
	}

	moved, err = tb.b.Redrive(tb.ctx, "dead", nil)
	require.NoError(t, err)
	assert.Equal(t, n-3, moved)
	assert.Equal(t, 0, tb.depth(t, dlq))
	assert.Equal(t, n-3, tb.depth(t, tb.b.QueueName("dead")))

	_, err = tb.b.DeadLetters(tb.ctx, "never-declared", 10)
	assert.ErrorContains(t, err, "NOT_FOUND")
}

// TestFailLevelsThenDLQThenRedrive: Fail walks the delay levels in order (time-scaled), then the
// message is dead-lettered with its history; Redrive gives it a fresh budget, so it walks every
// level again before it is dead-lettered a second time.
func TestFailLevelsThenDLQThenRedrive(t *testing.T) {
	t.Parallel()
	tb := setup(t, 0.1)
	delays := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} // scaled: 100, 200, 400 ms
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "levels", Retry: RetryPolicy{Delays: delays}}))
	type call struct {
		attempt int
		at      time.Time
	}
	var mu sync.Mutex
	var calls []call
	tb.consume(t, "levels", 2, func(_ context.Context, m *Message) Result {
		mu.Lock()
		calls = append(calls, call{m.Attempt, time.Now()})
		mu.Unlock()
		return Fail(fmt.Errorf("attempt %d failed", m.Attempt))
	})
	require.NoError(t, tb.b.Publish(tb.ctx, "levels", Outgoing{ID: "m-levels"}))

	checkPass := func(pass int) {
		t.Helper()
		require.Eventually(t, func() bool { return tb.b.Counters("levels").DeadLettered == uint64(pass) }, waitFor, 10*time.Millisecond)
		dls, err := tb.b.DeadLetters(tb.ctx, "levels", 10)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		dl := dls[0]
		assert.Equal(t, "m-levels", dl.ID)
		assert.Equal(t, deadReasonExhausted, dl.Reason)
		assert.Equal(t, 4, dl.Attempts)
		assert.Equal(t, "attempt 4 failed", dl.LastError)
		assert.Less(t, dl.FirstFailureAt, dl.LastFailureAt)
		assert.Equal(t, pass-1, dl.Redriven, "x-redriven counts the redrives, through retries and dead-lettering")
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, calls, 4*pass)
		own := calls[4*(pass-1):]
		for i, c := range own {
			assert.Equal(t, i+1, c.attempt, "pass %d", pass)
		}
		// Lower bounds only (the holding queue's TTL is the least a retry waits), in whole
		// milliseconds like the broker's clock.
		for i := 1; i < 4; i++ {
			gap := own[i].at.Sub(own[i-1].at)
			scaled := time.Duration(float64(delays[i-1]) * 0.1)
			t.Logf("pass %d: gap before attempt %d: %v (level %v)", pass, i+1, gap, scaled)
			assert.GreaterOrEqual(t, gap, scaled-2*time.Millisecond, "pass %d, attempt %d", pass, i+1)
		}
	}
	checkPass(1)
	moved, err := tb.b.Redrive(tb.ctx, "levels", nil)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	checkPass(2)
	moved, err = tb.b.Redrive(tb.ctx, "levels", nil)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	checkPass(3)
	c := tb.b.Counters("levels")
	assert.EqualValues(t, 9, c.Retried)
	assert.EqualValues(t, 2, c.Redriven)
	assert.Zero(t, c.Lost+c.Requeued+c.Superseded+c.Rejected)
	assert.ElementsMatch(t, []string{
		tb.b.QueueName("levels") + ".retry.100ms",
		tb.b.QueueName("levels") + ".retry.200ms",
		tb.b.QueueName("levels") + ".retry.400ms",
	}, tb.b.declared()[0].queues()[2:])
}

// TestDeclareOverOldQuorumDLQ: a DLQ left by an older version of the port (a quorum queue) cannot
// be turned into a classic one: Declare fails with a 406 that says which queue and why.
func TestDeclareOverOldQuorumDLQ(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	dlq := tb.b.QueueName("old") + ".dlq"
	_, err := tb.ch.QueueDeclare(dlq, true, false, false, false, quorumArgs(nil))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := tb.ch.QueueDelete(dlq, false, false, false)
		assert.NoError(t, err)
	})
	err = tb.b.Declare(tb.ctx, Route{Name: "old"})
	require.Error(t, err)
	t.Log(err)
	assert.ErrorContains(t, err, dlq)
	assert.ErrorContains(t, err, "PRECONDITION_FAILED")
	assert.ErrorContains(t, err, "exists with other arguments")
}

// TestQuorumRequeueGoesToBack re-checks the broker fact that makes DLQs classic (see dlqArgs): a
// quorum queue serves requeued messages first, in the order they were requeued, so once a listing
// has fetched and requeued the whole queue, listing its head rotates it. A classic queue puts a
// requeued message back in place.
func TestQuorumRequeueGoesToBack(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	for _, tc := range []struct {
		args amqp.Table
		want []string
		// what x-delivery-count says of message 0 after two requeues: a quorum queue counts
		// them, toward x-delivery-limit
		count any
	}{
		{quorumArgs(nil), []string{"2", "3", "0", "1"}, int64(2)},
		{dlqArgs(), []string{"0", "1", "2", "3"}, nil},
	} {
		q := tb.b.QueueName("requeue-" + tc.args["x-queue-type"].(string))
		_, err := tb.ch.QueueDeclare(q, true, false, false, false, tc.args)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := tb.ch.QueueDelete(q, false, false, false)
			assert.NoError(t, err)
		})
		for i := range 4 {
			require.NoError(t, tb.ch.Publish("", q, false, false, amqp.Publishing{MessageId: fmt.Sprint(i)}))
		}
		require.Eventually(t, func() bool { return tb.depth(t, q) == 4 }, waitFor, 5*time.Millisecond)
		list := func(n int) {
			var last uint64
			for range n {
				d, ok, err := tb.ch.Get(q, false)
				require.NoError(t, err)
				require.True(t, ok)
				last = d.DeliveryTag
			}
			require.NoError(t, tb.ch.Nack(last, true, true))
		}
		list(4) // the whole queue
		list(2) // its head
		var got []string
		for range 4 {
			d, ok, err := tb.ch.Get(q, true)
			require.NoError(t, err)
			require.True(t, ok)
			got = append(got, d.MessageId)
			if d.MessageId == "0" {
				assert.EqualValues(t, tc.count, d.Headers["x-delivery-count"], "%v", tc.args)
			}
		}
		assert.Equal(t, tc.want, got, "%v", tc.args)
	}
}
