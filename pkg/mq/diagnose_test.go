package mq

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestDiagnoseRoundTrip: a second Broker of the same scope (another process, as far as the broker
// can tell) diagnoses a route another Broker consumes: the consumer answers the probe, the handler
// never sees it, and nothing is counted.
func TestDiagnoseRoundTrip(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	route := Route{Name: "diag", Retry: RetryPolicy{Delays: []time.Duration{time.Second, time.Minute}}}
	require.NoError(t, tb.b.Declare(tb.ctx, route))
	var calls atomic.Int32
	tb.consume(t, "diag", 2, func(context.Context, *Message) Result {
		calls.Add(1)
		return Ack()
	})
	// One ordinary message first, so that the consumer's counters are not all zero.
	require.NoError(t, tb.b.Publish(tb.ctx, "diag", Outgoing{ID: "warm"}))
	require.Eventually(t, func() bool { return tb.b.Counters("diag").Acknowledged == 1 }, waitFor, 10*time.Millisecond)
	other, err := Dial(tb.ctx, Config{URL: testURL(), Scope: tb.b.cfg.Scope, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, other.Close()) })

	// The consumer may not have subscribed yet: a FAIL then is not what this test is about.
	var d Diagnosis
	require.Eventually(t, func() bool {
		d = other.Diagnose(tb.ctx, []Route{route}, 5*time.Second)[0]
		return d.Consumers == 1
	}, waitFor, 20*time.Millisecond)
	t.Log(d.String())
	require.True(t, d.OK, d.String())
	assert.Empty(t, d.Problems)
	assert.Positive(t, d.RoundTrip)
	assert.Zero(t, d.Messages)
	assert.Zero(t, d.DLQ)
	assert.True(t, strings.HasPrefix(d.String(), "diag ok round_trip="), d.String())
	// The counters are the answering consumer's, not the diagnosing broker's (which has none).
	assert.Equal(t, processName, d.AnsweredBy)
	assert.Equal(t, tb.b.Counters("diag"), d.Counters)
	assert.Equal(t, uint64(1), d.Counters.Acknowledged)
	assert.Contains(t, d.String(), " answered_by="+processName+" consumers=1 messages=0 dlq=0 published=1 confirmed=1 ")

	require.Eventually(t, func() bool { return tb.depth(t, tb.b.QueueName("diag")) == 0 }, waitFor, 10*time.Millisecond,
		"the probe was acked")
	assert.Equal(t, int32(1), calls.Load(), "the handler never sees a probe")
	assert.Equal(t, uint64(1), tb.b.Counters("diag").Acknowledged, "probes are not counted")
	// An application cannot publish a probe by accident: the header is the port's.
	require.NoError(t, tb.b.Publish(tb.ctx, "diag", Outgoing{ID: "app", Headers: map[string]any{hdrProbe: "x"}}))
	require.Eventually(t, func() bool { return calls.Load() == 2 }, waitFor, 10*time.Millisecond)
}

// TestDiagnoseFailures: no consumer, a deleted holding queue, and a route that was never declared
// each fail, saying what is wrong.
func TestDiagnoseFailures(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	idle := Route{Name: "idle"}
	holed := Route{Name: "holed", Retry: RetryPolicy{Delays: []time.Duration{time.Second, time.Minute}}}
	ghost := Route{Name: "ghost", Retry: RetryPolicy{Delays: []time.Duration{time.Second}}}
	require.NoError(t, tb.b.Declare(tb.ctx, idle, holed))
	tb.consume(t, "holed", 1, func(context.Context, *Message) Result { return Ack() })
	require.Eventually(t, func() bool {
		return tb.b.Diagnose(tb.ctx, []Route{holed}, 5*time.Second)[0].OK
	}, waitFor, 20*time.Millisecond, "the route is healthy before a holding queue goes")
	missing := tb.b.QueueName("holed") + ".retry.60000ms"
	tb.dlxGrace()
	_, err := tb.ch.QueueDelete(missing, false, false, false)
	require.NoError(t, err)

	ds := tb.b.Diagnose(tb.ctx, []Route{idle, holed, ghost}, 300*time.Millisecond)
	for _, d := range ds {
		t.Log(d.String())
		assert.False(t, d.OK, d.Route)
		assert.Contains(t, d.String(), d.Route+" FAIL: ")
	}
	assert.Equal(t, []string{"no consumer answered within 300ms"}, ds[0].Problems)
	assert.Equal(t, []string{"holding queue " + missing + " missing"}, ds[1].Problems)
	assert.Positive(t, ds[1].RoundTrip, "the round trip itself works")
	q := tb.b.QueueName("ghost")
	assert.Equal(t, []string{
		"work queue " + q + " missing",
		"holding queue " + q + ".retry.1000ms missing",
		"dead-letter queue " + q + ".dlq missing",
	}, ds[2].Problems)
}
