package deliver

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/integrations-platform/integrations/pkg/webhook"
)

// TestCategoryTypesBeforeText: TLS failures are told by their types, however wrapped, and the
// "tls: " text is only a fallback, after the typed timeout and reset checks: an error whose
// type says timeout or reset is told so even when its text mentions tls.
func TestCategoryTypesBeforeText(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error {
		return &url.Error{Op: "Post", URL: "https://hooks.example.com/", Err: err}
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"remote alert", wrap(&net.OpError{Op: "remote error", Err: tls.AlertError(42)}), webhook.CategoryTLS},
		{"remote alert, any text", wrap(&net.OpError{Op: "remote error", Err: errors.New("bad certificate")}), webhook.CategoryTLS},
		{"local alert", wrap(&net.OpError{Op: "local error", Err: errors.New("unexpected message")}), webhook.CategoryTLS},
		{"record header", wrap(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), webhook.CategoryTLS},
		{"verification", wrap(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), webhook.CategoryTLS},
		{"hostname", wrap(x509.HostnameError{Certificate: &x509.Certificate{}, Host: "hooks.example.com"}), webhook.CategoryTLS},
		{"expired", wrap(x509.CertificateInvalidError{Reason: x509.Expired}), webhook.CategoryTLS},
		{"plain tls text", wrap(errors.New("tls: server selected unsupported protocol version 300")), webhook.CategoryTLS},
		{"plain server behind https", wrap(errors.New("http: server gave HTTP response to HTTPS client")), webhook.CategoryTLS},
		{"timeout mentioning tls", wrap(fmt.Errorf("tls: handshake: %w", os.ErrDeadlineExceeded)), webhook.CategoryTimeout},
		{"reset mentioning tls", wrap(fmt.Errorf("tls: write: %w", syscall.ECONNRESET)), webhook.CategoryConnectionClosed},
		{"eof mentioning tls", wrap(fmt.Errorf("tls: read record: %w", io.ErrUnexpectedEOF)), webhook.CategoryConnectionClosed},
		{"refused", wrap(&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), webhook.CategoryConnectionRefused},
		{"other", wrap(errors.New("something else")), webhook.CategoryOther},
	} {
		assert.Equal(t, tc.want, category(tc.err), tc.name)
	}
}
