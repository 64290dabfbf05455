package httpapi_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
)

// BenchmarkRESTHop compares a REST call served through the loopback gRPC proxy with one served in
// process (the same interceptor chain in both), on a service that does nothing: the difference is
// the hop's own cost (docs/capacity.md, "Accept (issue 13)").
func BenchmarkRESTHop(b *testing.B) {
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
	cfg := httpapi.Config{MaxBodyBytes: 1 << 20}
	proxy, err := httpapi.Handler(context.Background(), conn, cfg)
	require.NoError(b, err)
	inproc, err := httpapi.InProcessHandler(context.Background(), svc, srv.Unary(), cfg)
	require.NoError(b, err)
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"proxy", proxy}, {"in-process", inproc}} {
		b.Run(c.name, func(b *testing.B) {
			rest := httptest.NewServer(c.h)
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
		})
	}
}
