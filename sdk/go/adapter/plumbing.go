package adapter

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// What the SDK needs of gRPC, OpenTelemetry and zap, with nothing of the platform's own packages:
// an adapter's module graph holds the SDK, the generated types and their libraries, no more.

// tracerName is the instrumentation scope of the SDK's spans.
const tracerName = "github.com/integrations-platform/integrations/sdk/go/adapter"

// The span attributes the platform's spans carry too, so that an execution's spans are found by
// its id across the platform and its adapters.
const (
	attrExecutionID = attribute.Key("integrations.execution_id")
	attrAttempt     = attribute.Key("integrations.attempt")
)

// startWork starts the span of Later work, a child of ctx's span, on the global tracer provider
// (a no-op one unless the adapter's program sets one).
func startWork(ctx context.Context, executionID string, attempt int32) (context.Context, trace.Span) {
	return otel.Tracer(tracerName).Start(ctx, "adapter.work", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrExecutionID.String(executionID), attrAttempt.Int(int(attempt))))
}

// w3c reads and writes the trace context the platform sends and expects: W3C traceparent and
// tracestate in the calls' metadata.
var w3c = propagation.TraceContext{}

// fromIncoming returns ctx carrying the trace context of its incoming gRPC metadata, when ctx has
// none yet: an adapter served by a plain grpc.Server without tracing interceptors continues its
// caller's trace all the same.
func fromIncoming(ctx context.Context) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	carrier := propagation.MapCarrier{}
	for _, k := range w3c.Fields() {
		if v := md.Get(k); len(v) > 0 {
			carrier[k] = v[0]
		}
	}
	if len(carrier) == 0 {
		return ctx
	}
	return w3c.Extract(ctx, carrier)
}

// withTraceparent returns ctx whose outgoing metadata carries ctx's trace context, so that the
// platform's spans of a callback continue the attempt's trace (whatever the adapter's own
// tracing setup). A client that injects it too (a tracing interceptor) sets the same values.
func withTraceparent(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	if md == nil {
		md = metadata.MD{}
	}
	for k, v := range carrier {
		md.Set(k, v) // replaces a traceparent the context carried already
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// dial is the client connection to the callback service. Connections are lazy; reconnection
// backs off from 100 ms to at most 5 s (gRPC's default grows to 2 minutes, which would keep the
// callbacks of an adapter whose platform restarted failing long after it is back). Without
// transport credentials in opts the connection is plaintext, as on a cluster's network behind a
// mesh; give TLS credentials in Options.DialOptions otherwise.
func dial(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, opts...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", target, err)
	}
	return conn, nil
}

// The log fields of the SDK's lines, named as the platform's logs name them.
func logExecutionID(id string) zap.Field { return zap.String("execution_id", id) }
func logAttempt(n int32) zap.Field       { return zap.Int32("attempt", n) }

// truncate cuts s, made valid UTF-8 without NULs, to at most n bytes at a character boundary: for
// texts an unauthenticated caller chose, or a peer's error, before they are logged or sent on.
func truncate(s string, n int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
