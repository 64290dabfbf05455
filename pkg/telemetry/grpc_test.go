package telemetry

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
)

// enableForTest turns tracing on in this process with an in-memory exporter, as Setup would with
// an OTLP one, until the test ends.
func enableForTest(t *testing.T) *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(Propagator())
	enabled.Store(true)
	t.Cleanup(func() {
		enabled.Store(false)
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	})
	return exp
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

const callerTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// A call served in process (the gateway's REST face) records a server span in the caller's trace
// (its traceparent forwarded as metadata), named after the method, with the request's execution
// id and attempt; a refusal of the request is not the server's error.
func TestInProcessServerSpan(t *testing.T) {
	exp := enableForTest(t)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", callerTraceparent))
	var inHandler trace.SpanContext
	_, err := InProcessServer()(ctx, &settlementv1.SettleRequest{ExecutionId: "exec-1", Attempt: 2},
		&grpc.UnaryServerInfo{FullMethod: "/integrations.settlement.v1.SettlementService/Settle"},
		func(ctx context.Context, _ any) (any, error) {
			inHandler = trace.SpanContextFromContext(ctx)
			return nil, status.Error(codes.InvalidArgument, "bad")
		})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	spans := exp.GetSpans()
	require.Len(t, spans, 1)
	s := spans[0]
	assert.Equal(t, "integrations.settlement.v1.SettlementService/Settle", s.Name)
	assert.Equal(t, trace.SpanKindServer, s.SpanKind)
	assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", s.SpanContext.TraceID().String(), "the caller's trace")
	assert.Equal(t, "b7ad6b7169203331", s.Parent.SpanID().String(), "the caller's span is the parent")
	assert.Equal(t, s.SpanContext.SpanID(), inHandler.SpanID(), "the handler runs under the span")
	a := attrs(s.Attributes)
	assert.Equal(t, "exec-1", a[ExecutionIDKey])
	assert.Equal(t, "2", a[AttemptKey])
	assert.Equal(t, "InvalidArgument", a["rpc.response.status_code"])
	assert.NotEqual(t, "Error", s.Status.Code.String(), "a refused request is the caller's error")
}

type settleServer struct {
	settlementv1.UnimplementedSettlementServiceServer
	seen trace.SpanContext
}

func (s *settleServer) Settle(ctx context.Context, _ *settlementv1.SettleRequest) (*settlementv1.SettleResponse, error) {
	s.seen = trace.SpanContextFromContext(ctx)
	return &settlementv1.SettleResponse{}, nil
}

// On, a call between two services is a client span and a server span in the caller's trace, both
// naming the request's execution and attempt; health checks are left out.
func TestGRPCSpansOn(t *testing.T) {
	exp := enableForTest(t)
	impl := &settleServer{}
	srv := grpc.NewServer(ServerOption())
	settlementv1.RegisterSettlementServiceServer(srv, impl)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), DialOption())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Empty(t, exp.GetSpans(), "health checks are no hop of anything")

	ctx, parent := otel.Tracer("test").Start(context.Background(), "caller")
	_, err = settlementv1.NewSettlementServiceClient(conn).Settle(ctx, &settlementv1.SettleRequest{ExecutionId: "exec-2", Attempt: 3})
	require.NoError(t, err)
	parent.End()
	srv.GracefulStop() // the server span ends with the call's stats, after the client has its answer

	byKind := map[trace.SpanKind]sdktrace.ReadOnlySpan{}
	for _, s := range exp.GetSpans() {
		if s.Name != "caller" {
			byKind[s.SpanKind] = s.Snapshot()
		}
	}
	require.Len(t, byKind, 2, "a client and a server span")
	client, server := byKind[trace.SpanKindClient], byKind[trace.SpanKindServer]
	require.NotNil(t, client)
	require.NotNil(t, server)
	assert.Equal(t, parent.SpanContext().TraceID(), client.SpanContext().TraceID())
	assert.Equal(t, parent.SpanContext().SpanID(), client.Parent().SpanID())
	assert.Equal(t, client.SpanContext().SpanID(), server.Parent().SpanID(), "the server continues the client's span")
	assert.Equal(t, server.SpanContext().SpanID(), impl.seen.SpanID(), "the handler runs under the server span")
	for _, s := range []sdktrace.ReadOnlySpan{client, server} {
		a := attrs(s.Attributes())
		assert.Equal(t, "exec-2", a[ExecutionIDKey], "%v span", s.SpanKind())
		assert.Equal(t, "3", a[AttemptKey], "%v span", s.SpanKind())
	}
}

// Off, tracing costs a call without a trace context no allocation, on the server or the client
// (the wrapped interceptors are no level of a chain of their own): the platform's hot path is
// benchmarked.
func TestOffCostsNoAllocationWithoutATrace(t *testing.T) {
	clearEnv(t)
	_, err := Setup(context.Background(), "test", zap.NewNop())
	require.NoError(t, err)
	require.False(t, Enabled())
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer x", "content-type", "application/grpc"))
	info := &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	outermost := WrapServer(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	})
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = outermost(ctx, nil, info, handler) }), "server side, no traceparent")
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	client := WrapClient(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = client(context.Background(), "/x.v1.S/M", nil, nil, nil, invoker) }), "client side, no span context")
}

// Off, the platform's own spans cost their hops nothing either: Start and Annotate, called with
// attributes on every accept, dispatch, attempt, relay and delivery, allocate nothing (the
// attributes' variadic slice stays on the caller's stack). A span context passes on as it came.
func TestOffStartAndAnnotateAllocateNothing(t *testing.T) {
	require.False(t, Enabled())
	ctx := WithTraceparent(context.Background(), callerTraceparent, "")
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		c, span := Start(ctx, "dispatch", trace.SpanKindProducer, ExecutionID("exec-1"), Attempt(2))
		Annotate(c, ExecutionID("exec-1"), EventID("ev-1"))
		span.End()
	}))
	c, _ := Start(ctx, "dispatch", trace.SpanKindProducer, ExecutionID("exec-1"))
	assert.Equal(t, trace.SpanContextFromContext(ctx), trace.SpanContextFromContext(c))
}
