package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	collectorv1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// span is one exported span as the receiver keeps it.
type span struct {
	Service string
	TraceID string
	Name    string
	Attrs   map[string]string
}

// otlpReceiver is an OTLP/gRPC trace collector served in process: the in-memory store of the
// spans the stack's programs export. (The issue asks for an in-memory exporter; the services are
// separate processes, so each exports over OTLP to this receiver, and the receiver is the memory.)
type otlpReceiver struct {
	collectorv1.UnimplementedTraceServiceServer
	addr  string
	mu    sync.Mutex
	spans []span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r.addr = lis.Addr().String()
	srv := grpc.NewServer()
	collectorv1.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r
}

func (r *otlpReceiver) Export(_ context.Context, req *collectorv1.ExportTraceServiceRequest) (*collectorv1.ExportTraceServiceResponse, error) {
	var got []span
	for _, rs := range req.GetResourceSpans() {
		var service string
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, a := range sp.GetAttributes() {
					v := a.GetValue().GetStringValue()
					if v == "" {
						v = fmt.Sprint(a.GetValue().GetIntValue())
					}
					attrs[a.GetKey()] = v
				}
				got = append(got, span{Service: service, TraceID: hex.EncodeToString(sp.GetTraceId()), Name: sp.GetName(), Attrs: attrs})
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	return &collectorv1.ExportTraceServiceResponse{}, nil
}

// inTrace is every span received so far of trace id.
func (r *otlpReceiver) inTrace(id string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, s := range r.spans {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	return out
}

// tracesOf is the trace ids of the spans naming an execution.
func (r *otlpReceiver) tracesOf(executionID string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.spans {
		if s.Attrs["integrations.execution_id"] == executionID && !slices.Contains(out, s.TraceID) {
			out = append(out, s.TraceID)
		}
	}
	return out
}

// services is the sorted service names of spans.
func services(spans []span) []string {
	var out []string
	for _, s := range spans {
		if !slices.Contains(out, s.Service) {
			out = append(out, s.Service)
		}
	}
	sort.Strings(out)
	return out
}

// TestTracingOneTraceFromAcceptToTheReceiver runs one async execution whose adapter completes
// through the callback API, on the real stack with every program (the six services and the dummy
// adapter) exporting its spans over OTLP/gRPC to an in-process receiver, and checks that the
// accept, the dispatch, the attempt, the adapter's work and callbacks, the settlement, the relay
// and the delivery are spans of one trace, each carrying the execution id, and that the webhook
// request's traceparent continues that trace.
func TestTracingOneTraceFromAcceptToTheReceiver(t *testing.T) {
	rcv := newOTLPReceiver(t)
	s := newStack(t)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	s.Env = append(s.Env,
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+rcv.addr,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_BSP_SCHEDULE_DELAY=50", // milliseconds: spans leave each program promptly
	)
	programs := []string{"settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway"}
	s.start(programs...)
	hook := newHook(t)
	hook.register(t, s, s.APIKey)

	// dummy.long: an hour's lease (3.6 s here), so the attempt is not cut short on a loaded
	// machine; the adapter answers Accepted, reports progress and completes through the callback
	// API (adapter-callback → settlement).
	id := s.invokeAs(t, s.APIKey, "dummy.long", `{"dummy": {"complete_later_ms": 100}}`)
	d := receiveFor(t, hook.arrived, id)

	want := slices.Clone(programs)
	sort.Strings(want)
	// Every hop's span, by program and name; the adapter's work span ends only once its outcome
	// is delivered, so the wait is for all of them, not for the first span of each program.
	hops := []span{
		{Service: "gateway", Name: "integrations.gateway.v1.GatewayService/InvokeCapability"},
		{Service: "dispatcher", Name: "dispatch"},
		{Service: "execution-consumer", Name: "attempt"},
		{Service: "execution-consumer", Name: "integrations.adapter.v1.AdapterService/Execute"},
		{Service: "dummy-adapter", Name: "integrations.adapter.v1.AdapterService/Execute"},
		{Service: "dummy-adapter", Name: "adapter.work"},
		{Service: "dummy-adapter", Name: "integrations.adapter.v1.AdapterCallbackService/Complete"},
		{Service: "adapter-callback", Name: "integrations.adapter.v1.AdapterCallbackService/Complete"},
		{Service: "settlement", Name: "integrations.settlement.v1.SettlementService/Settle"},
		{Service: "event-router", Name: "relay"},
		{Service: "event-router", Name: "deliver"},
	}
	missing := func(spans []span) []string {
		var out []string
		for _, h := range hops {
			if !slices.ContainsFunc(spans, func(sp span) bool { return sp.Service == h.Service && sp.Name == h.Name }) {
				out = append(out, h.Service+" "+h.Name)
			}
		}
		return out
	}
	var traceID string
	var spans []span
	require.Eventually(t, func() bool {
		ids := rcv.tracesOf(id)
		if len(ids) != 1 {
			return false
		}
		traceID, spans = ids[0], rcv.inTrace(ids[0])
		return len(missing(spans)) == 0
	}, 20*time.Second, 50*time.Millisecond, "one trace naming the execution, with a span of every hop; got traces %v, missing %v", rcv.tracesOf(id), missing(spans))

	assert.Equal(t, want, services(spans), "spans of all six services and the adapter")
	var lines []string
	for _, sp := range spans {
		lines = append(lines, sp.Service+" "+sp.Name)
		assert.Equal(t, id, sp.Attrs["integrations.execution_id"], "%s span %q carries the execution id", sp.Service, sp.Name)
	}
	t.Logf("trace %s:\n%s", traceID, strings.Join(lines, "\n"))
	for _, sp := range spans {
		if sp.Service == "execution-consumer" || sp.Name == "adapter.work" {
			assert.Equal(t, "1", sp.Attrs["integrations.attempt"], "%s span %q carries the attempt", sp.Service, sp.Name)
		}
	}

	// The webhook request continues the same trace: traceparent is 00-<trace id>-<span id>-<flags>.
	parts := strings.Split(d.Traceparent, "-")
	require.Len(t, parts, 4, "the webhook's traceparent header: %q", d.Traceparent)
	assert.Equal(t, traceID, parts[1], "the webhook's traceparent carries the execution's trace id")
}
