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
	switch {
	case err == nil:
		return ""
	case errors.Is(err, webhook.ErrRefused):
		return webhook.CategoryRefusedAddress
	case errors.As(err, new(*net.DNSError)):
		return webhook.CategoryDNS
	case errors.Is(err, syscall.ECONNREFUSED):
		return webhook.CategoryConnectionRefused
	case tlsError(err):
		return webhook.CategoryTLS
	case errors.Is(err, context.DeadlineExceeded), timeout(err):
		return webhook.CategoryTimeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF):
		return webhook.CategoryConnectionClosed
	case strings.Contains(err.Error(), "tls: "), strings.Contains(err.Error(), "HTTP response to HTTPS client"):
		// The fallback, after every typed check: crypto/tls reports some handshake failures
		// (a protocol version or cipher suite the two ends do not share) as plain errors, all
		// starting "tls: "; net/http has its own plain error for a plain server behind an https
		// URL. Matching text first would let a typed timeout or reset whose text happens to
		// mention "tls: " be told as tls.
		return webhook.CategoryTLS
	default:
		return webhook.CategoryOther
	}
}

// tlsError reports whether err is a TLS failure by its type: a record that is not TLS, an alert
// (ours or the server's: crypto/tls wraps an alert in a *net.OpError whose Op is "remote error"
// or "local error"), or a certificate the platform does not trust.
func tlsError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && (op.Op == "remote error" || op.Op == "local error") {
		return true
	}
	return errors.As(err, new(tls.RecordHeaderError)) || errors.As(err, new(tls.AlertError)) ||
		errors.As(err, new(*tls.CertificateVerificationError)) || errors.As(err, new(*tls.ECHRejectionError)) ||
		errors.As(err, new(x509.UnknownAuthorityError)) || errors.As(err, new(x509.HostnameError)) ||
		errors.As(err, new(x509.CertificateInvalidError)) || errors.As(err, new(x509.SystemRootsError)) ||
		errors.As(err, new(x509.ConstraintViolationError)) || errors.As(err, new(x509.UnhandledCriticalExtension))
}

// timeout reports whether any error in err's chain says it timed out. Not errors.As to a
// net.Error: that stops at the first one (a *url.Error), whose Timeout asks only the error it
// wraps directly.
func timeout(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if t, ok := err.(interface{ Timeout() bool }); ok && t.Timeout() {
			return true
		}
	}
	return false
}
