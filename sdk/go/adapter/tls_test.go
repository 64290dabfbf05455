package adapter_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
)

// tlsCallbacks is a fakeCallbacks that also records whether each Complete came over TLS.
type tlsCallbacks struct {
	*fakeCallbacks
	overTLS chan bool
}

func (f tlsCallbacks) Complete(ctx context.Context, in *adapterv1.CompleteRequest) (*adapterv1.CompleteResponse, error) {
	p, _ := peer.FromContext(ctx)
	_, ok := p.AuthInfo.(credentials.TLSInfo)
	f.overTLS <- ok
	return f.fakeCallbacks.Complete(ctx, in)
}

// TestCallbackDialOptionsCarryTLS: TLS credentials in Options.DialOptions, as the package doc shows
// them, replace the plaintext default of the callback connection.
func TestCallbackDialOptionsCarryTLS(t *testing.T) {
	t.Parallel()
	cert, roots := selfSigned(t)
	fake := tlsCallbacks{fakeCallbacks: &fakeCallbacks{completed: make(chan *adapterv1.CompleteRequest, 1)}, overTLS: make(chan bool, 4)}
	cbSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	b := serve(t, cbSrv, fake, fake.fakeCallbacks, func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Later(time.Minute, func(ctx context.Context, cb *adapter.Callbacks) adapter.Result {
			return adapter.Complete(map[string]any{"over": "tls"})
		})
	}, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})))

	resp := execute(t, b, map[string]any{}, executionv1.Mode_MODE_ASYNC)
	require.NotNil(t, resp.GetAccepted())
	c := awaitComplete(t, fake.fakeCallbacks)
	require.Equal(t, map[string]any{"over": "tls"}, c.GetSucceeded().GetResult().AsMap())
	require.True(t, <-fake.overTLS, "the outcome came over TLS")
}

// selfSigned is a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "callbacks"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}
