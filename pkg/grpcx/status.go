package grpcx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/db"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"
)

// ErrorDomain is the domain of every ErrorInfo detail this project returns.
const ErrorDomain = "integrations"

var kindCodes = map[apperr.Kind]codes.Code{
	apperr.KindInternal:           codes.Internal,
	apperr.KindInvalidArgument:    codes.InvalidArgument,
	apperr.KindNotFound:           codes.NotFound,
	apperr.KindUnauthenticated:    codes.Unauthenticated,
	apperr.KindPermissionDenied:   codes.PermissionDenied,
	apperr.KindAlreadyExists:      codes.AlreadyExists,
	apperr.KindFailedPrecondition: codes.FailedPrecondition,
	apperr.KindAborted:            codes.Aborted,
	apperr.KindUnavailable:        codes.Unavailable,
	apperr.KindResourceExhausted:  codes.ResourceExhausted,
	apperr.KindCanceled:           codes.Canceled,
	apperr.KindDeadlineExceeded:   codes.DeadlineExceeded,
}

// DefaultRetryDelay is the delay a retryable status (UNAVAILABLE, RESOURCE_EXHAUSTED) advises
// when the error gave none (a rate limit gives its bucket's delay): errdetails.RetryInfo for gRPC callers, Retry-After for REST ones. A connection lost to a
// restart or a failover is usually back within it.
const DefaultRetryDelay = time.Second

// ToStatus maps an error to the gRPC status the caller sees. This is the one place where errors
// become status codes; every status it makes carries an ErrorInfo of ErrorDomain, so that a
// status of ours can be told from a transport error.
//
//   - A typed apperr error keeps its kind, message and machine-readable details.
//   - A cancelled or expired context is CANCELLED or DEADLINE_EXCEEDED.
//   - A dependency failure (dependencyFailure: the database or the broker unreachable
//     or the connection lost, see db.IsConnectionError) is UNAVAILABLE with a RetryInfo: not a
//     bug, try again.
//   - A status from a downstream gRPC call that the service did not map into an answer of its
//     own never passes through as it is (its text may name addresses, fields and reasons of
//     another service): UNAVAILABLE or RESOURCE_EXHAUSTED become our UNAVAILABLE, CANCELLED and
//     DEADLINE_EXCEEDED ours with our words, anything else INTERNAL. Services map the statuses
//     they expect with Downstream first.
//   - Anything else is a bare INTERNAL, so that no internal detail leaks; the error interceptor
//     logs its cause.
func ToStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	if e, ok := apperr.As(err); ok {
		return typedStatus(e)
	}
	// An adapter served by a grpcx.Server (the dummy adapter) answers a refused platform token
	// with the protocol's marker, exactly as the SDK builds it.
	var refused *platformtoken.RefusalError
	if errors.As(err, &refused) {
		return refused.GRPCStatus()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return typedStatus(apperr.New(apperr.KindCanceled, errorsv1.ErrorReason_CANCELLED.String(), "request cancelled"))
	case errors.Is(err, context.DeadlineExceeded):
		return typedStatus(apperr.New(apperr.KindDeadlineExceeded, errorsv1.ErrorReason_DEADLINE_EXCEEDED.String(), "deadline exceeded"))
	case dependencyFailure(err):
		return typedStatus(apperr.New(apperr.KindUnavailable, errorsv1.ErrorReason_UNAVAILABLE.String(), "service temporarily unavailable, retry"))
	}
	var downstream interface{ GRPCStatus() *status.Status }
	if errors.As(err, &downstream) {
		switch downstream.GRPCStatus().Code() {
		case codes.Unavailable, codes.ResourceExhausted:
			return typedStatus(apperr.New(apperr.KindUnavailable, errorsv1.ErrorReason_UNAVAILABLE.String(), "a dependency is unavailable, retry"))
		case codes.Canceled:
			return typedStatus(apperr.New(apperr.KindCanceled, errorsv1.ErrorReason_CANCELLED.String(), "request cancelled"))
		case codes.DeadlineExceeded:
			return typedStatus(apperr.New(apperr.KindDeadlineExceeded, errorsv1.ErrorReason_DEADLINE_EXCEEDED.String(), "deadline exceeded"))
		}
	}
	return typedStatus(apperr.New(apperr.KindInternal, errorsv1.ErrorReason_INTERNAL.String(), "internal error"))
}

// retryable are the kinds whose status advises a delay before trying again.
var retryable = map[apperr.Kind]bool{apperr.KindUnavailable: true, apperr.KindResourceExhausted: true}

func typedStatus(e *apperr.Error) *status.Status {
	code, found := kindCodes[e.Kind]
	if !found {
		code = codes.Internal
	}
	msg := e.Message
	if e.Field != "" {
		msg = e.Field + ": " + e.Message
	}
	st := status.New(code, msg)
	var details []protoadapt.MessageV1
	if e.Field != "" {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: e.Field, Description: e.Message},
		}})
	}
	if e.Reason != "" {
		domain := cmp.Or(e.Domain, ErrorDomain)
		details = append(details, &errdetails.ErrorInfo{Reason: e.Reason, Domain: domain, Metadata: e.Metadata})
	}
	if retryable[e.Kind] || e.RetryAfter > 0 {
		delay := e.RetryAfter
		if delay <= 0 {
			delay = DefaultRetryDelay
		}
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	}
	if withDetails, derr := st.WithDetails(details...); derr == nil {
		st = withDetails
	}
	return st
}

// Downstream turns the error of a call to another service (named service, e.g. "settlement")
// into an answer of our own, for the statuses a caller does not handle itself: the other
// service's unavailability (UNAVAILABLE, RESOURCE_EXHAUSTED, a CANCELLED of its own, a
// DEADLINE_EXCEEDED while our context still runs, or no connection at all) is our UNAVAILABLE
// "<service> unavailable, retry"; any other refusal means we asked it something it would not
// do, which is our bug: INTERNAL, logged with the cause. The other service's message, details
// and reason are kept as the cause, for logs, never shown. A context of ours that ended stays
// what it is. Call it after handling the reasons the caller expects (ALREADY_SETTLED...).
func Downstream(ctx context.Context, service string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("call %s: %w", service, ctx.Err())
	}
	st, isStatus := status.FromError(err)
	if !isStatus {
		if dependencyFailure(err) {
			return apperr.Unavailable(err, "%s unavailable, retry", service)
		}
		return fmt.Errorf("call %s: %w", service, err)
	}
	switch st.Code() {
	case codes.Unavailable, codes.ResourceExhausted, codes.Canceled, codes.DeadlineExceeded:
		e := apperr.Unavailable(err, "%s unavailable, retry", service)
		e.RetryAfter = rpcstatus.StatusRetryDelay(st)
		return e
	default:
		return apperr.New(apperr.KindInternal, errorsv1.ErrorReason_INTERNAL.String(), "internal error").Wrap(fmt.Errorf("call %s: %w", service, err))
	}
}

// dependencyFailure reports whether err says a dependency could not be reached, dropped the
// connection or refused for the moment — not a bug, and the caller may retry: the database's
// connection and transient errors (db.Classify), the broker's (mq.IsConnectionError), a network
// failure (apperr.IsNetworkFailure). Context cancellation and deadlines are not: they say the
// caller gave up. The one place that decides it, where every error becomes a status.
func dependencyFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch db.Classify(err) {
	case db.ErrConnection, db.ErrTransient:
		return true
	}
	return mq.IsConnectionError(err) || apperr.IsNetworkFailure(err)
}
