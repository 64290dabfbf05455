package deliver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/integrations-platform/integrations/pkg/webhook"
)

// category is what a tenant is told of a failed attempt's transport error (webhook.Category*):
// never the error's text, which names addresses and tells a refused port from a filtered one
// from a TLS server. The text goes to the log only.
func category(err error) string {
	var (
		dnsErr   *net.DNSError
		recErr   tls.RecordHeaderError
		alertErr tls.AlertError
		certErr  *tls.CertificateVerificationError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invErr   x509.CertificateInvalidError
		netErr   net.Error
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, webhook.ErrRefused):
		return webhook.CategoryRefusedAddress
	case errors.As(err, &dnsErr):
		return webhook.CategoryDNS
	case errors.Is(err, syscall.ECONNREFUSED):
		return webhook.CategoryConnectionRefused
	case errors.As(err, &recErr), errors.As(err, &alertErr), errors.As(err, &certErr),
		errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &invErr),
		strings.Contains(err.Error(), "tls: "), strings.Contains(err.Error(), "HTTP response to HTTPS client"):
		// crypto/tls reports most handshake failures as plain errors, all starting "tls: ";
		// net/http has its own for a plain server behind an https URL.
		return webhook.CategoryTLS
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return webhook.CategoryTimeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF):
		return webhook.CategoryConnectionClosed
	default:
		return webhook.CategoryOther
	}
}
