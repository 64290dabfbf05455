// Package tlsx builds the platform's TLS configurations from PEM files that are re-read when they
// change, so that a certificate rotated on disk (cert-manager, a renewed dev CA) is served and
// presented without a restart.
//
// Files are checked by path, never by open file or inode: cert-manager's secret volumes replace
// files by swapping a symlink (..data), which a stat of the path follows. A check is a stat of
// each file, at most once per CheckInterval, on the next handshake: no goroutine, no watcher.
// A change that cannot be loaded (a half-written file, a key that does not match) keeps the
// material last loaded and is reported once: it is retried when the files change again, not at
// every check while they stay as they are.
//
// Service identity is a SPIFFE ID in the certificate's URI SAN: spiffe://integrations/<service>.
// Clients verify a peer's chain against the internal CA and its identity against the service
// they meant to reach, not a host name: the same certificate works behind any address
// (127.0.0.1 in development, a Kubernetes Service name in production).
package tlsx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// TrustDomain is the SPIFFE trust domain of the platform's services.
const TrustDomain = "integrations"

// DefaultCheckInterval is how often files are stat'ed for a change, at most.
const DefaultCheckInterval = 2 * time.Second

// ID is the SPIFFE ID of a service: spiffe://integrations/<service>.
func ID(service string) string { return "spiffe://" + TrustDomain + "/" + service }

// ServiceOf returns the service named by a SPIFFE ID of the platform's trust domain: exactly
// spiffe://integrations/<name>, name of lower-case letters, digits and dashes — no port, user,
// query, fragment or escapes, so that one identity has one spelling.
func ServiceOf(id *url.URL) (string, bool) {
	if id == nil || id.Scheme != "spiffe" || id.Host != TrustDomain || id.User != nil || id.Opaque != "" ||
		id.RawPath != "" || id.RawQuery != "" || id.ForceQuery || id.Fragment != "" || id.RawFragment != "" {
		return "", false
	}
	name, ok := strings.CutPrefix(id.Path, "/")
	if !ok || name == "" || len(name) > 63 {
		return "", false
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return "", false
		}
	}
	return name, true
}

// Files names the PEM files of a Source. CAFile may be empty for a Source that only serves (a
// client-facing listener), CertFile and KeyFile for one that only verifies.
type Files struct {
	CertFile, KeyFile, CAFile string
}

// Source is TLS material loaded from files and reloaded when they change. Safe for concurrent use.
type Source struct {
	files    Files
	interval time.Duration
	now      func() time.Time
	onReload func(Files, error)

	mu        sync.Mutex
	checked   time.Time
	stamps    map[string]stamp
	cert      *tls.Certificate
	pool      *x509.CertPool
	lastError error
	statError bool // lastError is a stat's: cleared when the files are back unchanged
	// failed is the stamps of the last change that did not load: the same files are not loaded
	// (and reported) again at every check, only once they change again.
	failed    map[string]stamp
	failedErr error
}

type stamp struct {
	mod  time.Time
	size int64
}

// Option configures a Source.
type Option func(*Source)

// CheckInterval sets how often the files are stat'ed, at most (default DefaultCheckInterval).
func CheckInterval(d time.Duration) Option { return func(s *Source) { s.interval = d } }

// OnReload is called after each reload a change of the files caused, with its error (nil: the
// new material is in use; otherwise the last good material stays), e.g. to log it. It runs on a
// handshake's goroutine, under the Source's lock: it must not call the Source.
func OnReload(f func(Files, error)) Option { return func(s *Source) { s.onReload = f } }

// NewSource loads the files at once: a missing or invalid file is an error naming it.
func NewSource(files Files, opts ...Option) (*Source, error) {
	s := &Source{files: files, interval: DefaultCheckInterval, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, errors.New("tlsx: a certificate needs both its cert file and its key file")
	}
	if files.CertFile == "" && files.CAFile == "" {
		return nil, errors.New("tlsx: no file given")
	}
	stamps, err := s.stat()
	if err != nil {
		return nil, err
	}
	if err := s.load(stamps); err != nil {
		return nil, err
	}
	s.checked = s.now()
	return s, nil
}

func (s *Source) paths() []string {
	var out []string
	for _, p := range []string{s.files.CertFile, s.files.KeyFile, s.files.CAFile} {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (s *Source) stat() (map[string]stamp, error) {
	out := map[string]stamp{}
	for _, p := range s.paths() {
		fi, err := os.Stat(p) // follows symlinks: a swapped ..data link is a change
		if err != nil {
			return nil, fmt.Errorf("tlsx: %w", err)
		}
		out[p] = stamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return out, nil
}

func (s *Source) load(stamps map[string]stamp) error {
	var cert *tls.Certificate
	if s.files.CertFile != "" {
		c, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
		if err != nil {
			return fmt.Errorf("tlsx: load %s and %s: %w", s.files.CertFile, s.files.KeyFile, err)
		}
		cert = &c
	}
	var pool *x509.CertPool
	if s.files.CAFile != "" {
		pem, err := os.ReadFile(s.files.CAFile)
		if err != nil {
			return fmt.Errorf("tlsx: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tlsx: %s holds no PEM certificate", s.files.CAFile)
		}
	}
	s.cert, s.pool, s.stamps, s.lastError, s.failed, s.failedErr = cert, pool, stamps, nil, nil, nil
	return nil
}

// differ says whether two sets of stamps name different file versions (nil differs from any).
func differ(a, b map[string]stamp) bool {
	if a == nil || b == nil || len(a) != len(b) {
		return true
	}
	for p, st := range b {
		if old, ok := a[p]; !ok || !old.mod.Equal(st.mod) || old.size != st.size {
			return true
		}
	}
	return false
}

// refresh reloads the files if a check is due and one of them changed.
func (s *Source) refresh() {
	now := s.now()
	if now.Sub(s.checked) < s.interval {
		return
	}
	s.checked = now
	stamps, err := s.stat()
	if err != nil {
		if s.lastError == nil && s.onReload != nil {
			s.onReload(s.files, err) // reported once, not at every check while it lasts
		}
		s.lastError, s.statError = err, true
		return
	}
	if s.statError {
		s.lastError, s.statError = nil, false
		if s.failed != nil && !differ(s.failed, stamps) {
			s.lastError = s.failedErr // back as they were when they failed to load: still failed
		}
	}
	if !differ(s.stamps, stamps) || !differ(s.failed, stamps) {
		return // unchanged, or the very files that already failed to load (reported then)
	}
	if err := s.load(stamps); err != nil {
		// Keep serving what was loaded; retried when the files change again.
		s.lastError, s.failed, s.failedErr = err, stamps, err
		if s.onReload != nil {
			s.onReload(s.files, err)
		}
		return
	}
	if s.onReload != nil {
		s.onReload(s.files, nil)
	}
}

// Certificate returns the current certificate (nil if the Source has none).
func (s *Source) Certificate() *tls.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refresh()
	return s.cert
}

// Pool returns the current CA pool (nil if the Source has none).
func (s *Source) Pool() *x509.CertPool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refresh()
	return s.pool
}

// Err is the last reload's failure, nil once a reload succeeds: for a health report or a log.
func (s *Source) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastError
}

// base is TLS 1.2 at least (1.3 is negotiated whenever both ends have it, which Go's do).
func base() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12}
}

// ServerConfig is a client-facing listener's: the Source's certificate, no client certificate
// asked for (clients authenticate with API keys or adapter credentials).
func ServerConfig(src *Source) *tls.Config {
	cfg := base()
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if c := src.Certificate(); c != nil {
			return c, nil
		}
		return nil, errors.New("tlsx: no server certificate")
	}
	return cfg
}

// MutualServerConfig is an internal listener's: the Source's certificate, and a client
// certificate asked for but not verified in the handshake. The handshake lets a caller without a
// valid one through — health probes present none — so that the authorization interceptor
// (grpcx.Policy) can answer it UNAUTHENTICATED, a status the caller can act on, rather than a
// transport failure; the interceptor refuses every method but health to a caller whose
// certificate VerifyClient does not accept. Verification happens once per connection.
func MutualServerConfig(src *Source) *tls.Config {
	cfg := base()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base()
		c.NextProtos = []string{"h2"} // gRPC's; a config returned here does not inherit the parent's
		cert, pool := src.Certificate(), src.Pool()
		if cert == nil || pool == nil {
			return nil, errors.New("tlsx: no certificate or CA to serve mTLS with")
		}
		c.Certificates = []tls.Certificate{*cert}
		c.ClientAuth = tls.RequestClientCert
		c.ClientCAs = pool // advertised, so that a client picks the right certificate; verified after the handshake
		return c, nil
	}
	return cfg
}

// ClientConfig is an internal client's: it presents the Source's certificate (if any) and
// accepts only a server whose chain verifies against the Source's CA and whose SPIFFE ID is
// ID(peer). Host names are not checked: the identity is.
func ClientConfig(src *Source, peer string) *tls.Config {
	cfg := base()
	want := ID(peer)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if c := src.Certificate(); c != nil {
			return c, nil
		}
		return &tls.Certificate{}, nil // none: the server decides
	}
	// The standard verification checks a host name; ours checks the identity, in VerifyConnection.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tlsx: the server presented no certificate")
		}
		if _, err := verifyChain(src, cs.PeerCertificates, x509.ExtKeyUsageServerAuth); err != nil {
			return fmt.Errorf("tlsx: server certificate: %w", err)
		}
		if leaf := cs.PeerCertificates[0]; len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
			return fmt.Errorf("tlsx: the server is not %s (a platform certificate has exactly one URI SAN, its identity; this one has %d)", want, len(leaf.URIs))
		}
		return nil
	}
	return cfg
}

// ErrNoClientCertificate is VerifyClient's error for a client that presented none.
var ErrNoClientCertificate = errors.New("no client certificate")

// ClientIdentity is a verified client certificate's identity and the end of its validity.
type ClientIdentity struct {
	Service string
	// NotAfter is the earliest expiry in the verified chain (the leaf's, or an intermediate's
	// if sooner): the identity is not to be honoured after it.
	NotAfter time.Time
}

// VerifyClient verifies the client certificate of a connection against the Source's CA (for
// client authentication) and returns its identity: the platform service its one URI SAN names.
// A certificate with several URI SANs is refused, so that one certificate is one identity.
func VerifyClient(src *Source, cs tls.ConnectionState) (ClientIdentity, error) {
	if len(cs.PeerCertificates) == 0 {
		return ClientIdentity{}, ErrNoClientCertificate
	}
	chains, err := verifyChain(src, cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return ClientIdentity{}, fmt.Errorf("client certificate: %w", err)
	}
	leaf := cs.PeerCertificates[0]
	name, err := IdentityOf(leaf)
	if err != nil {
		return ClientIdentity{}, fmt.Errorf("client certificate: %w", err)
	}
	id := ClientIdentity{Service: name, NotAfter: leaf.NotAfter}
	for _, c := range chains[0] {
		if c.NotAfter.Before(id.NotAfter) {
			id.NotAfter = c.NotAfter
		}
	}
	return id, nil
}

// verifyChain verifies a peer's chain (its leaf first) against the Source's CA, for usage.
func verifyChain(src *Source, certs []*x509.Certificate, usage x509.ExtKeyUsage) ([][]*x509.Certificate, error) {
	pool := src.Pool()
	if pool == nil {
		return nil, errors.New("no CA to verify it with")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	return certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
}

// IdentityOf returns the platform service a certificate names: it must have exactly one URI
// SAN, a SPIFFE ID of the platform's trust domain (ServiceOf).
func IdentityOf(cert *x509.Certificate) (string, error) {
	if len(cert.URIs) != 1 {
		return "", fmt.Errorf("%d URI SANs: a platform certificate has exactly one, spiffe://%s/<service>", len(cert.URIs), TrustDomain)
	}
	name, ok := ServiceOf(cert.URIs[0])
	if !ok {
		return "", errors.New("it names no platform service")
	}
	return name, nil
}
