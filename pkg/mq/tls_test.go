package mq

import (
	"crypto/tls"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// TestAMQPSConfig: an amqps:// URL's TLS configuration verifies the broker against cacertfile
// under the URL's host name (or server_name_indication), presents certfile/keyfile, and refuses
// a broker of another CA; amqp:// has none; a wrong parameter is an error that names it and not
// the URL's password.
func TestAMQPSConfig(t *testing.T) {
	dir := t.TempDir()
	_, err := devca.Ensure(dir, "settlement")
	require.NoError(t, err)
	serverSrc, err := tlsx.NewSource(tlsx.Files{CertFile: devca.CertFile(dir, devca.Public), KeyFile: devca.KeyFile(dir, devca.Public), CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	// A TLS endpoint standing for the broker, asking for a client certificate of the CA.
	srvCfg := tlsx.ServerConfig(serverSrc)
	srvCfg.ClientAuth, srvCfg.ClientCAs = tls.VerifyClientCertIfGiven, serverSrc.Pool()
	l, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	// Each connection's outcome: the number of client certificates, or -1 for a failed handshake,
	// so that a failure is seen rather than waited for.
	clientCerts := make(chan int, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := -1
			if err := c.(*tls.Conn).Handshake(); err == nil {
				n = len(c.(*tls.Conn).ConnectionState().PeerCertificates)
			}
			_ = c.Close()
			select {
			case clientCerts <- n:
			default: // nobody reads the failures of the handshakes meant to fail
			}
		}
	}()
	nextClientCerts := func() int {
		select {
		case n := <-clientCerts:
			return n
		case <-time.After(5 * time.Second):
			t.Fatal("the server saw no connection")
			return 0
		}
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	handshake := func(cfg *tls.Config) error {
		c, err := tls.Dial("tcp", l.Addr().String(), cfg)
		if err == nil {
			_ = c.Close()
		}
		return err
	}

	plain, err := newAMQPTLS("amqp://guest:guest@127.0.0.1:5672/")
	require.NoError(t, err)
	assert.Nil(t, plain, "amqp:// is plain text")

	q := url.Values{"cacertfile": {devca.CAFile(dir)}, "certfile": {devca.CertFile(dir, "settlement")}, "keyfile": {devca.KeyFile(dir, "settlement")}}
	withCA, err := newAMQPTLS("amqps://guest:secret@localhost:" + port + "/?" + q.Encode())
	require.NoError(t, err)
	cfg := withCA.config()
	assert.Equal(t, "localhost", cfg.ServerName, "the broker is verified under the URL's host")
	assert.GreaterOrEqual(t, cfg.MinVersion, uint16(tls.VersionTLS12))
	require.NoError(t, handshake(cfg), "the broker's certificate verifies against cacertfile")
	assert.Equal(t, 1, nextClientCerts(), "the handshake succeeds on the server's side too, with the client certificate presented")
	assert.NotSame(t, cfg, withCA.config(), "a fresh configuration per connection")

	wrongName, err := newAMQPTLS("amqps://guest:secret@127.0.0.1:" + port + "/?cacertfile=" + url.QueryEscape(devca.CAFile(dir)) + "&server_name_indication=rabbitmq.internal")
	require.NoError(t, err)
	assert.ErrorContains(t, handshake(wrongName.config()), "rabbitmq.internal", "server_name_indication is the name verified")

	other := t.TempDir()
	_, err = devca.Ensure(other)
	require.NoError(t, err)
	otherCA, err := newAMQPTLS("amqps://guest:secret@localhost:" + port + "/?cacertfile=" + url.QueryEscape(devca.CAFile(other)))
	require.NoError(t, err)
	assert.Error(t, handshake(otherCA.config()), "a broker of another CA is refused")

	system, err := newAMQPTLS("amqps://guest:secret@localhost:" + port + "/")
	require.NoError(t, err)
	assert.Nil(t, system.config().RootCAs, "no cacertfile: the system's roots")
	assert.Error(t, handshake(system.config()), "which do not hold the dev CA")

	_, err = newAMQPTLS("amqps://guest:secret@localhost/?cacertfile=/nonexistent/ca.pem")
	assert.ErrorContains(t, err, "cacertfile")
	assert.NotContains(t, err.Error(), "secret")
	_, err = newAMQPTLS("amqps://guest:secret@localhost/?certfile=/x.pem")
	assert.ErrorContains(t, err, "certfile and keyfile go together")
	_, err = newAMQPTLS("amqp://guest:secret@localhost/?cacertfile=/x.pem")
	assert.ErrorContains(t, err, "use amqps://")
}
