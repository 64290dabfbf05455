package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
)

type stubGateway struct {
	gatewayv1.UnimplementedGatewayServiceServer
	mu  sync.Mutex
	ids []string
}

func (s *stubGateway) GetExecution(_ context.Context, req *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) < 16 {
		s.ids = append(s.ids, req.GetId())
	}
	return &gatewayv1.GetExecutionResponse{}, nil
}

// TestInProcessRunsTheInterceptorChain: a REST call served in process passes the interceptor
// chain it is given, with the gRPC method's FullMethod, the service as info.Server and the
// request's headers as incoming metadata; a refusal by the chain is the REST answer and the
// service is not called.
func TestInProcessRunsTheInterceptorChain(t *testing.T) {
	svc := &stubGateway{}
	var mu sync.Mutex
	var seen []string
	refuse := false
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, info.FullMethod)
		r := refuse
		mu.Unlock()
		require.Same(t, svc, info.Server)
		require.Equal(t, []string{"Bearer k"}, md.Get("authorization"))
		if r {
			return nil, status.Error(codes.Unauthenticated, "no such key")
		}
		return handler(ctx, req)
	}
	h, err := httpapi.Handler(context.Background(), httpapi.InProcess(svc, unary), httpapi.Config{MaxBodyBytes: 1 << 20})
	require.NoError(t, err)
	rest := httptest.NewServer(h)
	t.Cleanup(rest.Close)

	get := func() int {
		req, err := http.NewRequest(http.MethodGet, rest.URL+"/v1/executions/abc", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer k")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get())
	mu.Lock()
	refuse = true
	mu.Unlock()
	require.Equal(t, http.StatusUnauthorized, get())

	require.Equal(t, []string{gatewayv1.GatewayService_GetExecution_FullMethodName, gatewayv1.GatewayService_GetExecution_FullMethodName}, seen)
	require.Equal(t, []string{"abc"}, svc.ids, "the refused call never reached the service")
}
