package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

type bundle struct {
	proxy *dbtest.Proxy
	url   string // the REST server
	app   string // the application_name of the gateway's pool, to terminate its backends only
}

// setup runs the gateway's gRPC server on a pool that reaches Postgres through a proxy the test
// can cut, and its REST face in front of it, as main.go wires them.
func setup(t *testing.T) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	proxy := dbtest.NewProxy(t)
	app := "gwtest_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	pool, err := db.Open(context.Background(), proxy.URL(t, s.URL)+"&application_name="+app, db.MaxConns(4))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	log := zaptest.NewLogger(t)
	st := store.New(pool).WithCache(time.Minute) // as main.go: the calls below fail in their handlers, not at the key lookup
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: log, Interceptors: []grpc.UnaryServerInterceptor{server.AuthInterceptor(st, nil, "")}})
	// NewServer starts the server's call goroutines; only its interceptor chain is used here.
	t.Cleanup(srv.Stop)
	adapters := adaptercall.NewPool()
	t.Cleanup(func() { _ = adapters.Close() })
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	require.NoError(t, err)
	gw := server.New(st, adapters, nil, nil, box,
		server.Options{MaxPayloadBytes: 1 << 20, Scale: func(d time.Duration) time.Duration { return d }}, log)
	return &bundle{proxy: proxy, url: restServer(t, httpapi.InProcess(gw, srv.Unary())), app: app}
}

func restServer(t *testing.T, api gatewayv1.GatewayServiceServer) string {
	return restServerWith(t, api, httpapi.Config{})
}

// restServerWith is restServer with cfg (its MaxBodyBytes: 1 MiB).
func restServerWith(t *testing.T, api gatewayv1.GatewayServiceServer, cfg httpapi.Config) string {
	t.Helper()
	cfg.MaxBodyBytes = 1 << 20
	h, err := httpapi.Handler(context.Background(), api, cfg)
	require.NoError(t, err)
	rest := httptest.NewServer(h)
	t.Cleanup(rest.Close)
	return rest.URL
}

type answer struct {
	code       int
	retryAfter string
	body       string
	status     struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
}

func call(t *testing.T, method, url, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+dbtest.TestAPIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(raw)}
	if resp.StatusCode >= 400 {
		require.NoError(t, json.Unmarshal(raw, &a.status), "%s", raw)
	}
	return a
}

// While the gateway's Postgres connections are cut (every one reset, new ones refused), every
// call answers 503 with Retry-After — never 500 — and says nothing of the database; once the
// database is back, the same calls work on fresh connections.
func TestDatabaseCutAnswers503WithRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	get := b.url + "/v1/executions/" + uuid.NewString()
	invoke := b.url + "/v1/capabilities/" + dbtest.TestCapability + ":invoke"
	require.Equal(t, http.StatusNotFound, call(t, http.MethodGet, get, "").code, "the database answers before the cut")

	b.proxy.Cut()
	for _, c := range []struct{ method, url, body string }{
		{http.MethodGet, get, ""},
		{http.MethodGet, b.url + "/v1/executions", ""},
		{http.MethodPost, invoke, `{"mode":"MODE_ASYNC","payload":{"n":1}}`},
	} {
		for range 3 { // not one 500 in a row either
			a := call(t, c.method, c.url, c.body)
			require.Equal(t, http.StatusServiceUnavailable, a.code, "%s %s: %s", c.method, c.url, a.body)
			require.Equal(t, "1", a.retryAfter)
			require.Equal(t, 14, a.status.Code) // UNAVAILABLE
			for _, leak := range []string{"127.0.0.1", "dial", "connect", "postgres", "reset"} {
				require.NotContains(t, strings.ToLower(a.status.Message), leak)
			}
		}
	}

	b.proxy.Restore()
	require.Eventually(t, func() bool {
		return call(t, http.MethodGet, get, "").code == http.StatusNotFound
	}, 10*time.Second, 20*time.Millisecond)
	a := call(t, http.MethodPost, invoke, `{"mode":"MODE_ASYNC","payload":{"n":1}}`)
	require.Equal(t, http.StatusAccepted, a.code, a.body)
}

// Connections reset under an idle pool (a restart of Postgres that is quick to come back): the
// next calls find the dead connections before using them and succeed on fresh ones.
func TestConnectionsResetAreReplacedWithoutAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	get := b.url + "/v1/executions/" + uuid.NewString()
	require.Equal(t, http.StatusNotFound, call(t, http.MethodGet, get, "").code)
	b.proxy.Cut()
	b.proxy.Restore()
	for range 5 {
		a := call(t, http.MethodGet, get, "")
		require.Equal(t, http.StatusNotFound, a.code, a.body)
	}
}

// Every backend of the gateway's pool terminated (pg_terminate_backend, SQLSTATE 57P01, as a
// failover or an operator does): the calls that follow find the dead connections before using
// them and succeed on fresh ones — no 500, no 503.
func TestBackendsTerminatedAreReplacedWithoutAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	get := b.url + "/v1/executions/" + uuid.NewString()
	// burst makes 8 calls at once (so the pool holds several connections) and answers their
	// HTTP statuses; require is not used off the test's goroutine.
	burst := func() []int {
		codes := make([]int, 8)
		var wg sync.WaitGroup
		for i := range codes {
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodGet, get, nil)
				if err != nil {
					return
				}
				req.Header.Set("Authorization", "Bearer "+dbtest.TestAPIKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				_ = resp.Body.Close()
				codes[i] = resp.StatusCode
			})
		}
		wg.Wait()
		return codes
	}
	require.Equal(t, []int{404, 404, 404, 404, 404, 404, 404, 404}, burst(), "fills the pool")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbtest.BaseURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(ctx) })
	var n int
	require.NoError(t, admin.QueryRow(ctx,
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, b.app).Scan(&n))
	require.Positive(t, n)
	require.Eventually(t, func() bool {
		var left int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, b.app).Scan(&left)
		return err == nil && left == 0
	}, 5*time.Second, 5*time.Millisecond)

	for _, code := range burst() {
		require.Equal(t, http.StatusNotFound, code)
	}
}

// A REST call passes the gRPC server's interceptors in order, named as the gRPC call would be,
// and an error that is not the gateway's own (a dependency's status passed up by a handler) is
// answered in the gateway's words: 503 with Retry-After, naming no address.
func TestRESTCallsPassTheServersInterceptors(t *testing.T) {
	t.Parallel()
	var seen []string
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		seen = append(seen, info.FullMethod)
		return handler(ctx, req)
	}
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: zaptest.NewLogger(t), Interceptors: []grpc.UnaryServerInterceptor{record}})
	// NewServer starts the server's call goroutines; only its interceptor chain is used here.
	t.Cleanup(srv.Stop)
	url := restServer(t, httpapi.InProcess(foreignError{}, srv.Unary()))

	a := call(t, http.MethodGet, url+"/v1/executions/"+uuid.NewString(), "")
	require.Equal(t, []string{gatewayv1.GatewayService_GetExecution_FullMethodName}, seen)
	require.Equal(t, http.StatusServiceUnavailable, a.code, a.body)
	require.Equal(t, "1", a.retryAfter)
	require.NotContains(t, a.body, "10.1.2.3")
}

// foreignError answers GetExecution with a transport's status naming an address, as a handler
// passing a dependency's error up unmapped would.
type foreignError struct {
	gatewayv1.UnimplementedGatewayServiceServer
}

func (foreignError) GetExecution(context.Context, *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	return nil, status.Error(codes.Unavailable, "connection error: dial tcp 10.1.2.3:5432: connect: connection refused")
}

// grpc-gateway's own refusals of a bad request stay 4xx and say what is wrong.
func TestBadBodyStays400(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := call(t, http.MethodPost, b.url+"/v1/capabilities/"+dbtest.TestCapability+":invoke", `{"mode":`)
	require.Equal(t, http.StatusBadRequest, a.code, a.body)
	require.Empty(t, a.retryAfter)
}
