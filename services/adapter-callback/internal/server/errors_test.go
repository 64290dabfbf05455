package server_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/server"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/store"
)

// setupBehindProxy is setup with the service's pool reaching Postgres through a proxy the test
// can cut.
func setupBehindProxy(t *testing.T) (*bundle, *dbtest.Proxy) {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	proxy := dbtest.NewProxy(t)
	pool := proxy.Pool(t, s, db.MaxConns(4))
	fake := &fakeSettlement{}
	st := store.New(pool)
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: zaptest.NewLogger(t), Interceptors: []grpc.UnaryServerInterceptor{server.AuthInterceptor(st)}})
	adapterv1.RegisterAdapterCallbackServiceServer(srv, server.New(st, fake, func(d time.Duration) time.Duration { return d }, zaptest.NewLogger(t)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpcx.Dial(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &bundle{schema: s, client: adapterv1.NewAdapterCallbackServiceClient(conn), settlement: fake}, proxy
}

// While the service's Postgres connections are cut, an adapter's callbacks are answered
// UNAVAILABLE with a retry hint — which the SDK retries — never INTERNAL; after, they apply.
func TestCallbacksWhileTheDatabaseIsCut(t *testing.T) {
	t.Parallel()
	b, proxy := setupBehindProxy(t)
	id := b.running(t)
	complete := &adapterv1.CompleteRequest{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1), Outcome: succeeded()}

	proxy.Cut()
	for range 3 {
		_, err := b.client.Complete(authed(credential), complete)
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		require.Positive(t, rpcstatus.RetryDelay(err))
		require.NotContains(t, status.Convert(err).Message(), "127.0.0.1")
		_, err = b.client.RenewLease(authed(credential), &adapterv1.RenewLeaseRequest{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1)})
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	}
	settles, _ := b.settlement.calls()
	require.Zero(t, settles)

	proxy.Restore()
	require.Eventually(t, func() bool {
		_, err := b.client.Complete(authed(credential), complete)
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
}

// What settlement answers reaches the adapter in this service's words.
func TestCompleteSettlementErrorsInTheServicesWords(t *testing.T) {
	t.Parallel()
	refused, err := status.New(codes.InvalidArgument, "result: not a JSON object: unexpected end of JSON input").WithDetails(
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "result", Description: "not a JSON object"}}})
	require.NoError(t, err)
	tests := []struct {
		name  string
		err   error
		code  codes.Code
		field string
	}{
		{"settlement unreachable", status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:9094: connect: connection refused"`), codes.Unavailable, ""},
		{"settlement refuses the result", refused.Err(), codes.InvalidArgument, "succeeded.result"},
		{"settlement does not know the execution", status.Error(codes.NotFound, "execution 0190 not found"), codes.Internal, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.settlement.onSettle = func(*settlementv1.SettleRequest) error { return tt.err }
			id := b.running(t)
			_, err := b.client.Complete(authed(credential), &adapterv1.CompleteRequest{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1), Outcome: succeeded()})
			st := status.Convert(err)
			require.Equal(t, tt.code, st.Code(), "%v", err)
			wire := fmt.Sprint(st.Proto())
			for _, leak := range []string{"9094", "127.0.0.1", "transport", "JSON input", "0190", `"result"`} {
				require.NotContains(t, wire, leak)
			}
			var fields []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.GetFieldViolations() {
						fields = append(fields, v.GetField())
					}
				}
			}
			if tt.field == "" {
				require.Empty(t, fields)
			} else {
				require.Equal(t, []string{tt.field}, fields)
			}
			if tt.code == codes.Unavailable {
				require.Equal(t, "settlement unavailable, retry", st.Message())
			}
		})
	}
}
