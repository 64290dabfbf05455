package telemetry

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is the W3C trace context, and nothing else: what the platform's code injects and
// extracts on calls and messages whether or not Setup ran (a test, integrationsctl), so that
// passing a trace on never depends on a global having been set. Baggage is neither read nor
// passed on: the platform reads none, and a caller's (a public client's, through the gateway) or
// the platform's own would otherwise reach every internal hop and the adapters, third parties.
var propagator propagation.TextMapPropagator = w3c

// Propagator is the W3C trace context propagator the platform uses everywhere (gRPC metadata,
// message headers, rows, webhooks).
func Propagator() propagation.TextMapPropagator { return propagator }

// w3c is the W3C trace context with its tracestate bounded (boundedTraceContext).
var w3c = boundedTraceContext{}

// maxTracestate is the most of a tracestate the platform keeps: the 512 characters W3C trace
// context asks a platform to pass on at least. The SDK accepts 32 entries of up to 512
// characters (some 16 KiB) from any caller; kept whole, that would be stored on two rows per
// execution, sent on every hop, and refused by the header limits of common receivers (8 KiB in
// common proxies, 8 KiB of metadata in some gRPC stacks).
const maxTracestate = 512

// boundedTraceContext is propagation.TraceContext whose Extract cuts a tracestate over
// maxTracestate as the W3C recommendation says: entries over 128 characters first, then entries
// from the end.
type boundedTraceContext struct{ propagation.TraceContext }

func (p boundedTraceContext) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	out := p.TraceContext.Extract(ctx, c)
	if len(c.Get("tracestate")) <= maxTracestate {
		return out
	}
	sc := trace.SpanContextFromContext(out)
	if out == ctx || !sc.IsValid() {
		return out
	}
	return trace.ContextWithRemoteSpanContext(out, sc.WithTraceState(boundTraceState(sc.TraceState())))
}

// boundTraceState is ts cut to at most maxTracestate characters.
func boundTraceState(ts trace.TraceState) trace.TraceState {
	if len(ts.String()) <= maxTracestate {
		return ts
	}
	type entry struct{ key, value string }
	var entries []entry
	ts.Walk(func(k, v string) bool {
		if len(k)+1+len(v) <= 128 {
			entries = append(entries, entry{k, v})
		}
		return true
	})
	var b strings.Builder
	for _, e := range entries {
		n := len(e.key) + 1 + len(e.value)
		if b.Len() > 0 {
			n++
		}
		if b.Len()+n > maxTracestate {
			break
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.key + "=" + e.value)
	}
	out, err := trace.ParseTraceState(b.String())
	if err != nil {
		return trace.TraceState{} // the entries came from a parsed state: cannot happen
	}
	return out
}

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

// InjectHTTP writes ctx's W3C trace context (traceparent, tracestate) into an outgoing request's
// headers, e.g. a webhook's, so that the receiver can continue the trace; nothing when ctx has
// none. No baggage: the platform passes none on.
func InjectHTTP(ctx context.Context, h http.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}
