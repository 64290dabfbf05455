// Package telemetry sets up OpenTelemetry tracing the same way in every program of the platform,
// and carries one execution's trace across the hops that are not gRPC calls: the execution's row
// (W3C traceparent and tracestate columns), the broker's messages (pkg/mq) and the webhook.
//
// Tracing is off by default. [Setup] turns the OTLP exporter on when the standard variables name
// an endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. Off, nothing is recorded and nothing is
// exported, but an incoming trace context is still passed on (gRPC metadata, rows, messages,
// webhooks): a trace stays whole across a service that does not record, at the cost of a header
// lookup per call.
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/safetext"
)

// The span attributes the platform sets. Every span of an execution's flow carries
// ExecutionIDKey, and AttemptKey where there is an attempt, so that a trace can be found from an
// execution id and an execution's spans picked out of a shared trace.
const (
	ExecutionIDKey = attribute.Key("integrations.execution_id")
	AttemptKey     = attribute.Key("integrations.attempt")
	EventIDKey     = attribute.Key("integrations.event_id")
)

// ExecutionID is the span attribute naming an execution.
func ExecutionID(id string) attribute.KeyValue { return ExecutionIDKey.String(id) }

// Attempt is the span attribute numbering an attempt.
func Attempt(n int32) attribute.KeyValue { return AttemptKey.Int(int(n)) }

// EventID is the span attribute naming an integration event.
func EventID(id string) attribute.KeyValue { return EventIDKey.String(id) }

// The standard variables Setup reads itself; the exporter and the SDK read the rest of the
// OTEL_* family (headers, timeouts, TLS, OTEL_BSP_*, OTEL_TRACES_SAMPLER_ARG,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME).
const (
	envDisabled       = "OTEL_SDK_DISABLED"
	envExporter       = "OTEL_TRACES_EXPORTER"
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envSampler        = "OTEL_TRACES_SAMPLER"
	envSamplerArg     = "OTEL_TRACES_SAMPLER_ARG"
)

// enabled is set by Setup when spans are recorded and exported. It is read on every gRPC call,
// broker message and accept: an atomic, not a lock.
var enabled atomic.Bool

// Enabled reports whether this process records and exports spans.
func Enabled() bool { return enabled.Load() }

// ShutdownFunc flushes the spans still buffered and stops the exporter. It is bounded by ctx.
type ShutdownFunc func(ctx context.Context) error

// settings is what Setup read from the environment.
type settings struct {
	on       bool
	protocol string // "grpc" or "http/protobuf"
	why      string // why tracing is off, for the log
}

// Setup configures tracing for the program named service (the resource's service.name, which
// OTEL_SERVICE_NAME overrides) from the standard OTEL_* variables, and always sets the W3C trace
// context propagator globally (the platform's own, Propagator: no baggage). Off (the default), it returns a shutdown that does
// nothing. On, spans go through a batch span processor to the OTLP exporter the variables name
// (OTEL_EXPORTER_OTLP_PROTOCOL grpc or http/protobuf, the latter being the specification's
// default); the shutdown it returns flushes them, and belongs last in the program's close order
// (lifecycle.App.Flush). A variable with a value Setup cannot use is an error naming it.
func Setup(ctx context.Context, service string, log *zap.Logger) (ShutdownFunc, error) {
	otel.SetTextMapPropagator(propagator)
	s, err := readSettings(os.Getenv)
	if err != nil {
		return nil, err
	}
	if !s.on {
		enabled.Store(false)
		log.Debug("tracing off", zap.String("reason", s.why))
		return func(context.Context) error { return nil }, nil
	}
	// The exporter's errors (a collector down, a refused batch) are logged, never fatal: losing
	// spans must not stop the platform.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing error", zap.Error(err))
	}))
	// Later detectors win: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME override the default
	// service name. A malformed OTEL_RESOURCE_ATTRIBUTES is refused, as any variable we read.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	var client otlptrace.Client
	switch s.protocol {
	case "grpc":
		client = otlptracegrpc.NewClient()
	default:
		client = otlptracehttp.NewClient()
	}
	otlp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter (OTEL_EXPORTER_OTLP_*): %w", err)
	}
	abortCtx, abort := context.WithCancel(context.Background())
	exp := abortableExporter{SpanExporter: otlp, abort: abortCtx}
	// The sampler is the SDK's, from OTEL_TRACES_SAMPLER (validated above) and
	// OTEL_TRACES_SAMPLER_ARG; the batch processor's queue and delays from OTEL_BSP_*.
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	otel.SetTracerProvider(tp)
	enabled.Store(true)
	log.Info("tracing on", zap.String("protocol", s.protocol), zap.String("sampler", cmp.Or(strings.ToLower(strings.TrimSpace(os.Getenv(envSampler))), "parentbased_always_on")))
	return func(ctx context.Context) error {
		enabled.Store(false)
		// A collector that is down would hold the flush on the exporter's retries until the hard
		// timeout, and the program would exit unclean: the flush gets flushTimeout at most, and
		// then the export in flight is abandoned (so that no exporter goroutine outlives it).
		ctx, cancel := context.WithTimeout(ctx, flushTimeout)
		defer cancel()
		defer abort()
		stop := context.AfterFunc(ctx, abort)
		defer stop()
		err := tp.Shutdown(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("flush spans: gave up after %v (collector down?): %w", flushTimeout, ctx.Err())
		}
		if err != nil {
			return fmt.Errorf("flush spans: %w", err)
		}
		return nil
	}, nil
}

// flushTimeout bounds the shutdown's flush: a collector that is up takes milliseconds; one that
// does not answer within it is down, and waiting on its exporter's retries would only hold the
// shutdown.
const flushTimeout = 3 * time.Second

// abortableExporter is an exporter whose exports in flight end when abort does: at the shutdown's
// bound, so that the batch processor's last export (which runs on a context of its own, bounded
// only by OTEL_BSP_EXPORT_TIMEOUT) does not outlive the shutdown.
type abortableExporter struct {
	sdktrace.SpanExporter
	abort context.Context
}

func (e abortableExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.abort, cancel)
	defer stop()
	return e.SpanExporter.ExportSpans(ctx, spans)
}

// samplers are the values of OTEL_TRACES_SAMPLER the SDK knows.
var samplers = map[string]bool{
	"always_on": true, "always_off": true, "traceidratio": true,
	"parentbased_always_on": true, "parentbased_always_off": true, "parentbased_traceidratio": true,
}

// readSettings decides from the environment whether tracing is on, and over which protocol.
func readSettings(getenv func(string) string) (settings, error) {
	if v := strings.TrimSpace(getenv(envDisabled)); v != "" {
		switch strings.ToLower(v) {
		case "true":
			return settings{why: envDisabled + "=true"}, nil
		case "false":
		default:
			return settings{}, fmt.Errorf("%s: want true or false, got %q", envDisabled, v)
		}
	}
	switch v := strings.TrimSpace(getenv(envExporter)); v {
	case "none":
		return settings{why: envExporter + "=none"}, nil
	case "", "otlp":
	default:
		return settings{}, fmt.Errorf("%s: only otlp and none are supported, got %q", envExporter, v)
	}
	if strings.TrimSpace(getenv(envEndpoint)) == "" && strings.TrimSpace(getenv(envTracesEndpoint)) == "" {
		return settings{why: "no " + envEndpoint + " or " + envTracesEndpoint}, nil
	}
	name, protocol := envTracesProtocol, strings.TrimSpace(getenv(envTracesProtocol))
	if protocol == "" {
		name, protocol = envProtocol, strings.TrimSpace(getenv(envProtocol))
	}
	switch protocol {
	case "":
		protocol = "http/protobuf" // the specification's default
	case "grpc", "http/protobuf":
	default:
		return settings{}, fmt.Errorf("%s: want grpc or http/protobuf, got %q", name, protocol)
	}
	// The SDK reads the sampler in any case; a ratio it cannot parse it logs and samples
	// everything, which an operator asking for 1% must hear of at start.
	sampler := strings.ToLower(strings.TrimSpace(getenv(envSampler)))
	if sampler != "" && !samplers[sampler] {
		return settings{}, fmt.Errorf("%s: unknown sampler %q", envSampler, sampler)
	}
	if arg := strings.TrimSpace(getenv(envSamplerArg)); arg != "" && strings.HasSuffix(sampler, "traceidratio") {
		if r, err := strconv.ParseFloat(arg, 64); err != nil || r < 0 || r > 1 {
			return settings{}, fmt.Errorf("%s: want a ratio from 0 to 1 for %s, got %q", envSamplerArg, sampler, arg)
		}
	}
	// The exporter and the batch processor log a value they cannot parse and go on without it
	// (sending to localhost, over TLS to a plaintext collector, on default delays): refused here,
	// as our own configuration is.
	for _, name := range []string{envEndpoint, envTracesEndpoint} {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return settings{}, fmt.Errorf("%s: want an http:// or https:// URL naming the collector, got %q", name, v)
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"} {
		if v := strings.TrimSpace(getenv(name)); v != "" && !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
			return settings{}, fmt.Errorf("%s: want true or false, got %q", name, v)
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_BSP_SCHEDULE_DELAY",
		"OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"} {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n <= 0 {
				return settings{}, fmt.Errorf("%s: want a positive whole number (milliseconds, or a count), got %q", name, v)
			}
		}
	}
	return settings{on: true, protocol: protocol}, nil
}

// tracerName is the instrumentation scope of the platform's own spans.
const tracerName = "github.com/integrations-platform/integrations"

// Start starts a span of the platform's own, a child of ctx's span (local or remote), with attrs.
// Off, it starts nothing and costs nothing: it answers ctx and ctx's span (non-recording, or the
// remote parent), whose End does nothing, so that the trace context still flows on.
func Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !Enabled() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return otel.Tracer(tracerName).Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(own(attrs)...))
}

// own is a copy of attrs. Handing the caller's variadic slice to the SDK would make it escape,
// and every call allocate it on the heap, tracing off too; copied here, only the recording path
// allocates.
func own(attrs []attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, len(attrs))
	copy(out, attrs)
	return out
}

// Annotate sets attrs on ctx's span when it records (e.g. the execution id on the server span of
// the call that made it). Off, no span records: it costs a context lookup.
func Annotate(ctx context.Context, attrs ...attribute.KeyValue) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(own(attrs)...)
	}
}

// maxStatusMessage bounds an error's text on a span: errors may quote a dependency's answer.
const maxStatusMessage = 512

// Fail records err on span (its status and an exception event) when span records.
func Fail(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	msg := safetext.Error(err, maxStatusMessage)
	span.RecordError(errors.New(msg))
	span.SetStatus(codes.Error, msg)
}
