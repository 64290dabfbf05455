package mq

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/integrations-platform/integrations/pkg/telemetry"
)

// Trace context travels in the message's headers as W3C traceparent and tracestate,
// written by the platform's propagator (telemetry.Propagator): a publish writes the trace of the
// message's SpanContext or of the publish's ctx, a consume gives the handler a context carrying
// it. The port starts no span of its own (a handler knows what the message is about and starts
// its own). The headers are application headers: retry, deferral and dead-letter copies keep
// them, so a retried message stays in its trace.
const hdrTraceparent = "traceparent"

// injectTrace writes the trace context of sc, or else of ctx, into h; nothing when neither
// carries a valid one.
func injectTrace(ctx context.Context, sc trace.SpanContext, h map[string]any) {
	if sc.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, sc)
	} else if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	// A republished message's headers may hold another trace's context (and baggage, from before
	// the platform stopped passing it on): the message carries one trace's, whole.
	for _, k := range []string{hdrTraceparent, "tracestate", "baggage"} {
		delete(h, k)
	}
	telemetry.Propagator().Inject(ctx, tableCarrier(h))
}

// extractTrace returns ctx carrying the trace context of a delivery's headers; ctx itself when
// the delivery carries none (no lookup beyond the one header).
func extractTrace(ctx context.Context, h map[string]any) context.Context {
	if _, ok := h[hdrTraceparent]; !ok {
		return ctx
	}
	return telemetry.Propagator().Extract(ctx, tableCarrier(h))
}

// tableCarrier is a header table as a propagation.TextMapCarrier. AMQP long strings arrive as
// string or, from some clients, as bytes.
type tableCarrier map[string]any

func (c tableCarrier) Get(key string) string {
	switch v := c[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

func (c tableCarrier) Set(key, value string) { c[key] = value }

func (c tableCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
