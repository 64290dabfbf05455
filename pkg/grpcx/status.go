package grpcx

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/integrations-platform/integrations/pkg/apperr"
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
}

// ToStatus maps an error to the gRPC status the caller sees. This is the one place where errors
// become status codes. Typed apperr errors keep their message and gain machine-readable details;
// a status from a downstream gRPC call passes through; anything else becomes a bare INTERNAL so
// that no internal detail leaks (the caller of ToStatus logs the original).
func ToStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	if e, ok := apperr.As(err); ok {
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
			details = append(details, &errdetails.ErrorInfo{Reason: e.Reason, Domain: ErrorDomain, Metadata: e.Metadata})
		}
		if withDetails, derr := st.WithDetails(details...); derr == nil {
			st = withDetails
		}
		return st
	}
	// A downstream status, possibly wrapped on its way up: pass the status itself, not
	// status.FromError's rendering of the whole wrapped chain, which would leak our wording.
	var downstream interface{ GRPCStatus() *status.Status }
	if errors.As(err, &downstream) {
		return downstream.GRPCStatus()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "request cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "deadline exceeded")
	}
	return status.New(codes.Internal, "internal error")
}

// Reason returns the ErrorInfo reason carried by a status error, or "".
func Reason(err error) string {
	info := ErrorInfo(err)
	if info == nil {
		return ""
	}
	return info.GetReason()
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
