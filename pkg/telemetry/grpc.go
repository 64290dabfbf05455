package telemetry

import (
	"context"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// ServerOption traces a gRPC server's calls when tracing is on: otelgrpc's stats handler, a
// server span per call continuing the caller's trace, with the execution id (and attempt) of the
// request on it. Off, it is no option at all: WrapServer passes the caller's trace context on.
func ServerOption() grpc.ServerOption {
	if Enabled() {
		return grpc.StatsHandler(annotated{Handler: otelgrpc.NewServerHandler(otelgrpc.WithFilter(traced), otelgrpc.WithPropagators(propagator))})
	}
	return grpc.EmptyServerOption{}
}

// WrapServer returns next, the server's outermost unary interceptor, taking the caller's trace
// context from the incoming metadata first when the context has none (tracing off, or a call
// served in process): what the handler writes — a row, a message, a call — continues the caller's
// trace even through a service that records nothing. It wraps an interceptor rather than being
// one, because each level of a gRPC interceptor chain allocates per call: off, it costs a metadata
// lookup and nothing allocated when there is no traceparent.
func WrapServer(next grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return next(FromIncoming(ctx), req, info, handler)
	}
}

// DialOption traces a gRPC client's calls when tracing is on: otelgrpc's stats handler, a client
// span per call, its trace context in the call's metadata. Off, it is no option at all: WrapClient
// passes ctx's trace context on.
func DialOption() grpc.DialOption {
	if Enabled() {
		return grpc.WithStatsHandler(annotated{Handler: otelgrpc.NewClientHandler(otelgrpc.WithFilter(traced), otelgrpc.WithPropagators(propagator)), client: true})
	}
	return grpc.EmptyDialOption{}
}

// WrapClient returns next, the client's outermost unary interceptor, putting ctx's trace context
// into the call's metadata first when tracing is off (on, the stats handler does, with its client
// span's): nothing done, and nothing allocated, when ctx has none.
func WrapClient(next grpc.UnaryClientInterceptor) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !Enabled() {
			ctx = injectOutgoing(ctx)
		}
		return next(ctx, method, req, reply, cc, invoker, opts...)
	}
}

// PropagateDialOption passes ctx's trace context on in a gRPC client's calls, without a span of
// its own whether tracing is on or off: for a call that is already one span's only work (the
// event-router's delivery to a gRPC consumer, whose "deliver" span is the client span).
func PropagateDialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(propagateClient)
}

// traced leaves the health and reflection services out of traces: probes every few seconds are
// no hop of any execution.
func traced(info *stats.RPCTagInfo) bool {
	return !strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.") &&
		!strings.HasPrefix(info.FullMethodName, "/grpc.reflection.")
}

// InProcessServer is ServerOption for calls served in process, through a server's interceptor
// chain without the network (the gateway's REST face), when tracing is on: it takes the caller's
// trace context from the incoming metadata (traceparent, tracestate) and records a server
// span named after the method, as otelgrpc would over the network. (Off, WrapServer on the chain's
// outermost interceptor passes the trace context on.)
func InProcessServer() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx = extractIncoming(ctx)
		if !Enabled() {
			return handler(ctx, req)
		}
		service, method := splitMethod(info.FullMethod)
		ctx, span := otel.Tracer(tracerName).Start(ctx, strings.TrimPrefix(info.FullMethod, "/"),
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("rpc.system.name", "grpc"), attribute.String("rpc.service", service), attribute.String("rpc.method", method)))
		defer span.End()
		annotateRequest(span, req)
		resp, err := handler(ctx, req)
		code := status.Code(err)
		span.SetAttributes(attribute.String("rpc.response.status_code", code.String()))
		if serverError(code) {
			span.SetStatus(otelcodes.Error, status.Convert(err).Message())
		}
		return resp, err
	}
}

func splitMethod(full string) (service, method string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.LastIndex(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "", full
}

// serverError is the codes a server's span marks as errors (the OpenTelemetry semantic
// conventions): a refusal of the caller's request is the caller's error, not the server's.
func serverError(c codes.Code) bool {
	switch c {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// annotated is an otelgrpc stats handler that also puts the request's execution id, attempt and
// event id on the call's span: the request is the first payload a server receives and a client
// sends.
type annotated struct {
	stats.Handler
	client bool
}

func (h annotated) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch p := s.(type) {
	case *stats.InPayload:
		if !h.client {
			annotateRequest(trace.SpanFromContext(ctx), p.Payload)
		}
	case *stats.OutPayload:
		if h.client {
			annotateRequest(trace.SpanFromContext(ctx), p.Payload)
		}
	}
	h.Handler.HandleRPC(ctx, s)
}

// annotateRequest sets the attributes a request names (by its generated getters) on span.
func annotateRequest(span trace.Span, req any) {
	if !span.IsRecording() {
		return
	}
	if m, ok := req.(interface{ GetExecutionId() string }); ok && m.GetExecutionId() != "" {
		span.SetAttributes(ExecutionID(m.GetExecutionId()))
	}
	if m, ok := req.(interface{ GetAttempt() int32 }); ok && m.GetAttempt() > 0 {
		span.SetAttributes(Attempt(m.GetAttempt()))
	}
	if m, ok := req.(interface{ GetEventId() string }); ok && m.GetEventId() != "" {
		span.SetAttributes(EventID(m.GetEventId()))
	}
}

// FromIncoming returns ctx carrying the trace context of its incoming gRPC metadata, when ctx has
// none yet.
func FromIncoming(ctx context.Context) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return extractIncoming(ctx)
}

// extractIncoming returns ctx with the trace context of its incoming metadata, if it has any. The
// lookup of traceparent alone copies nothing; the metadata is read whole only when it is there.
func extractIncoming(ctx context.Context) context.Context {
	if len(metadata.ValueFromIncomingContext(ctx, "traceparent")) == 0 {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return propagator.Extract(ctx, mdCarrier(md))
}

// propagateClient is an interceptor of its own that puts ctx's trace context into the call's
// metadata, for PropagateDialOption.
func propagateClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(injectOutgoing(ctx), method, req, reply, cc, opts...)
}

// injectOutgoing returns ctx with its trace context in the outgoing metadata; ctx itself when it
// has none.
func injectOutgoing(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok {
		md = metadata.MD{}
	}
	propagator.Inject(ctx, mdCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// mdCarrier is gRPC metadata as a propagation.TextMapCarrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
