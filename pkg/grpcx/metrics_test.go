package grpcx

import (
	"context"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A call through a server and a client of this package is counted by the per-RPC metrics on
// both sides, with its handling time.
func TestPerRPCMetrics(t *testing.T) {
	srv := NewServer(ServerConfig{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := Dial(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	const method = "Check"
	before := map[string]uint64{}
	for _, name := range []string{"grpc_server_handling_seconds", "grpc_client_handling_seconds"} {
		before[name] = histogramCount(t, name, method)
	}
	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	for name, n := range before {
		require.Equal(t, n+1, histogramCount(t, name, method), name)
	}
}

// histogramCount is the sample count of the histogram name for grpc_method method (0 if none).
func histogramCount(t *testing.T, name, method string) uint64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "grpc_method") == method {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
