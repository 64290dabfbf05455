package telemetry

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// The platform passes no baggage on: not a caller's (a public client's, which would reach the
// adapters, third parties, and every internal hop), not its own. Incoming baggage is not read;
// a context carrying some sends none on a call or a message, with tracing off or on.
func TestNoBaggageCrossesThePlatform(t *testing.T) {
	incoming := metadata.NewIncomingContext(context.Background(), metadata.Pairs(
		"traceparent", callerTraceparent, "baggage", "user.id=alice,tenant=acme"))
	ctx := FromIncoming(incoming)
	require.True(t, trace.SpanContextFromContext(ctx).IsValid(), "the trace is taken")
	assert.Zero(t, baggage.FromContext(ctx).Len(), "the caller's baggage is not")

	m, err := baggage.NewMember("internal.secret", "s3cr3t")
	require.NoError(t, err)
	b, err := baggage.New(m)
	require.NoError(t, err)
	ctx = baggage.ContextWithBaggage(ctx, b)
	md, _ := metadata.FromOutgoingContext(injectOutgoing(ctx))
	assert.NotEmpty(t, md.Get("traceparent"), "the trace goes on")
	assert.Empty(t, md.Get("baggage"), "no baggage on an outgoing call")
	assert.NotContains(t, Propagator().Fields(), "baggage")
}

// A tracestate is bounded to the 512 characters W3C trace context asks a platform to pass on
// (entries over 128 characters dropped first, then from the end): a client may send 32 entries
// of 512 characters, which would be stored on two rows per execution and sent on every hop, and a
// webhook receiver's header limit (8 KiB in common proxies) would refuse every delivery.
func TestTracestateIsBounded(t *testing.T) {
	var entries []string
	entries = append(entries, "big="+strings.Repeat("b", 200)) // over 128: dropped first
	for i := range 31 {
		entries = append(entries, "k"+string(rune('a'+i%26))+string(rune('a'+i/26))+"="+strings.Repeat("v", 100))
	}
	huge := strings.Join(entries, ",")
	require.Greater(t, len(huge), 3000)
	sc := trace.SpanContextFromContext(WithTraceparent(context.Background(), callerTraceparent, huge))
	require.True(t, sc.IsValid())
	ts := sc.TraceState().String()
	assert.LessOrEqual(t, len(ts), maxTracestate)
	assert.Equal(t, strings.Join(entries[1:5], ","), ts, "the entry over 128 characters goes first, then entries from the end")

	small := "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	tp, got := Traceparent(WithTraceparent(context.Background(), callerTraceparent, small))
	assert.Equal(t, callerTraceparent, tp)
	assert.Equal(t, small, got, "a tracestate within the bound is kept whole")

	// Over gRPC metadata, as the gateway's callers send it.
	incoming := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", callerTraceparent, "tracestate", huge))
	_, stored := Traceparent(FromIncoming(incoming))
	assert.LessOrEqual(t, len(stored), maxTracestate, "what the accept stores on the row")
	assert.Equal(t, strings.Join(entries[1:5], ","), stored)
}
