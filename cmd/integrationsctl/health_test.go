package main

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/integrations-platform/integrations/pkg/freeport"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// healthServer serves a grpcx server (its health service only) on a loopback port, with
// "draining" reported NOT_SERVING beside the server's own SERVING.
func healthServer(t *testing.T, cfg grpcx.ServerConfig) string {
	t.Helper()
	cfg.Logger = zap.NewNop()
	srv := grpcx.NewServer(cfg)
	srv.Health.SetServingStatus("draining", healthpb.HealthCheckResponse_NOT_SERVING)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// requireHealthError: the check failed with one line (what a probe's log shows) containing want.
func requireHealthError(t *testing.T, err error, want string) {
	t.Helper()
	require.Error(t, err)
	require.NotContains(t, err.Error(), "\n", "one line")
	require.Contains(t, err.Error(), want)
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr() // outside the ephemeral range: a closed port there can connect to itself
	require.NoError(t, err)
	return addr
}

// TestHealthPlaintext: SERVING is success; a NOT_SERVING or unknown service, an unreachable
// address and a server that never answers are errors, the last one within --timeout.
func TestHealthPlaintext(t *testing.T) {
	t.Parallel()
	addr := healthServer(t, grpcx.ServerConfig{})

	_, _, err := runCtl(t, "health", "--addr", addr)
	require.NoError(t, err)

	_, _, err = runCtl(t, "health", "--addr", addr, "--service", "draining")
	requireHealthError(t, err, `health of `+addr+` (service "draining"): NOT_SERVING`)

	_, _, err = runCtl(t, "health", "--addr", addr, "--service", "nonesuch")
	// grpc-go answers NOT_FOUND; grpcx's error mapping turns it into INTERNAL (a code the probe
	// only reports).
	requireHealthError(t, err, `health of `+addr+` (service "nonesuch"): `)

	dead := closedAddr(t)
	_, _, err = runCtl(t, "health", "--addr", dead)
	requireHealthError(t, err, "health of "+dead+` (service ""): Unavailable: `)

	// A port that accepts connections and never speaks gRPC: the timeout ends the wait.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = mute.Close() })
	held := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		for len(held) > 0 {
			_ = (<-held).Close()
		}
	})
	start := time.Now()
	_, _, err = runCtl(t, "health", "--addr", mute.Addr().String(), "--timeout", "300ms")
	requireHealthError(t, err, "health of "+mute.Addr().String())
	// gRPC's connect timeout is 20 s (its minimum), --timeout 300 ms: under 10 s can only be
	// --timeout, with seconds of margin either side for a loaded machine.
	require.Less(t, time.Since(start), 10*time.Second, "bounded by --timeout, not by gRPC's connect timeout")

	_, _, err = runCtl(t, "health")
	require.ErrorContains(t, err, `"addr" not set`)
	_, _, err = runCtl(t, "health", "--addr", addr, "--ca-file", "ca.pem")
	require.ErrorContains(t, err, "--ca-file needs --tls")
}

// TestHealthInternalTLS: against an internal (mTLS) server, --identity verifies the chain
// against the internal CA and the URI SAN: the right identity is SERVING without a client
// certificate and with one; another service's identity or another CA is refused.
func TestHealthInternalTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := devca.Ensure(dir, "settlement", "gateway")
	require.NoError(t, err)
	in, err := grpcx.NewInternal(tlsx.Files{CertFile: devca.CertFile(dir, "settlement"), KeyFile: devca.KeyFile(dir, "settlement"), CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	addr := healthServer(t, grpcx.ServerConfig{Internal: in, Policy: grpcx.Policy{}})
	tlsArgs := func(identity string, extra ...string) []string {
		return append([]string{"health", "--addr", addr, "--tls", "--ca-file", devca.CAFile(dir), "--identity", identity}, extra...)
	}

	_, _, err = runCtl(t, tlsArgs("spiffe://integrations/settlement")...)
	require.NoError(t, err)
	_, _, err = runCtl(t, tlsArgs("spiffe://integrations/settlement", "--cert-file", devca.CertFile(dir, "gateway"), "--key-file", devca.KeyFile(dir, "gateway"))...)
	require.NoError(t, err)
	_, _, err = runCtl(t, tlsArgs("spiffe://integrations/settlement", "--service", "draining")...)
	requireHealthError(t, err, "NOT_SERVING")

	_, _, err = runCtl(t, tlsArgs("spiffe://integrations/dispatcher")...)
	requireHealthError(t, err, "the server is not spiffe://integrations/dispatcher")

	other := t.TempDir()
	_, err = devca.Ensure(other)
	require.NoError(t, err)
	_, _, err = runCtl(t, "health", "--addr", addr, "--tls", "--ca-file", devca.CAFile(other), "--identity", "spiffe://integrations/settlement")
	requireHealthError(t, err, "server certificate")

	// Plaintext to a TLS port is not SERVING either.
	_, _, err = runCtl(t, "health", "--addr", addr)
	requireHealthError(t, err, "health of "+addr)

	_, _, err = runCtl(t, "health", "--addr", addr, "--tls", "--identity", "spiffe://integrations/settlement")
	require.ErrorContains(t, err, "--identity needs --ca-file")
	_, _, err = runCtl(t, tlsArgs("https://integrations/settlement")...)
	require.ErrorContains(t, err, "is not spiffe://integrations/<service>")
}

// TestHealthPublicTLS: without --identity, --tls verifies a client-facing certificate the
// standard way, host name included.
func TestHealthPublicTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := devca.Ensure(dir) // public.pem is for 127.0.0.1, ::1 and localhost
	require.NoError(t, err)
	src, err := tlsx.NewSource(tlsx.Files{CertFile: devca.CertFile(dir, "public"), KeyFile: devca.KeyFile(dir, "public")})
	require.NoError(t, err)
	addr := healthServer(t, grpcx.ServerConfig{Public: grpcx.PublicCredentials(src)})

	_, _, err = runCtl(t, "health", "--addr", addr, "--tls", "--ca-file", devca.CAFile(dir))
	require.NoError(t, err)

	// The system's roots do not know the dev CA.
	_, _, err = runCtl(t, "health", "--addr", addr, "--tls")
	requireHealthError(t, err, "certificate")
}
