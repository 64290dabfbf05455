// Package rpcstatus reads the machine-readable details the platform puts in a gRPC status: the
// ErrorInfo reason that says what happened (ALREADY_SETTLED, STALE_ATTEMPT, ...) and the
// RetryInfo delay that says when to try again. Clients, adapters and the platform's own services
// read them through this one package.
package rpcstatus

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
)

// Reason returns the ErrorInfo reason carried by a status error, or "".
func Reason(err error) string {
	return ErrorInfo(err).GetReason()
}

// ErrorReason returns the ErrorInfo reason carried by a status error as the platform's
// integrations.errors.v1.ErrorReason, or ERROR_REASON_UNSPECIFIED when it carries none or one the
// enum does not name (a newer platform's, another service's): compare it with the enum's values
// rather than with strings.
func ErrorReason(err error) errorsv1.ErrorReason {
	return errorsv1.ErrorReason(errorsv1.ErrorReason_value[Reason(err)])
}

// ErrorInfo returns the ErrorInfo detail carried by a status error, or nil.
func ErrorInfo(err error) *errdetails.ErrorInfo {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// RetryDelay returns the delay a status error advises through its RetryInfo, or 0.
func RetryDelay(err error) time.Duration {
	st, ok := status.FromError(err)
	if !ok {
		return 0
	}
	return StatusRetryDelay(st)
}

// StatusRetryDelay is RetryDelay of a status.
func StatusRetryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
