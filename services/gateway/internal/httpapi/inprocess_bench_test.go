package httpapi_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"

	gatewayv1gw "github.com/integrations-platform/integrations/pkg/gen/gw/integrations/gateway/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
)

// BenchmarkRESTvsGRPC compares one call of a method that does nothing over REST (served in
// process through the gRPC server's chain, as main.go) and over gRPC (a loopback connection to
// the same server), client in the same process: the difference is what REST's JSON mapping and
// HTTP/1.1 cost beyond gRPC (docs/capacity.md, "Accept (issue 13)").
func BenchmarkRESTvsGRPC(b *testing.B) {
	svc := &stubGateway{}
	srv := grpcx.NewServer(grpcx.ServerConfig{})
	gatewayv1.RegisterGatewayServiceServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	conn, err := grpcx.Dial(lis.Addr().String())
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close() })

	b.Run("rest-in-process", func(b *testing.B) {
		h, err := httpapi.Handler(context.Background(), httpapi.InProcess(svc, srv.Unary()), httpapi.Config{MaxBodyBytes: 1 << 20})
		require.NoError(b, err)
		benchREST(b, h)
	})
	// The hop this replaced: grpc-gateway proxying to the gRPC port over conn (a bare mux, without
	// this package's options, against a bare in-process one).
	loopback := runtime.NewServeMux()
	require.NoError(b, gatewayv1gw.RegisterGatewayServiceHandler(context.Background(), loopback, conn))
	direct := runtime.NewServeMux()
	require.NoError(b, gatewayv1gw.RegisterGatewayServiceHandlerServer(context.Background(), direct, httpapi.InProcess(svc, srv.Unary())))
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"bare-loopback", loopback}, {"bare-in-process", direct}} {
		b.Run(c.name, func(b *testing.B) { benchREST(b, c.h) })
	}
	b.Run("grpc", func(b *testing.B) {
		client := gatewayv1.NewGatewayServiceClient(conn)
		ctx := grpcx.WithBearer(context.Background(), "k")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := client.GetExecution(ctx, &gatewayv1.GetExecutionRequest{Id: "abc"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchREST(b *testing.B, h http.Handler) {
	rest := httptest.NewServer(h)
	defer rest.Close()
	client := rest.Client()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest(http.MethodGet, rest.URL+"/v1/executions/abc", nil)
		req.Header.Set("Authorization", "Bearer k")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_ = resp.Body.Close()
	}
}
