package mq

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A publish carries the trace of its ctx, or of each message's SpanContext, in the message's
// headers; the handler's context continues it, across a retry copy too; a message published
// outside any trace reaches its handler outside any trace. Spans go to an in-memory exporter.
func TestTraceContextAcrossTheBroker(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("mq-test")

	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "traced", Retry: RetryPolicy{Delays: []time.Duration{50 * time.Millisecond}}}))
	type handled struct {
		id      string
		attempt int
		parent  trace.SpanContext
	}
	got := make(chan handled, 10)
	tb.consume(t, "traced", 2, func(ctx context.Context, m *Message) Result {
		got <- handled{id: m.ID, attempt: m.Attempt, parent: trace.SpanContextFromContext(ctx)}
		_, span := tracer.Start(ctx, "handle", trace.WithAttributes(attribute.String("message", m.ID), attribute.Int("attempt", m.Attempt)))
		span.End()
		if m.ID == "from-ctx" && m.Attempt == 1 {
			return Fail(errors.New("transient"))
		}
		return Ack()
	})

	// One message in the trace of the publish's ctx.
	ctx, publish := tracer.Start(tb.ctx, "publish")
	require.NoError(t, tb.b.Publish(ctx, "traced", Outgoing{ID: "from-ctx"}))
	publish.End()
	// Two in traces of their own, named per message, in one publish outside any trace.
	_, a := tracer.Start(context.Background(), "a")
	a.End()
	_, b := tracer.Start(context.Background(), "b")
	b.End()
	for _, err := range tb.b.PublishAll(tb.ctx, "traced", []Outgoing{
		{ID: "per-message-a", SpanContext: a.SpanContext()},
		{ID: "per-message-b", SpanContext: b.SpanContext()},
		{ID: "untraced"},
	}) {
		require.NoError(t, err)
	}

	byKey := map[string]handled{}
	for range 5 {
		h := receive(t, got, "a delivery")
		byKey[h.id+"#"+string(rune('0'+h.attempt))] = h
	}
	require.Len(t, byKey, 5)
	for _, key := range []string{"from-ctx#1", "from-ctx#2"} {
		h := byKey[key]
		assert.Equal(t, publish.SpanContext().TraceID(), h.parent.TraceID(), key)
		assert.Equal(t, publish.SpanContext().SpanID(), h.parent.SpanID(), "%s: the publishing span is the handler's parent, the retry copy's too", key)
		assert.True(t, h.parent.IsRemote(), key)
	}
	assert.Equal(t, a.SpanContext().TraceID(), byKey["per-message-a#1"].parent.TraceID())
	assert.Equal(t, b.SpanContext().TraceID(), byKey["per-message-b#1"].parent.TraceID())
	assert.False(t, byKey["untraced#1"].parent.IsValid(), "no trace made up for a message published outside one")

	// The handlers' spans, as exported, sit in the publishers' traces.
	require.Eventually(t, func() bool { return len(exp.GetSpans()) >= 3+5 }, waitFor, 10*time.Millisecond)
	children := 0
	for _, s := range exp.GetSpans() {
		if s.Name == "handle" && s.Parent.SpanID() == publish.SpanContext().SpanID() {
			assert.Equal(t, publish.SpanContext().TraceID(), s.SpanContext.TraceID())
			children++
		}
	}
	assert.Equal(t, 2, children, "both attempts of the retried message are children of its publish")
}

// A delivery without trace headers costs its handler no allocation for tracing.
func TestExtractTraceWithoutHeadersAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	h := map[string]any{"x-delivery-attempt": int32(2), "k": "v"}
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = extractTrace(ctx, h) }))
	tbl := amqp.Table{"k": "v"}
	assert.Zero(t, testing.AllocsPerRun(100, func() { injectTrace(ctx, trace.SpanContext{}, tbl) }), "nor a publish outside any trace")
}

// A message republished with the headers it was consumed with (Outgoing.Headers) in another
// trace carries that trace whole: no tracestate of the old one beside the new traceparent. One
// republished outside any trace keeps its own.
func TestRepublishedMessageCarriesOneTraceContext(t *testing.T) {
	old := map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "old=1", "baggage": "a=b", "k": "v"}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})

	h := applicationHeaders(context.Background(), Outgoing{ID: "m", Headers: old, SpanContext: sc})
	assert.Equal(t, "00-01000000000000000000000000000000-0200000000000000-01", h["traceparent"])
	assert.NotContains(t, h, "tracestate", "the old trace's tracestate is not the new one's")
	assert.NotContains(t, h, "baggage")
	assert.Equal(t, "v", h["k"])

	h = applicationHeaders(context.Background(), Outgoing{ID: "m", Headers: old})
	assert.Equal(t, old["traceparent"], h["traceparent"], "outside any trace, the message keeps its own")
	assert.Equal(t, "old=1", h["tracestate"])
}
