package telemetry

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	collectorv1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestReadSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		on      bool
		proto   string
		wantErr string
	}{
		{name: "nothing set: off", env: nil},
		{name: "an endpoint: on, over http/protobuf by default", env: map[string]string{envEndpoint: "http://collector:4318"}, on: true, proto: "http/protobuf"},
		{name: "a traces endpoint alone", env: map[string]string{envTracesEndpoint: "http://collector:4318/v1/traces"}, on: true, proto: "http/protobuf"},
		{name: "grpc", env: map[string]string{envEndpoint: "http://collector:4317", envProtocol: "grpc"}, on: true, proto: "grpc"},
		{name: "the traces protocol wins", env: map[string]string{envEndpoint: "http://collector:4318", envProtocol: "http/protobuf", envTracesProtocol: "grpc"}, on: true, proto: "grpc"},
		{name: "disabled wins over an endpoint", env: map[string]string{envEndpoint: "http://collector:4318", envDisabled: "true"}},
		{name: "disabled false", env: map[string]string{envEndpoint: "http://collector:4318", envDisabled: "false"}, on: true, proto: "http/protobuf"},
		{name: "exporter none", env: map[string]string{envEndpoint: "http://collector:4318", envExporter: "none"}},
		{name: "a protocol it cannot speak", env: map[string]string{envEndpoint: "http://collector:4318", envProtocol: "http/json"}, wantErr: envProtocol},
		{name: "a misspelt disabled", env: map[string]string{envDisabled: "yes"}, wantErr: envDisabled},
		{name: "an exporter it has not", env: map[string]string{envExporter: "zipkin"}, wantErr: envExporter},
		{name: "an unknown sampler", env: map[string]string{envEndpoint: "http://collector:4318", envSampler: "sometimes"}, wantErr: envSampler},
		{name: "a known sampler", env: map[string]string{envEndpoint: "http://collector:4318", envSampler: "parentbased_traceidratio"}, on: true, proto: "http/protobuf"},
		{name: "a sampler in capitals, as the SDK reads it", env: map[string]string{envEndpoint: "http://collector:4318", envSampler: "ParentBased_Always_On"}, on: true, proto: "http/protobuf"},
		{name: "a ratio", env: map[string]string{envEndpoint: "http://collector:4318", envSampler: "traceidratio", envSamplerArg: "0.01"}, on: true, proto: "http/protobuf"},
		// The SDK would log these and sample everything: an operator asking for 1% gets 100%.
		{name: "a ratio as a percentage", env: map[string]string{envEndpoint: "http://collector:4318", envSampler: "parentbased_traceidratio", envSamplerArg: "1%"}, wantErr: envSamplerArg},
		{name: "a ratio over one", env: map[string]string{envEndpoint: "http://collector:4318", envSampler: "traceidratio", envSamplerArg: "5"}, wantErr: envSamplerArg},
		// The exporter would log these and send to localhost, or over TLS to a plaintext collector.
		{name: "an endpoint without a scheme", env: map[string]string{envEndpoint: "collector:4317", envProtocol: "grpc"}, wantErr: envEndpoint},
		{name: "an endpoint that is no URL", env: map[string]string{envEndpoint: "http://[::1"}, wantErr: envEndpoint},
		{name: "a traces endpoint of another scheme", env: map[string]string{envTracesEndpoint: "ftp://collector/v1/traces"}, wantErr: envTracesEndpoint},
		{name: "https", env: map[string]string{envEndpoint: "https://collector:4318"}, on: true, proto: "http/protobuf"},
		{name: "insecure not a boolean", env: map[string]string{envEndpoint: "http://collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "yes"}, wantErr: "OTEL_EXPORTER_OTLP_INSECURE"},
		{name: "insecure in capitals", env: map[string]string{envEndpoint: "http://collector:4317", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "TRUE"}, on: true, proto: "http/protobuf"},
		// The SDK reads milliseconds as an integer and ignores anything else.
		{name: "a timeout with a unit", env: map[string]string{envEndpoint: "http://collector:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, wantErr: "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{name: "a schedule delay with a unit", env: map[string]string{envEndpoint: "http://collector:4318", "OTEL_BSP_SCHEDULE_DELAY": "5s"}, wantErr: "OTEL_BSP_SCHEDULE_DELAY"},
		{name: "a queue size of zero", env: map[string]string{envEndpoint: "http://collector:4318", "OTEL_BSP_MAX_QUEUE_SIZE": "0"}, wantErr: "OTEL_BSP_MAX_QUEUE_SIZE"},
		{name: "batch processor settings", env: map[string]string{envEndpoint: "http://collector:4318", "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BSP_EXPORT_TIMEOUT": "30000", "OTEL_BSP_MAX_QUEUE_SIZE": "2048", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "10000"}, on: true, proto: "http/protobuf"},
		{name: "off: nothing else is read", env: map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "5s", envSamplerArg: "1%"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := readSettings(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr, "the error names the variable")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.on, s.on)
			assert.Equal(t, tt.proto, s.protocol)
		})
	}
}

// clearEnv unsets every variable Setup and the SDK would read.
func clearEnv(t *testing.T) {
	for _, k := range []string{envDisabled, envExporter, envEndpoint, envTracesEndpoint, envProtocol, envTracesProtocol,
		envSampler, "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_INSECURE", "OTEL_BSP_SCHEDULE_DELAY",
		envSamplerArg, "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
		"OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"} {
		t.Setenv(k, "")
	}
}

// With no OTEL_* variables, nothing records and nothing is exported, yet the W3C propagator is
// set and a gRPC call passes the caller's trace context on (WrapClient, WrapServer: grpcx wraps
// its outermost interceptors so) through a service that records nothing.
func TestSetupOffPropagatesOnly(t *testing.T) {
	clearEnv(t)
	shutdown, err := Setup(context.Background(), "test", zap.NewNop())
	require.NoError(t, err)
	require.False(t, Enabled())
	assert.ElementsMatch(t, []string{"traceparent", "tracestate"}, otel.GetTextMapPropagator().Fields(), "the platform's propagator, no baggage")

	parent := WithTraceparent(context.Background(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "")
	ctx, span := Start(parent, "work", trace.SpanKindInternal, ExecutionID("e"))
	assert.False(t, span.IsRecording(), "off: nothing records")
	assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", trace.SpanContextFromContext(ctx).TraceID().String(), "the trace flows on")
	tp, _ := Traceparent(ctx)
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tp, "and is stored as it came")

	var (
		mu  sync.Mutex
		got trace.SpanContext
	)
	seen := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		got = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		return h(ctx, req)
	}
	srv := grpc.NewServer(ServerOption(), grpc.ChainUnaryInterceptor(WrapServer(seen)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	passThrough := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), DialOption(),
		grpc.WithChainUnaryInterceptor(WrapClient(passThrough)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	mu.Lock()
	assert.Equal(t, trace.SpanContextFromContext(ctx).TraceID(), got.TraceID(), "the server continues the caller's trace")
	assert.True(t, got.IsRemote())
	mu.Unlock()

	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	mu.Lock()
	assert.False(t, got.IsValid(), "no trace given, none made up")
	mu.Unlock()
	require.NoError(t, shutdown(context.Background()))
}

// receiver is an OTLP/gRPC trace receiver keeping what it is sent.
type receiver struct {
	collectorv1.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracev1.ResourceSpans
}

func (r *receiver) Export(_ context.Context, req *collectorv1.ExportTraceServiceRequest) (*collectorv1.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	r.spans = append(r.spans, req.GetResourceSpans()...)
	r.mu.Unlock()
	return &collectorv1.ExportTraceServiceResponse{}, nil
}

// On, spans go to the OTLP endpoint the standard variables name, under OTEL_SERVICE_NAME when
// set, and the shutdown flushes what the batch processor still holds.
func TestSetupExportsOverOTLP(t *testing.T) {
	clearEnv(t)
	rcv := &receiver{}
	srv := grpc.NewServer()
	collectorv1.RegisterTraceServiceServer(srv, rcv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	t.Setenv(envEndpoint, "http://"+lis.Addr().String())
	t.Setenv(envProtocol, "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_SERVICE_NAME", "renamed")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000") // only the shutdown's flush sends it
	shutdown, err := Setup(context.Background(), "default-name", zap.NewNop())
	require.NoError(t, err)
	require.True(t, Enabled())
	_, span := Start(context.Background(), "work", trace.SpanKindInternal, ExecutionID("exec-1"), Attempt(2))
	require.True(t, span.IsRecording())
	span.End()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx))
	require.False(t, Enabled(), "after the shutdown nothing records")
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	require.Len(t, rcv.spans, 1, "flushed by the shutdown")
	var service string
	for _, a := range rcv.spans[0].GetResource().GetAttributes() {
		if a.GetKey() == "service.name" {
			service = a.GetValue().GetStringValue()
		}
	}
	assert.Equal(t, "renamed", service, "OTEL_SERVICE_NAME overrides the default name")
	got := rcv.spans[0].GetScopeSpans()[0].GetSpans()[0]
	assert.Equal(t, "work", got.GetName())
	attrs := map[string]any{}
	for _, a := range got.GetAttributes() {
		attrs[a.GetKey()] = a.GetValue().GetStringValue()
		if a.GetValue().GetIntValue() != 0 {
			attrs[a.GetKey()] = a.GetValue().GetIntValue()
		}
	}
	assert.Equal(t, map[string]any{"integrations.execution_id": "exec-1", "integrations.attempt": int64(2)}, attrs)
}

// A malformed OTEL_RESOURCE_ATTRIBUTES stops the program naming it, before anything is dialled.
func TestSetupRefusesMalformedResourceAttributes(t *testing.T) {
	clearEnv(t)
	t.Setenv(envEndpoint, "http://127.0.0.1:1")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment")
	_, err := Setup(context.Background(), "test", zap.NewNop())
	require.ErrorContains(t, err, "OTEL_RESOURCE_ATTRIBUTES")
	require.False(t, Enabled())
}
