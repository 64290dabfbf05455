package grpcx_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

func internalOf(t *testing.T, dir, name string) *grpcx.Internal {
	t.Helper()
	in, err := grpcx.NewInternal(tlsx.Files{CertFile: devca.CertFile(dir, name), KeyFile: devca.KeyFile(dir, name), CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	return in
}

// TestPolicy: an mTLS server with a Policy answers health to a caller without a certificate,
// refuses its other methods to it and to a caller with another CA's certificate with
// UNAUTHENTICATED, to a platform service the Policy does not
// list with PERMISSION_DENIED, and a method the Policy does not name to everyone; it serves a
// listed caller; a plain-text client does not get through at all.
func TestPolicy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := devca.Ensure(dir)
	require.NoError(t, err)
	srv := grpcx.NewServer(grpcx.ServerConfig{
		Logger:   zap.NewNop(),
		Internal: internalOf(t, dir, "settlement"),
		Policy:   grpcx.Policy{"/test.Sleeper/Sleep": {"gateway", "adapter-callback"}},
		// Registered, so that the stream below reaches the policy (an unregistered service is
		// answered UNIMPLEMENTED before any interceptor).
		Reflection: true,
	})
	started := make(chan struct{}, 8)
	srv.RegisterService(sleepService(started), struct{}{})
	srv.RegisterService(echoService("test.Unlisted"), struct{}{})
	srv.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	addr := lis.Addr().String()

	anonID, err := grpcx.NewInternal(tlsx.Files{CAFile: devca.CAFile(dir)}) // verifies the server, presents nothing
	require.NoError(t, err)
	dial := func(opt grpc.DialOption) *grpc.ClientConn {
		conn, err := grpcx.Dial(addr, opt)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	call := func(conn *grpc.ClientConn, method string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return conn.Invoke(ctx, method, durationpb.New(0), &durationpb.Duration{})
	}
	health := func(conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	anonymous := dial(anonID.DialOption("settlement"))
	require.NoError(t, health(anonymous), "health needs no client certificate")
	assert.Equal(t, codes.Unauthenticated, status.Code(call(anonymous, "/test.Sleeper/Sleep")))

	// Another CA's certificate, naming a listed service: UNAUTHENTICATED, not a transport failure.
	other := t.TempDir()
	_, err = devca.Ensure(other, "gateway")
	require.NoError(t, err)
	forged, err := grpcx.NewInternal(tlsx.Files{CertFile: devca.CertFile(other, "gateway"), KeyFile: devca.KeyFile(other, "gateway"), CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	forgedConn := dial(forged.DialOption("settlement"))
	require.NoError(t, health(forgedConn), "health does not look at the certificate")
	err = call(forgedConn, "/test.Sleeper/Sleep")
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "the client certificate is not accepted")

	consumer := dial(internalOf(t, dir, "execution-consumer").DialOption("settlement"))
	err = call(consumer, "/test.Sleeper/Sleep")
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "execution-consumer may not call")

	gateway := dial(internalOf(t, dir, "gateway").DialOption("settlement"))
	require.NoError(t, call(gateway, "/test.Sleeper/Sleep"))
	<-started
	assert.Equal(t, codes.PermissionDenied, status.Code(call(gateway, "/test.Unlisted/Echo")), "deny by default")

	// The stream interceptor applies the policy too: reflection is not listed.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := gateway.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
	require.NoError(t, err)
	require.NoError(t, stream.CloseSend())
	assert.Equal(t, codes.PermissionDenied, status.Code(stream.RecvMsg(&durationpb.Duration{})))

	wrongPeer := dial(internalOf(t, dir, "gateway").DialOption("dispatcher"))
	assert.Equal(t, codes.Unavailable, status.Code(health(wrongPeer)), "a server of another identity is not talked to")

	plain := dial((*grpcx.Internal)(nil).DialOption("settlement"))
	assert.Equal(t, codes.Unavailable, status.Code(health(plain)), "a plain-text client is refused by the mTLS port")
}

// echoService is a one-method service, Echo, answering its request.
func echoService(name string) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: name,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Echo",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(durationpb.Duration)
				if err := dec(in); err != nil {
					return nil, err
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + name + "/Echo"},
					func(_ context.Context, req any) (any, error) { return req, nil })
			},
		}},
	}
}

// TestServiceIdentity: a service refuses to start with another service's certificate.
func TestServiceIdentity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := devca.Ensure(dir, "settlement")
	require.NoError(t, err)
	files := tlsx.Files{CertFile: devca.CertFile(dir, "settlement"), KeyFile: devca.KeyFile(dir, "settlement"), CAFile: devca.CAFile(dir)}
	in, err := grpcx.ServiceIdentity("settlement", files, zap.NewNop())
	require.NoError(t, err)
	assert.True(t, in.Enabled())
	_, err = grpcx.ServiceIdentity("dispatcher", files, zap.NewNop())
	assert.ErrorContains(t, err, "INTEGRATIONS_TLS_CERT_FILE: "+files.CertFile+" is not a certificate of spiffe://integrations/dispatcher")
	in, err = grpcx.ServiceIdentity("dispatcher", tlsx.Files{}, zap.NewNop())
	require.NoError(t, err)
	assert.False(t, in.Enabled(), "no files: plaintext")
}

// echoServer serves echoService("test.Echo") with mTLS as settlement, callable by gateway, with
// the internal identity in files and connections bounded by age (0: the default).
func echoServer(t *testing.T, files tlsx.Files, age time.Duration) string {
	t.Helper()
	in, err := grpcx.NewInternal(files, tlsx.CheckInterval(0))
	require.NoError(t, err)
	srv := grpcx.NewServer(grpcx.ServerConfig{
		Logger: zap.NewNop(), Internal: in, MaxConnectionAge: age,
		Policy: grpcx.Policy{"/test.Echo/Echo": {"gateway"}},
	})
	srv.RegisterService(echoService("test.Echo"), struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func echo(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return conn.Invoke(ctx, "/test.Echo/Echo", durationpb.New(0), &durationpb.Duration{})
}

// TestExpiredCertificateOnAnOpenConnection: a client certificate that expires while its
// connection is open is refused from then on, UNAUTHENTICATED, on that connection. Not parallel:
// it sets the package's clock.
func TestExpiredCertificateOnAnOpenConnection(t *testing.T) {
	dir := t.TempDir()
	_, err := devca.Ensure(dir, "settlement", "gateway")
	require.NoError(t, err)
	addr := echoServer(t, tlsx.Files{CertFile: devca.CertFile(dir, "settlement"), KeyFile: devca.KeyFile(dir, "settlement"), CAFile: devca.CAFile(dir)}, 0)
	conn, err := grpcx.Dial(addr, internalOf(t, dir, "gateway").DialOption("settlement"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, echo(conn))

	leaf := internalLeaf(t, devca.CertFile(dir, "gateway"))
	restore := grpcx.SetNow(func() time.Time { return leaf.NotAfter.Add(time.Second) })
	defer restore()
	err = echo(conn)
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "the client certificate expired at")
	restore()
	require.NoError(t, echo(conn), "the same connection, before the expiry")
}

// TestConnectionsReHandshakeAgainstANewCA: once an internal server's CA file is replaced, a
// connection opened under the old CA is closed at its maximum age, and its caller — whose
// certificate the new CA did not issue — is refused at the next handshake.
func TestConnectionsReHandshakeAgainstANewCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := devca.Ensure(dir, "settlement", "gateway")
	require.NoError(t, err)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	copyFile(t, devca.CAFile(dir), caFile)
	addr := echoServer(t, tlsx.Files{CertFile: devca.CertFile(dir, "settlement"), KeyFile: devca.KeyFile(dir, "settlement"), CAFile: caFile}, 300*time.Millisecond)
	conn, err := grpcx.Dial(addr, internalOf(t, dir, "gateway").DialOption("settlement"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, echo(conn))

	other := t.TempDir()
	_, err = devca.Ensure(other, "gateway")
	require.NoError(t, err)
	copyFile(t, devca.CAFile(other), caFile) // the old CA is no longer trusted
	require.Eventually(t, func() bool { return status.Code(echo(conn)) == codes.Unauthenticated }, 10*time.Second, 50*time.Millisecond,
		"the connection verified against the old CA is not used for ever")
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	tmp := to + ".tmp"
	require.NoError(t, os.WriteFile(tmp, b, 0o600))
	require.NoError(t, os.Rename(tmp, to))
}

func internalLeaf(t *testing.T, certFile string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(certFile)
	require.NoError(t, err)
	blk, _ := pem.Decode(b)
	require.NotNil(t, blk)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	require.NoError(t, err)
	return leaf
}

// TestServiceIdentityOfOneService: a certificate naming the service and another is refused at start.
func TestServiceIdentityOfOneService(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, err := devca.Ensure(dir, "settlement")
	require.NoError(t, err)
	var uris []*url.URL
	for _, id := range []string{tlsx.ID("settlement"), tlsx.ID("gateway")} {
		u, err := url.Parse(id)
		require.NoError(t, err)
		uris = append(uris, u)
	}
	two := filepath.Join(t.TempDir(), "two")
	require.NoError(t, ca.IssueTemplate(two+".pem", two+"-key.pem", &x509.Certificate{URIs: uris}))
	_, err = grpcx.ServiceIdentity("settlement", tlsx.Files{CertFile: two + ".pem", KeyFile: two + "-key.pem", CAFile: devca.CAFile(dir)}, zap.NewNop())
	assert.ErrorContains(t, err, "is not a certificate of spiffe://integrations/settlement")
}
