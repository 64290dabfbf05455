package httpapi_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// A call over its application's rate limit answers 429 with Retry-After in whole seconds (at
// least 1, rounded up from the bucket's delay) and a message naming the limit — alike whether
// the gRPC server refuses it or the REST server's precheck does, before the hop.
func TestRateLimitAnswers429WithRetryAfter(t *testing.T) {
	t.Parallel()
	t.Run("refused by the gRPC server", func(t *testing.T) { t.Parallel(); rateLimitAnswers429(t, false) })
	t.Run("refused before the hop", func(t *testing.T) { t.Parallel(); rateLimitAnswers429(t, true) })
}

func rateLimitAnswers429(t *testing.T, precheck bool) {
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	// Reads: one every 2.5s, a burst of 1. Invokes: 40/s.
	_, err := s.Pool.Exec(ctx, `UPDATE applications SET reads_per_second = 0.4, read_burst = 1,
		invokes_per_second = 40, invoke_burst = 1 WHERE id = $1`, dbtest.TestApp)
	require.NoError(t, err)

	log := zaptest.NewLogger(t)
	st := store.New(s.Pool).WithCache(time.Minute)
	limiter := ratelimit.New(ratelimit.NewSource(s.Pool, ratelimit.Limits{}, time.Minute).Limits, func() int { return 1 })
	gate := server.NewRateGate(limiter, 0, server.MaxHeldPerApplication)
	var reached atomic.Int64 // API calls that reached the gRPC server
	counter := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		reached.Add(1)
		return handler(ctx, req)
	}
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: log, Interceptors: []grpc.UnaryServerInterceptor{
		counter, server.AuthInterceptor(st, nil, ""), gate.Interceptor()}})
	// NewServer starts the server's call goroutines; only its interceptor chain is used here.
	t.Cleanup(srv.Stop)
	adapters := adaptercall.NewPool()
	t.Cleanup(func() { _ = adapters.Close() })
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	require.NoError(t, err)
	gw := server.New(st, adapters, nil, nil, box,
		server.Options{MaxPayloadBytes: 1 << 20, Scale: func(d time.Duration) time.Duration { return d }}, log)
	cfg := httpapi.Config{}
	if precheck {
		cfg.Precheck = gate.Precheck(st, nil)
	}
	url := restServerWith(t, httpapi.InProcess(gw, srv.Unary()), cfg)

	first := call(t, http.MethodGet, url+"/v1/executions/"+uuid.NewString(), "")
	require.Equal(t, http.StatusNotFound, first.code, "the first read is within the burst")
	require.Empty(t, first.retryAfter)

	before := reached.Load()
	over := call(t, http.MethodGet, url+"/v1/executions", "")
	require.Equal(t, http.StatusTooManyRequests, over.code, over.body)
	if precheck {
		require.Equal(t, before, reached.Load(), "the refusal did not reach the gRPC server")
	} else {
		require.Equal(t, before+1, reached.Load())
	}
	require.Contains(t, over.body, `"reason":"RATE_LIMITED"`)
	require.Contains(t, over.body, `"retry_delay"`)
	require.Equal(t, "3", over.retryAfter, "2.5s to the next token, rounded up to whole seconds")
	require.Equal(t, "read rate limit of 0.4/s for this application exceeded, retry later", over.status.Message)

	// Invokes: the next token is 25ms away, advised as 1s, never 0.
	bad := call(t, http.MethodPost, url+"/v1/capabilities/"+dbtest.TestCapability+":invoke", `{}`)
	require.Equal(t, http.StatusBadRequest, bad.code, "the first invoke is admitted (and refused as malformed)")
	var limited answer
	for range 100 { // until the refusal: a slow machine may earn a token between two calls
		if limited = call(t, http.MethodPost, url+"/v1/capabilities/"+dbtest.TestCapability+":invoke", `{}`); limited.code == http.StatusTooManyRequests {
			break
		}
	}
	require.Equal(t, http.StatusTooManyRequests, limited.code, limited.body)
	secs, err := strconv.Atoi(limited.retryAfter)
	require.NoError(t, err, "Retry-After is whole seconds: %q", limited.retryAfter)
	require.Equal(t, 1, secs, "a delay under a second is advised as 1s")
}
