package mq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRetryFloorIsTheLeastTimeScalingLeaves(t *testing.T) {
	t.Parallel()
	r := Route{Name: "budget", Retry: RetryPolicy{
		Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}, MaxAttempts: 5, Floor: 5 * time.Second,
	}}
	top, err := plan("s", 0.001, r)
	require.NoError(t, err)
	// 1 s is below the floor: it keeps its own length; 5 s and 30 s are scaled down to the floor.
	assert.Equal(t, []time.Duration{time.Second, 5 * time.Second, 5 * time.Second}, top.retryTTLs)
	assert.Equal(t, []string{"s.budget.retry.1000ms", "s.budget.retry.5000ms"}, top.queues()[2:])

	delays, budget, err := RetryDelays(r, 0.001)
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second}, delays,
		"the last delay repeats up to MaxAttempts")
	assert.Equal(t, 16*time.Second, budget)

	// Unscaled, the floor changes nothing.
	_, budget, err = RetryDelays(r, 1)
	require.NoError(t, err)
	assert.Equal(t, 66*time.Second, budget)
	// Without a floor the scale goes all the way down: the chaos run's milliseconds.
	r.Retry.Floor = 0
	_, budget, err = RetryDelays(r, 0.001)
	require.NoError(t, err)
	assert.Equal(t, 66*time.Millisecond, budget)

	r.Retry.Floor = -time.Second
	_, err = plan("s", 1, r)
	assert.Error(t, err)
}

// errConnDead stands in for what a handler sees while its database is away.
var errConnDead = errors.New("read tcp 127.0.0.1:5432: connection reset by peer")

// A handler that cannot do its work for 2 s (its database reconnecting) is retried through the
// blip, not dead-lettered, in a run whose time scale would shrink its delays to milliseconds.
func TestRetryFloorOutlastsABlip(t *testing.T) {
	t.Parallel()
	tb := setup(t, 0.001)
	route := Route{Name: "blip", Retry: RetryPolicy{
		Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}, MaxAttempts: 4, Floor: 2 * time.Second,
	}}
	require.NoError(t, tb.b.Declare(tb.ctx, route))
	var (
		mu       sync.Mutex
		attempts []int
		blipEnds atomic.Int64
		acked    = make(chan struct{})
	)
	tb.consume(t, route.Name, 4, func(_ context.Context, m *Message) Result {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, m.Attempt)
		blipEnds.CompareAndSwap(0, time.Now().Add(2*time.Second).UnixNano())
		if time.Now().UnixNano() < blipEnds.Load() {
			return Fail(errConnDead)
		}
		close(acked)
		return Ack()
	})
	require.NoError(t, tb.b.Publish(tb.ctx, route.Name, Outgoing{ID: "blip-1"}))
	receive(t, acked, "the message handled after the blip")
	require.Eventually(t, func() bool { return tb.b.Counters(route.Name).Acknowledged == 1 }, waitFor, 5*time.Millisecond)
	c := tb.b.Counters(route.Name)
	assert.Zero(t, c.DeadLettered)
	assert.EqualValues(t, 2, c.Retried)
	mu.Lock()
	defer mu.Unlock()
	// 1 s (below the floor, unscaled), then 2 s (30 s scaled to the floor): acked on attempt 3.
	assert.Equal(t, []int{1, 2, 3}, attempts)
	assert.Zero(t, tb.depth(t, tb.b.QueueName(route.Name)+".dlq"))
}

func TestDiscardRemovesOnlyTheNamedDeadLetters(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	route := Route{Name: "discard"}
	require.NoError(t, tb.b.Declare(tb.ctx, route))
	dead := make(chan struct{}, 8)
	tb.consume(t, route.Name, 1, func(_ context.Context, m *Message) Result {
		defer func() { dead <- struct{}{} }()
		return Reject(fmt.Errorf("no %s", m.ID))
	})
	for _, id := range []string{"a", "b", "a", "c"} {
		require.NoError(t, tb.b.Publish(tb.ctx, route.Name, Outgoing{ID: id}))
	}
	require.Eventually(t, func() bool { return tb.b.Counters(route.Name).Rejected == 4 }, waitFor, 10*time.Millisecond)

	removed, err := tb.b.Discard(tb.ctx, route.Name, nil)
	require.NoError(t, err)
	assert.Zero(t, removed, "nothing is chosen by default")
	removed, err = tb.b.Discard(tb.ctx, route.Name, []string{"a", "zz"})
	require.NoError(t, err)
	assert.Equal(t, 2, removed, "both copies of a")
	dls, err := tb.b.DeadLetters(tb.ctx, route.Name, 10)
	require.NoError(t, err)
	assert.Equal(t, []string{"b", "c"}, ids(dls), "the rest in their order")
}
