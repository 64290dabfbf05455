package mq

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The port's chain around a handler: the delivery's trace context in the handler's context, the
// route's deadline, a panic turned into the panicked Result (logged with its stack), and every
// call timed by route and result — a panic as "panic".
func TestHandlerChain(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	p := &port{}
	var err error
	p.handlerSeconds, err = newHandlerSeconds(reg)
	require.NoError(t, err)
	core, logs := observer.New(zap.ErrorLevel)
	top := &topology{route: "chained", handlerTimeout: time.Minute}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	m := &Message{ID: "m", Attempt: 2, Headers: applicationHeaders(trace.ContextWithSpanContext(context.Background(), sc), Outgoing{})}

	var seen context.Context
	h := p.handlerChain(func(ctx context.Context, m *Message) Result {
		seen = ctx
		if m.ID == "boom" {
			panic("boom")
		}
		return Ack()
	}, top, zap.New(core))

	assert.Equal(t, "ack", h(context.Background(), m).String())
	assert.Equal(t, sc.TraceID(), trace.SpanContextFromContext(seen).TraceID(), "the delivery's trace")
	dl, ok := seen.Deadline()
	require.True(t, ok, "the route's timeout is the handler's deadline")
	assert.WithinDuration(t, time.Now().Add(time.Minute), dl, 10*time.Second)
	assert.Error(t, seen.Err(), "the deadline's context ends with the call")

	res := h(context.Background(), &Message{ID: "boom"})
	assert.Equal(t, outcomePanicked, res.outcome)
	assert.Equal(t, "panic", res.String())
	require.Len(t, logs.FilterMessage("mq handler panicked; requeueing").All(), 1)
	assert.Contains(t, logs.All()[0].ContextMap()["stack"], "TestHandlerChain")

	assert.Equal(t, 2, testutil.CollectAndCount(p.handlerSeconds), "one series per route and result")
	n, err := testutil.GatherAndCount(reg, "integrations_mq_handler_seconds")
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	// Without a route timeout the handler's context is the consumer's.
	h = p.handlerChain(func(ctx context.Context, _ *Message) Result { seen = ctx; return Ack() }, &topology{route: "r"}, zap.NewNop())
	h(context.Background(), &Message{})
	_, ok = seen.Deadline()
	assert.False(t, ok)
}

// A route's Timeout reaches its handler through the broker, and a handler cut off by it is
// retried (its Fail) like any other: the deadline is the handler's, not the consumer's.
func TestRouteTimeoutFailsTheHandlerNotTheConsumer(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	route := Route{Name: "slow", Timeout: 50 * time.Millisecond, Retry: RetryPolicy{Delays: []time.Duration{10 * time.Millisecond}}}
	require.NoError(t, tb.b.Declare(tb.ctx, route))
	attempts := make(chan int, 4)
	tb.consume(t, "slow", 1, func(ctx context.Context, m *Message) Result {
		attempts <- m.Attempt
		if m.Attempt == 1 {
			<-ctx.Done()
			return Fail(ctx.Err())
		}
		return Ack()
	})
	require.NoError(t, tb.b.Publish(tb.ctx, "slow", Outgoing{ID: "m-slow"}))
	assert.Equal(t, 1, receive(t, attempts, "first attempt"))
	assert.Equal(t, 2, receive(t, attempts, "the retry after the timeout"))
	require.Eventually(t, func() bool { return tb.b.Counters("slow").Acknowledged == 1 }, waitFor, 10*time.Millisecond)
	c := tb.b.Counters("slow")
	assert.EqualValues(t, 1, c.Retried)
	assert.Zero(t, c.Requeued)

	_, err := plan("s", 1, Route{Name: "bad", Timeout: -time.Second})
	assert.Error(t, err)
}
