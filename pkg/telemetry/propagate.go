package telemetry

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is the W3C trace context and baggage: what the platform's code injects and extracts
// on calls and messages whether or not Setup ran (a test, integrationsctl), so that passing a
// trace on never depends on a global having been set. Setup also makes it the global one, for
// libraries that read that.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Propagator is the W3C trace context and baggage propagator the platform uses everywhere (gRPC
// metadata, message headers).
func Propagator() propagation.TextMapPropagator { return propagator }

// w3c is the W3C trace context alone: what a row stores. Baggage is not kept on rows: it is the
// caller's, and an execution outlives the call that made it.
var w3c = propagation.TraceContext{}

// Traceparent renders ctx's span context as W3C traceparent and tracestate values, to store on a
// row; both empty when ctx carries no valid span context (nothing to continue).
func Traceparent(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}

// WithTraceparent returns ctx carrying the remote span context that a stored traceparent (and
// tracestate) name, so that spans started from it — here or, through the headers, in the next
// service — continue that trace. An empty or malformed traceparent leaves ctx as it is: a row
// written before tracing, or by a caller that sent none, starts no trace of its own here.
func WithTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent, "tracestate": tracestate})
}

// SpanContextOf is the span context a stored traceparent (and tracestate) name; the zero
// SpanContext (not valid) for an empty or malformed one.
func SpanContextOf(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(WithTraceparent(context.Background(), traceparent, tracestate))
}

// InjectHTTP writes ctx's W3C trace context (traceparent, tracestate) into an outgoing request's
// headers, e.g. a webhook's, so that the receiver can continue the trace; nothing when ctx has
// none. Baggage is left out: it is the platform's callers', not the receiver's to read.
func InjectHTTP(ctx context.Context, h http.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}
