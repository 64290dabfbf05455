package mq

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// subscribe runs Subscribe in the background like consume runs Consume.
func (tb *bundle) subscribe(t *testing.T, topic, sub string, h Handler) {
	t.Helper()
	ctx, cancel := context.WithCancel(tb.ctx)
	done := make(chan error, 1)
	go func() { done <- tb.b.Subscribe(ctx, topic, sub, 2, h) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "Subscribe")
		case <-time.After(waitFor):
			t.Error("Subscribe did not return after its context was cancelled")
		}
	})
}

// TestTopicFailingSubscriberDeadLettersAlone: a broadcast reaches both subscriptions; the one whose
// handler fails (Fail, then Reject) dead-letters each delivery after one attempt into its own DLQ
// only; the other handles every message and its DLQ stays empty. After the consuming connection
// dies, both subscriptions resume by themselves.
func TestTopicFailingSubscriberDeadLettersAlone(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	topic := "t-" + uuid.NewString()[:8] // exchanges are shared: a topic of the test's own
	require.NoError(t, tb.b.DeclareTopic(tb.ctx, topic, "good", "bad"))

	var mu sync.Mutex
	good := map[string]int{}
	bad := map[string]int{}
	tb.subscribe(t, topic, "good", func(_ context.Context, m *Message) Result {
		mu.Lock()
		defer mu.Unlock()
		good[m.ID]++
		assert.Equal(t, topic+".good", m.Route)
		return Ack()
	})
	tb.subscribe(t, topic, "bad", func(_ context.Context, m *Message) Result {
		mu.Lock()
		defer mu.Unlock()
		bad[m.ID]++
		if m.ID == "b-1" {
			return Fail(errors.New("transient, but topics do not retry"))
		}
		return Reject(errors.New("never"))
	})
	require.NoError(t, tb.b.PublishTopic(tb.ctx, topic, Outgoing{ID: "b-1", Body: []byte("one")}))
	require.NoError(t, tb.b.PublishTopic(tb.ctx, topic, Outgoing{ID: "b-2", Body: []byte("two")}))

	require.Eventually(t, func() bool {
		return tb.b.Counters(topic+".good").Acknowledged == 2 && tb.b.Counters(topic+".bad").DeadLettered == 2
	}, waitFor, 10*time.Millisecond)
	dls, err := tb.b.DeadLetters(tb.ctx, topic+".bad", 10)
	require.NoError(t, err)
	// Two handlers: the dead letters may arrive in either order.
	slices.SortFunc(dls, func(a, b DeadLetter) int { return strings.Compare(a.ID, b.ID) })
	require.Equal(t, []string{"b-1", "b-2"}, ids(dls))
	assert.Equal(t, deadReasonFailed, dls[0].Reason)
	assert.Equal(t, "transient, but topics do not retry", dls[0].LastError)
	assert.Equal(t, deadReasonRejected, dls[1].Reason)
	for _, dl := range dls {
		assert.Equal(t, 1, dl.Attempts)
		assert.Equal(t, tb.b.QueueName(topic+".bad"), dl.SourceQueue)
	}
	goodDLQ, err := tb.b.DeadLetters(tb.ctx, topic+".good", 10)
	require.NoError(t, err)
	assert.Empty(t, goodDLQ, "one subscriber's failure is not copied to the others")
	mu.Lock()
	assert.Equal(t, map[string]int{"b-1": 1, "b-2": 1}, good)
	assert.Equal(t, map[string]int{"b-1": 1, "b-2": 1}, bad, "one attempt each, no retry")
	mu.Unlock()
	assert.Equal(t, Counters{Published: 2, Confirmed: 2}, tb.b.Counters("topic:"+topic))
	c := tb.b.Counters(topic + ".bad")
	assert.EqualValues(t, 1, c.Rejected)
	assert.Zero(t, c.Retried+c.Acknowledged+c.Lost)

	// Cut the consuming connection: both subscriptions come back by themselves.
	tb.b.conSem <- struct{}{}
	require.NoError(t, tb.b.con.Close())
	<-tb.b.conSem
	require.NoError(t, tb.b.PublishTopic(tb.ctx, topic, Outgoing{ID: "b-3"}))
	require.Eventually(t, func() bool {
		return tb.b.Counters(topic+".good").Acknowledged == 3 && tb.b.Counters(topic+".bad").DeadLettered == 3
	}, waitFor, 10*time.Millisecond)

	// Redrive of a subscription's dead letter goes to that subscription alone.
	moved, err := tb.b.Redrive(tb.ctx, topic+".bad", []string{"b-1"})
	require.NoError(t, err)
	assert.Equal(t, 1, moved)
	require.Eventually(t, func() bool { return tb.b.Counters(topic+".bad").DeadLettered == 4 }, waitFor, 10*time.Millisecond)
	mu.Lock()
	assert.Equal(t, 2, bad["b-1"])
	assert.Equal(t, 1, good["b-1"], "not broadcast again")
	mu.Unlock()
}

// TestPublishTopicWithoutSubscribers: a broadcast nobody can receive is returned, not confirmed.
func TestPublishTopicWithoutSubscribers(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	topic := "t-" + uuid.NewString()[:8]
	t.Cleanup(func() { assert.NoError(t, tb.b.DeleteTopic(context.Background(), topic)) })
	err := tb.b.PublishTopic(tb.ctx, topic, Outgoing{ID: "lonely"})
	require.ErrorIs(t, err, ErrUnroutable)
	assert.Equal(t, Counters{Published: 1, Returned: 1}, tb.b.Counters("topic:"+topic))
	_, err = planSubscription("s", topic, "x.dlq")
	assert.ErrorIs(t, err, ErrInvalidName)
	_, err = planSubscription("s", "bad topic", "x")
	assert.ErrorIs(t, err, ErrInvalidName)
}
