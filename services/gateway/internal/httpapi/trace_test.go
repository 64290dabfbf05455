package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
)

type tracedGateway struct {
	gatewayv1.UnimplementedGatewayServiceServer
	mu      sync.Mutex
	seen    trace.SpanContext
	baggage int // members of the handler's baggage
}

func (s *tracedGateway) GetExecution(ctx context.Context, _ *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	s.mu.Lock()
	s.seen = trace.SpanContextFromContext(ctx)
	s.baggage = baggage.FromContext(ctx).Len()
	s.mu.Unlock()
	return &gatewayv1.GetExecutionResponse{}, nil
}

// A REST caller's traceparent reaches the service through the server's in-process chain (tracing
// off here: passed on, not recorded), so what the call writes continues the caller's trace; a
// malformed one is ignored, not refused.
func TestRESTCallerTraceparentReachesTheService(t *testing.T) {
	svc := &tracedGateway{}
	srv := grpcx.NewServer(grpcx.ServerConfig{})
	// NewServer starts the server's call goroutines; only its interceptor chain is used here.
	t.Cleanup(srv.Stop)
	h, err := httpapi.Handler(context.Background(), httpapi.InProcess(svc, srv.Unary()), httpapi.Config{MaxBodyBytes: 1 << 20})
	require.NoError(t, err)
	rest := httptest.NewServer(h)
	t.Cleanup(rest.Close)

	get := func(traceparent string) trace.SpanContext {
		req, err := http.NewRequest(http.MethodGet, rest.URL+"/v1/executions/abc", nil)
		require.NoError(t, err)
		req.Header.Set("Traceparent", traceparent)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		svc.mu.Lock()
		defer svc.mu.Unlock()
		return svc.seen
	}
	sc := get("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", sc.TraceID().String())
	assert.Equal(t, "b7ad6b7169203331", sc.SpanID().String())
	assert.False(t, get("not-a-traceparent").IsValid(), "a malformed traceparent starts nothing and refuses nothing")
}

// A public caller's baggage goes no further than the gateway (the platform passes none on, to
// the adapters least of all), and its tracestate is cut to the 512 characters W3C trace context
// asks to be passed on: what the accept stores on the row and every later hop sends.
func TestRESTCallerBaggageStopsAndTracestateIsBounded(t *testing.T) {
	svc := &tracedGateway{}
	srv := grpcx.NewServer(grpcx.ServerConfig{})
	// NewServer starts the server's call goroutines; only its interceptor chain is used here.
	t.Cleanup(srv.Stop)
	h, err := httpapi.Handler(context.Background(), httpapi.InProcess(svc, srv.Unary()), httpapi.Config{MaxBodyBytes: 1 << 20})
	require.NoError(t, err)
	rest := httptest.NewServer(h)
	t.Cleanup(rest.Close)

	var entries []string
	for i := range 32 {
		entries = append(entries, "k"+string(rune('a'+i%26))+string(rune('a'+i/26))+"="+strings.Repeat("v", 100))
	}
	req, err := http.NewRequest(http.MethodGet, rest.URL+"/v1/executions/abc", nil)
	require.NoError(t, err)
	req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	req.Header.Set("Tracestate", strings.Join(entries, ","))
	req.Header.Set("Baggage", "user.id=alice,session=s3cr3t")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	svc.mu.Lock()
	defer svc.mu.Unlock()
	assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", svc.seen.TraceID().String())
	assert.Zero(t, svc.baggage, "the caller's baggage is not taken in")
	assert.Equal(t, strings.Join(entries[:4], ","), svc.seen.TraceState().String(), "the tracestate is bounded")
}
