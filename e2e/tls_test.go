package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// TestTLS runs a stack with TLS on the client-facing listeners (mTLS on the internal hops, as
// every stack): the core flow works over REST and gRPC with TLS, plain-text clients are refused
// by the TLS ports, and the internal methods refuse a caller without the right certificate with
// UNAUTHENTICATED or PERMISSION_DENIED, changing nothing.
func TestTLS(t *testing.T) {
	s := newStackTLS(t)
	s.start("settlement", "dispatcher", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "gateway")

	t.Run("async invoke completes over REST with TLS", func(t *testing.T) {
		id := s.invoke(t, "dummy.echo", `{"mode": "MODE_ASYNC", "payload": {"over": "https"}}`)
		require.Eventually(t, func() bool {
			code, body := s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
			return code == http.StatusOK && execution(body)["status"] == "EXECUTION_STATUS_SUCCEEDED"
		}, 20*time.Second, 20*time.Millisecond, "the execution completes")
	})

	t.Run("async invoke completes over gRPC with TLS", func(t *testing.T) {
		gw := gatewayv1.NewGatewayServiceClient(s.dialAs("gateway", ""))
		ctx := grpcx.WithBearer(context.Background(), s.APIKey)
		payload, err := structpb.NewStruct(map[string]any{"over": "grpc+tls"})
		require.NoError(t, err)
		resp, err := gw.InvokeCapability(ctx, &gatewayv1.InvokeCapabilityRequest{
			Capability: "dummy.echo", Mode: executionv1.Mode_MODE_ASYNC, Payload: payload})
		require.NoError(t, err)
		id := resp.GetExecution().GetId()
		require.Eventually(t, func() bool {
			got, err := gw.GetExecution(ctx, &gatewayv1.GetExecutionRequest{Id: id})
			return err == nil && got.GetExecution().GetStatus() == executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED
		}, 20*time.Second, 20*time.Millisecond, "the execution completes")
	})

	t.Run("plain-text clients are refused by the TLS and mTLS ports", func(t *testing.T) {
		resp, err := http.Get("http://" + s.Addrs["gateway-http"] + "/v1/executions")
		if err == nil {
			resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "Go's TLS server answers a plain HTTP request 400")
		}
		for _, name := range []string{"gateway", "adapter-callback", "settlement", "dispatcher", "execution-consumer", "event-router"} {
			conn, err := grpcx.Dial(s.Addrs[name], grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{})
			cancel()
			_ = conn.Close()
			assert.Equal(t, codes.Unavailable, status.Code(err), "%s: %v", name, err)
		}
	})

	t.Run("Settle, FailAttempt and Nudge refuse a caller without the right certificate and change nothing", func(t *testing.T) {
		id := s.schema.InsertExecution(t, dbtest.Execution{Application: "dev-app", Capability: "dummy.echo", Status: "running", Attempt: 1, MaxAttempts: 10})
		s.schema.InsertAttempts(t, id, dbtest.Attempt{N: 1})
		settle := &settlementv1.SettleRequest{ExecutionId: id, Attempt: 1,
			FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING, Status: executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED}
		fail := &settlementv1.FailAttemptRequest{ExecutionId: id, Attempt: 1,
			Failure: &executionv1.Failure{Class: "permanent", Code: "forged"}}

		// Another CA's certificate naming a platform service: verified after the handshake, refused.
		other := t.TempDir()
		_, err := devca.Ensure(other, "gateway")
		require.NoError(t, err)
		forged, err := grpcx.NewInternal(tlsx.Files{CertFile: devca.CertFile(other, "gateway"), KeyFile: devca.KeyFile(other, "gateway"),
			CAFile: filepath.Join(tlsDir, "ca.pem")})
		require.NoError(t, err)
		forgedConn, err := grpcx.Dial(s.Addrs["settlement"], forged.DialOption("settlement"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = forgedConn.Close() })

		for _, c := range []struct {
			as   string
			conn *grpc.ClientConn
			code codes.Code
		}{
			{"no certificate", s.dialAs("settlement", ""), codes.Unauthenticated},
			{"the event router's certificate", s.dialAs("settlement", "event-router"), codes.PermissionDenied},
			{"the dispatcher's certificate", s.dialAs("settlement", "dispatcher"), codes.PermissionDenied},
			{"settlement's own certificate", s.dialAs("settlement", "settlement"), codes.PermissionDenied},
			{"another CA's certificate", forgedConn, codes.Unauthenticated},
		} {
			client := settlementv1.NewSettlementServiceClient(c.conn)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := client.Settle(ctx, settle)
			assert.Equal(t, c.code, status.Code(err), "Settle with %s: %v", c.as, err)
			_, err = client.FailAttempt(ctx, fail)
			assert.Equal(t, c.code, status.Code(err), "FailAttempt with %s: %v", c.as, err)
			cancel()
		}
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM executions WHERE id = $1 AND status = 'running'`, id), "the execution is still running")
		assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id), "no completion event")

		for _, c := range []struct {
			as   string
			code codes.Code
		}{{"", codes.Unauthenticated}, {"adapter-callback", codes.PermissionDenied}, {"event-router", codes.PermissionDenied}} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := dispatcherv1.NewDispatcherServiceClient(s.dialAs("dispatcher", c.as)).Nudge(ctx, &dispatcherv1.NudgeRequest{})
			cancel()
			assert.Equal(t, c.code, status.Code(err), "Nudge as %q: %v", c.as, err)
		}

		// The callers the policies list get through: the execution-consumer settles the execution.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, as := range []string{"gateway", "settlement", "execution-consumer"} {
			_, err := dispatcherv1.NewDispatcherServiceClient(s.dialAs("dispatcher", as)).Nudge(ctx, &dispatcherv1.NudgeRequest{})
			assert.NoError(t, err, "Nudge as %s", as)
		}
		_, err = settlementv1.NewSettlementServiceClient(s.dialAs("settlement", "execution-consumer")).Settle(ctx, settle)
		require.NoError(t, err)
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM executions WHERE id = $1 AND status = 'succeeded'`, id))
	})
}
