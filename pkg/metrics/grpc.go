package metrics

import (
	"errors"
	"sync"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// The per-RPC metrics (grpc_server_* and grpc_client_*: started, handled by code, handling
// time histogram), one set per process on the default registry, shared by every server and
// client pkg/grpcx builds.
var (
	grpcOnce   sync.Once
	grpcServer *grpcprom.ServerMetrics
	grpcClient *grpcprom.ClientMetrics
)

func grpcMetrics() {
	grpcOnce.Do(func() {
		grpcServer = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(LatencyBuckets())))
		grpcClient = grpcprom.NewClientMetrics(grpcprom.WithClientHandlingTimeHistogram(grpcprom.WithHistogramBuckets(LatencyBuckets())))
		register(grpcServer)
		register(grpcClient)
	})
}

// register registers c on the default registry; one already there (a test that registered it)
// is kept.
func register(c prometheus.Collector) {
	if err := prometheus.DefaultRegisterer.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
	}
}

// GRPCServer is the process's per-RPC server metrics, for pkg/grpcx's interceptor chain.
func GRPCServer() *grpcprom.ServerMetrics {
	grpcMetrics()
	return grpcServer
}

// GRPCClient is the process's per-RPC client metrics, for pkg/grpcx's dial options.
func GRPCClient() *grpcprom.ClientMetrics {
	grpcMetrics()
	return grpcClient
}
