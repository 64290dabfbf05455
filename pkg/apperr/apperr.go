// Package apperr defines the typed errors that handlers return. They are mapped to gRPC status
// codes (and by grpc-gateway to HTTP) in exactly one place, grpcx's error interceptor, so no
// handler picks a status code by hand and nothing unexpected leaks out as a detailed message.
package apperr

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
)

// Kind is the class of an error as a client sees it.
type Kind int

// The kinds, each mapped to one gRPC code.
const (
	KindInternal Kind = iota
	KindInvalidArgument
	KindNotFound
	KindUnauthenticated
	KindPermissionDenied
	KindAlreadyExists
	KindFailedPrecondition
	KindAborted
	KindUnavailable
	KindResourceExhausted
	KindCanceled
	KindDeadlineExceeded
)

// Error is an error meant for the caller.
type Error struct {
	Kind Kind
	// Field names the request field at fault, for KindInvalidArgument.
	Field string
	// Reason is the machine-readable reason of the status's ErrorInfo, one of
	// integrations.errors.v1.ErrorReason as its String() spells it, e.g. ALREADY_SETTLED.
	Reason string
	// Domain is the domain of the reason's ErrorInfo; empty is the project's (grpcx.ErrorDomain).
	// Set only where a reason belongs to a protocol of its own that other implementations answer
	// too, as the adapter SDK's refusal of a platform token.
	Domain string
	// Message is safe to show to the caller.
	Message string
	// Metadata is machine-readable detail, e.g. the execution's current status.
	Metadata map[string]string
	// RetryAfter is how long the caller should wait before trying again, for KindUnavailable
	// (and KindResourceExhausted, KindAborted); 0 leaves the default to the mapping (grpcx).
	RetryAfter time.Duration
	// Err is the cause, kept for logs; never shown to the caller.
	Err error
}

func (e *Error) Error() string {
	msg := e.Message
	if e.Field != "" {
		msg = e.Field + ": " + msg
	}
	if e.Err != nil {
		return msg + ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Invalid reports a bad request field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Kind: KindInvalidArgument, Field: field, Reason: errorsv1.ErrorReason_INVALID_ARGUMENT.String(), Message: fmt.Sprintf(format, args...)}
}

// New returns an error of the given kind and reason: an ErrorReason's String(), e.g.
// errorsv1.ErrorReason_ALREADY_SETTLED.String().
func New(kind Kind, reason, format string, args ...any) *Error {
	return &Error{Kind: kind, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Unavailable reports that a dependency (the database, the broker, another service) could not
// serve the request now: nothing is wrong with it, and the caller should try again. err is the
// cause, for logs.
func Unavailable(err error, format string, args ...any) *Error {
	return New(KindUnavailable, errorsv1.ErrorReason_UNAVAILABLE.String(), format, args...).Wrap(err)
}

// NotFound reports that a resource does not exist or is not visible to the caller.
func NotFound(format string, args ...any) *Error {
	return New(KindNotFound, errorsv1.ErrorReason_NOT_FOUND.String(), format, args...)
}

// Unauthenticated reports missing or wrong credentials.
func Unauthenticated(format string, args ...any) *Error {
	return New(KindUnauthenticated, errorsv1.ErrorReason_UNAUTHENTICATED.String(), format, args...)
}

// With returns a copy of e carrying metadata key=value.
func (e *Error) With(key, value string) *Error {
	c := *e
	c.Metadata = make(map[string]string, len(e.Metadata)+1)
	for k, v := range e.Metadata {
		c.Metadata[k] = v
	}
	c.Metadata[key] = value
	return &c
}

// Wrap returns a copy of e with cause err.
func (e *Error) Wrap(err error) *Error {
	c := *e
	c.Err = err
	return &c
}

// As returns the *Error in err's chain, if any.
func As(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// IsNetworkFailure reports whether err's chain holds a network error: a refused, reset or
// aborted connection, a broken pipe, an EOF, a closed connection, or any net.Error.
func IsNetworkFailure(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE)
}
