// Package devca writes a throwaway certificate authority and one certificate per service, for
// `make run`, the e2e stacks and the benchmarks: the internal hops run with mTLS every day, not
// only in production. Nothing it writes is meant to leave the machine: keys are ECDSA P-256,
// unencrypted, readable by the owner only.
//
// Layout of a directory:
//
//	ca.pem                      the CA certificate (INTEGRATIONS_TLS_CA_FILE)
//	<service>.pem, <service>-key.pem  a service's identity, URI SAN spiffe://integrations/<service>
//	public.pem, public-key.pem  a client-facing server certificate for 127.0.0.1, ::1 and localhost
package devca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/integrations-platform/integrations/pkg/tlsx"
)

// Services are the identities Generate issues by default: the platform's six services.
var Services = []string{"gateway", "dispatcher", "execution-consumer", "adapter-callback", "settlement", "event-router"}

// Public is the name of the client-facing certificate's files.
const Public = "public"

// validity of what Generate issues: long enough for a checkout, short enough to be throwaway.
const validity = 90 * 24 * time.Hour

// CA is a loaded certificate authority that can issue certificates.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// CertFile is the path of the certificate of service name in dir.
func CertFile(dir, name string) string { return filepath.Join(dir, name+".pem") }

// KeyFile is the path of the private key of service name in dir.
func KeyFile(dir, name string) string { return filepath.Join(dir, name+"-key.pem") }

// CAFile is the path of the CA's certificate in dir.
func CAFile(dir string) string { return filepath.Join(dir, "ca.pem") }

// Ensure makes sure dir holds a CA valid for at least a day and a certificate for each service
// and for Public, issuing what is missing or about to expire. It returns the CA.
func Ensure(dir string, services ...string) (*CA, error) {
	if len(services) == 0 {
		services = Services
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	// MkdirAll leaves an existing directory's mode as it is: the keys' directory is the owner's only.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	ca, err := Load(dir)
	if err != nil {
		if ca, err = NewCA(dir); err != nil {
			return nil, err
		}
	}
	for _, name := range append(append([]string{}, services...), Public) {
		if fresh(CertFile(dir, name), ca.cert) {
			continue
		}
		if name == Public {
			err = ca.IssuePublic(name, "localhost")
		} else {
			err = ca.Issue(name)
		}
		if err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// fresh says whether a certificate exists, is signed by ca and is valid for at least a day.
func fresh(path string, ca *x509.Certificate) bool {
	c, err := readCert(path)
	return err == nil && c.CheckSignatureFrom(ca) == nil && time.Until(c.NotAfter) > 24*time.Hour
}

// NewCA writes a new CA in dir, replacing any.
func NewCA(dir string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "integrations dev CA", Organization: []string{"integrations (throwaway)"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity + 24*time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	if err := write(CAFile(dir), filepath.Join(dir, "ca-key.pem"), der, key); err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, dir: dir}, nil
}

// Load reads the CA in dir.
func Load(dir string) (*CA, error) {
	cert, err := readCert(CAFile(dir))
	if err != nil {
		return nil, err
	}
	if time.Until(cert.NotAfter) < 24*time.Hour {
		return nil, errors.New("devca: the CA expires within a day")
	}
	b, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("devca: ca-key.pem holds no PEM block")
	}
	key, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("devca: ca-key.pem: %w", err)
	}
	return &CA{cert: cert, key: key, dir: dir}, nil
}

// Dir is where the CA's files are.
func (ca *CA) Dir() string { return ca.dir }

// Issue writes a certificate for a service of the platform: URI SAN spiffe://integrations/<name>,
// usable as a server's and a client's, written to <name>.pem and <name>-key.pem.
func (ca *CA) Issue(name string) error {
	u, err := url.Parse(tlsx.ID(name))
	if err != nil {
		return fmt.Errorf("devca: %w", err)
	}
	return ca.issue(name, &x509.Certificate{Subject: pkix.Name{CommonName: name}, URIs: []*url.URL{u}})
}

// IssuePublic writes a client-facing server certificate for the given host names and for the
// loopback addresses, to <name>.pem and <name>-key.pem.
func (ca *CA) IssuePublic(name string, hosts ...string) error {
	return ca.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		DNSNames:    hosts,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	})
}

// IssueTo writes a certificate of the platform's kind for name into files of its own: for tests
// that rotate a certificate or present another's.
func (ca *CA) IssueTo(certFile, keyFile, name string) error {
	u, err := url.Parse(tlsx.ID(name))
	if err != nil {
		return fmt.Errorf("devca: %w", err)
	}
	return ca.issueTo(certFile, keyFile, &x509.Certificate{Subject: pkix.Name{CommonName: name}, URIs: []*url.URL{u}})
}

// IssueTemplate writes a certificate from tmpl (its subject, SANs and, if set, validity; serial,
// key usages and key are filled in) into files of its own: for tests that need a certificate the
// platform would not issue, e.g. one with two identities or one about to expire.
func (ca *CA) IssueTemplate(certFile, keyFile string, tmpl *x509.Certificate) error {
	return ca.issueTo(certFile, keyFile, tmpl)
}

func (ca *CA) issue(name string, tmpl *x509.Certificate) error {
	return ca.issueTo(CertFile(ca.dir, name), KeyFile(ca.dir, name), tmpl)
}

func (ca *CA) issueTo(certFile, keyFile string, tmpl *x509.Certificate) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("devca: %w", err)
	}
	tmpl.SerialNumber = serial()
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(validity)
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return fmt.Errorf("devca: issue %s: %w", tmpl.Subject.CommonName, err)
	}
	return write(certFile, keyFile, der, key)
}

// write writes the key first and the certificate last, each through a rename, so that a reader
// polling the certificate never pairs it with another key for long.
func write(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("devca: %w", err)
	}
	if err := writeFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})); err != nil {
		return err
	}
	return writeFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// writeFile writes path through a fresh temporary file readable by the owner only: a leftover
// temporary file is removed first, since os.WriteFile would keep its mode (and a file another
// user created, or a symlink planted there, would be written through).
func writeFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("devca: %w", err)
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("devca: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("devca: %w", err)
	}
	return nil
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("devca: %s holds no certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("devca: %s: %w", path, err)
	}
	return c, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
