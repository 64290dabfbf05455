package stomp

import (
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
)

// selfSigned is a certificate for 127.0.0.1 and the pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "stomp test broker"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// stomp+ssl:// through a TLS-terminating relay in front of the broker (its own listener is
// plain): the handshake verifies the relay's certificate, then STOMP runs as over TCP.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
	p := newTLSProxy(t, stompURL(t), &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	tlsURL := p.url

	c := dial(t, tlsURL, WithTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	q := queue(t)
	send(t, c, q, "over TLS")
	require.Equal(t, "over TLS", string(recv(t, subscribe(t, c, q, SubscribeOptions{}), 5*time.Second).Body))

	_, err := Dial(testCtx(t, 5*time.Second), tlsURL) // the system's roots do not trust it
	var uerr x509.UnknownAuthorityError
	require.ErrorAs(t, err, &uerr)
}
