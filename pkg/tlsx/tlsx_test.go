package tlsx_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// secretVolume lays out files as a Kubernetes secret volume does — tls.crt → ..data/tls.crt,
// ..data → a timestamped directory — and rotates them as cert-manager's kubelet does: a new
// directory, then one rename of the ..data symlink.
type secretVolume struct {
	t   *testing.T
	dir string
	ca  *devca.CA
	gen int
}

func newSecretVolume(t *testing.T, ca *devca.CA, name string) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir(), ca: ca}
	v.rotate(name)
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		require.NoError(t, os.Symlink(filepath.Join("..data", f), filepath.Join(v.dir, f)))
	}
	return v
}

func (v *secretVolume) rotate(name string) {
	v.gen++
	ts := filepath.Join(v.dir, "..2026_"+string(rune('a'+v.gen)))
	require.NoError(v.t, os.Mkdir(ts, 0o700))
	require.NoError(v.t, v.ca.IssueTo(filepath.Join(ts, "tls.crt"), filepath.Join(ts, "tls.key"), name))
	ca, err := os.ReadFile(devca.CAFile(v.ca.Dir()))
	require.NoError(v.t, err)
	require.NoError(v.t, os.WriteFile(filepath.Join(ts, "ca.crt"), ca, 0o600))
	tmp := filepath.Join(v.dir, "..data_tmp")
	require.NoError(v.t, os.Symlink(filepath.Base(ts), tmp))
	require.NoError(v.t, os.Rename(tmp, filepath.Join(v.dir, "..data")))
}

func (v *secretVolume) files() tlsx.Files {
	return tlsx.Files{CertFile: filepath.Join(v.dir, "tls.crt"), KeyFile: filepath.Join(v.dir, "tls.key"), CAFile: filepath.Join(v.dir, "ca.crt")}
}

func (v *secretVolume) leaf() *x509.Certificate {
	c, err := tls.LoadX509KeyPair(v.files().CertFile, v.files().KeyFile)
	require.NoError(v.t, err)
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	require.NoError(v.t, err)
	return leaf
}

// serve runs a TLS server that answers each connection with the client's identity, if any,
// verified against src's CA (nil: not looked at).
func serve(t *testing.T, cfg *tls.Config, src ...*tlsx.Source) (string, <-chan string) {
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	peers := make(chan string, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if err := tc.Handshake(); err != nil {
				peers <- "handshake failed"
			} else if len(src) == 0 {
				peers <- "unchecked"
			} else if id, err := tlsx.VerifyClient(src[0], tc.ConnectionState()); err == nil {
				peers <- id.Service
			} else if errors.Is(err, tlsx.ErrNoClientCertificate) {
				peers <- "anonymous"
			} else {
				peers <- "refused"
			}
			_ = c.Close()
		}
	}()
	return l.Addr().String(), peers
}

// served dials addr and returns the serial of the certificate the server presented.
func served(t *testing.T, addr string, cfg *tls.Config) (*x509.Certificate, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0], nil
}

// TestRotationWithoutRestart: a server and a client built on Sources keep working across a
// rotation of their files by symlink swap, and the server presents the new certificate — and
// the client its new one — from the first handshake after the check interval, with no restart.
func TestRotationWithoutRestart(t *testing.T) {
	ca, err := devca.NewCA(t.TempDir())
	require.NoError(t, err)
	serverVol := newSecretVolume(t, ca, "settlement")
	clientVol := newSecretVolume(t, ca, "gateway")
	const interval = 50 * time.Millisecond
	serverSrc, err := tlsx.NewSource(serverVol.files(), tlsx.CheckInterval(interval))
	require.NoError(t, err)
	clientSrc, err := tlsx.NewSource(clientVol.files(), tlsx.CheckInterval(interval))
	require.NoError(t, err)
	addr, peers := serve(t, tlsx.MutualServerConfig(serverSrc), serverSrc)
	client := tlsx.ClientConfig(clientSrc, "settlement")

	first := serverVol.leaf()
	got, err := served(t, addr, client)
	require.NoError(t, err)
	assert.Equal(t, first.SerialNumber, got.SerialNumber)
	assert.Equal(t, "gateway", <-peers)

	serverVol.rotate("settlement")
	clientVol.rotate("gateway")
	second := serverVol.leaf()
	require.NotEqual(t, first.SerialNumber, second.SerialNumber)
	require.Eventually(t, func() bool {
		got, err := served(t, addr, client)
		require.NoError(t, err, "every handshake across the rotation succeeds")
		require.Equal(t, "gateway", <-peers)
		return got.SerialNumber.Cmp(second.SerialNumber) == 0
	}, 5*time.Second, interval/5, "the rotated certificate is served after the check interval")
	assert.NoError(t, serverSrc.Err())
}

// TestBadRotationKeepsTheLoadedCertificate: a change that does not load (a half-written file)
// keeps the last good certificate and reports the failure; the next good change is taken.
func TestBadRotationKeepsTheLoadedCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := devca.Ensure(dir, "dispatcher")
	require.NoError(t, err)
	files := tlsx.Files{CertFile: devca.CertFile(dir, "dispatcher"), KeyFile: devca.KeyFile(dir, "dispatcher"), CAFile: devca.CAFile(dir)}
	var reloads []error
	src, err := tlsx.NewSource(files, tlsx.CheckInterval(0), tlsx.OnReload(func(_ tlsx.Files, err error) { reloads = append(reloads, err) }))
	require.NoError(t, err)
	before := src.Certificate()
	require.NoError(t, os.WriteFile(files.CertFile, []byte("-----BEGIN CERTIFICATE-----\ntrunc"), 0o600))
	for range 5 { // several checks of the same bad files: one load, one report
		assert.Same(t, before, src.Certificate(), "the last good certificate is kept")
		src.Pool()
		assert.Error(t, src.Err())
	}
	require.Len(t, reloads, 1, "one bad change is reported once, not at every check")
	require.NoError(t, ca.Issue("dispatcher"))
	assert.NotSame(t, before, src.Certificate())
	assert.NoError(t, src.Err())
	require.Len(t, reloads, 2, "each change is reported once")
	assert.Error(t, reloads[0])
	assert.NoError(t, reloads[1])

	// A file gone for a moment (a careless swap) is reported once; back unchanged, all is well.
	moved := files.CAFile + ".away"
	require.NoError(t, os.Rename(files.CAFile, moved))
	src.Pool()
	src.Pool()
	assert.ErrorContains(t, src.Err(), "ca.pem")
	require.NoError(t, os.Rename(moved, files.CAFile))
	src.Pool()
	assert.NoError(t, src.Err())
	assert.Len(t, reloads, 3)

	// Gone and back while a bad change is in place: still the bad change, not reported again.
	require.NoError(t, os.WriteFile(files.KeyFile, []byte("not a key"), 0o600))
	src.Pool()
	require.Len(t, reloads, 4)
	require.NoError(t, os.Rename(files.CAFile, moved))
	src.Pool()
	require.NoError(t, os.Rename(moved, files.CAFile))
	src.Pool()
	src.Pool()
	assert.ErrorContains(t, src.Err(), "dispatcher-key.pem", "the bad key is still the error")
	assert.Len(t, reloads, 4)
}

// TestIdentityIsChecked: a client refuses a server of another identity or another CA; a server
// sees no identity for a client without a certificate, and refuses one from another CA.
func TestIdentityIsChecked(t *testing.T) {
	dir := t.TempDir()
	_, err := devca.Ensure(dir)
	require.NoError(t, err)
	src := func(dir, name string) *tlsx.Source {
		s, err := tlsx.NewSource(tlsx.Files{CertFile: devca.CertFile(dir, name), KeyFile: devca.KeyFile(dir, name), CAFile: devca.CAFile(dir)})
		require.NoError(t, err)
		return s
	}
	settlement := src(dir, "settlement")
	addr, peers := serve(t, tlsx.MutualServerConfig(settlement), settlement)

	_, err = served(t, addr, tlsx.ClientConfig(src(dir, "gateway"), "dispatcher"))
	assert.ErrorContains(t, err, "is not spiffe://integrations/dispatcher")
	<-peers

	anon, err := tlsx.NewSource(tlsx.Files{CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	_, err = served(t, addr, tlsx.ClientConfig(anon, "settlement"))
	require.NoError(t, err, "a client without a certificate gets through the handshake (health probes)")
	assert.Equal(t, "anonymous", <-peers)

	other := t.TempDir()
	_, err = devca.Ensure(other, "gateway")
	require.NoError(t, err)
	_, err = served(t, addr, tlsx.ClientConfig(src(other, "gateway"), "settlement"))
	assert.Error(t, err, "another CA's server is refused")
	<-peers
	otherClient, err := tlsx.NewSource(tlsx.Files{CertFile: devca.CertFile(other, "gateway"), KeyFile: devca.KeyFile(other, "gateway"), CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	_, err = served(t, addr, tlsx.ClientConfig(otherClient, "settlement"))
	require.NoError(t, err, "the handshake lets another CA's client through")
	assert.Equal(t, "refused", <-peers, "and its certificate is not accepted")

	_, err = served(t, addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}) //nolint:gosec // the point
	assert.Error(t, err, "TLS 1.1 is refused")
	<-peers
}

// TestOneIdentityPerCertificate: a certificate with two URI SANs, even both of the platform,
// is refused as a client's and as a server's: one certificate is one identity.
func TestOneIdentityPerCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := devca.Ensure(dir, "settlement", "gateway")
	require.NoError(t, err)
	two := filepath.Join(t.TempDir(), "two")
	var uris []*url.URL
	for _, id := range []string{tlsx.ID("settlement"), tlsx.ID("gateway")} {
		u, err := url.Parse(id)
		require.NoError(t, err)
		uris = append(uris, u)
	}
	require.NoError(t, ca.IssueTemplate(two+".pem", two+"-key.pem", &x509.Certificate{URIs: uris}))
	twoSrc, err := tlsx.NewSource(tlsx.Files{CertFile: two + ".pem", KeyFile: two + "-key.pem", CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	src := func(name string) *tlsx.Source {
		s, err := tlsx.NewSource(tlsx.Files{CertFile: devca.CertFile(dir, name), KeyFile: devca.KeyFile(dir, name), CAFile: devca.CAFile(dir)})
		require.NoError(t, err)
		return s
	}

	settlement := src("settlement")
	addr, peers := serve(t, tlsx.MutualServerConfig(settlement), settlement)
	_, err = served(t, addr, tlsx.ClientConfig(twoSrc, "settlement"))
	require.NoError(t, err)
	assert.Equal(t, "refused", <-peers, "a client certificate with two identities")
	_, err = served(t, addr, tlsx.ClientConfig(src("gateway"), "settlement"))
	require.NoError(t, err)
	assert.Equal(t, "gateway", <-peers)

	twoAddr, twoPeers := serve(t, tlsx.MutualServerConfig(twoSrc), twoSrc)
	_, err = served(t, twoAddr, tlsx.ClientConfig(src("gateway"), "settlement"))
	assert.ErrorContains(t, err, "exactly one URI SAN", "a server certificate with two identities")
	<-twoPeers

	leaf, err := x509.ParseCertificate(twoSrc.Certificate().Certificate[0])
	require.NoError(t, err)
	_, err = tlsx.IdentityOf(leaf)
	assert.ErrorContains(t, err, "2 URI SANs")
}

func TestServiceOf(t *testing.T) {
	for id, want := range map[string]string{
		"spiffe://integrations/settlement":         "settlement",
		"spiffe://other/settlement":                "",
		"spiffe://integrations/a/b":                "",
		"https://integrations/settlement":          "",
		"spiffe://integrations/":                   "",
		"spiffe://integrations/gateway?x":          "",
		"spiffe://integrations/gateway#x":          "",
		"spiffe://u@integrations/gateway":          "",
		"spiffe://integrations:1/gateway":          "",
		"spiffe://integrations/Gateway":            "",
		"spiffe://integrations/gate%77ay":          "",
		"spiffe://INTEGRATIONS/gateway":            "",
		"spiffe://integrations/execution-consumer": "execution-consumer",
	} {
		u, err := urlParse(id)
		require.NoError(t, err)
		got, ok := tlsx.ServiceOf(u)
		assert.Equal(t, want, got, id)
		assert.Equal(t, want != "", ok, id)
	}
}

func urlParse(s string) (*url.URL, error) { return url.Parse(s) }

// FuzzServiceOf: whatever a certificate's URI SAN says, an identity is accepted only in its one
// spelling, ID(name), as parsed: x509 hands the SAN over as a *url.URL, whose scheme url.Parse
// has already lowercased (RFC 3986: schemes are case-insensitive), so "Spiffe://integrations/x"
// names x as "spiffe://…" does — found by this target.
func FuzzServiceOf(f *testing.F) {
	for _, s := range []string{"spiffe://integrations/settlement", "spiffe://integrations/a/b", "spiffe://integrations/x?y",
		"spiffe://u@integrations/gateway", "spiffe://integrations/gate%77ay", "spiffe:integrations/gateway",
		"Spiffe://integrations/0", "spiffe://INTEGRATIONS/gateway"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		name, ok := tlsx.ServiceOf(u)
		if ok && tlsx.ID(name) != u.String() {
			t.Fatalf("%q accepted as %q", s, name)
		}
	})
}
