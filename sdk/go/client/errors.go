package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"
)

// Error is a call the gateway refused, or that did not reach it: the gRPC status with what a
// program needs from its details. status.Code, status.FromError and rpcstatus read it as the
// status it is; errors.Is(err, context.Canceled) (or DeadlineExceeded) holds when the call's own
// context ended.
type Error struct {
	// Op is what the client was doing ("invoke dummy.echo", "get execution ...").
	Op string
	// Code is the status code: INVALID_ARGUMENT (bad input, Fields names it), UNAUTHENTICATED
	// (missing or wrong key), NOT_FOUND, ALREADY_EXISTS (an idempotency key reused with another
	// request), FAILED_PRECONDITION (ALREADY_SETTLED), UNAVAILABLE, RESOURCE_EXHAUSTED, ...
	Code codes.Code
	// Message is the status's message.
	Message string
	// Reason is the ErrorInfo reason (IDEMPOTENCY_KEY_REUSED, ALREADY_SETTLED, RATE_LIMITED, ...),
	// or "".
	Reason string
	// Metadata is the ErrorInfo's metadata (ALREADY_SETTLED's "status", OUTCOME_PENDING's
	// "execution_id", ...), or nil.
	Metadata map[string]string
	// Fields are the request fields a BadRequest names, with what is wrong with each.
	Fields []FieldViolation
	// RetryDelay is how long the status advises waiting before trying again (its RetryInfo), or 0.
	RetryDelay time.Duration

	status *status.Status
	ctxErr error
}

// FieldViolation is one field of a BadRequest: the request field, with the gateway's words.
type FieldViolation struct {
	// Field is the field's path in the request ("idempotency_key", "grpc.target", "page_size").
	Field string
	// Description says what is wrong with it.
	Description string
}

// Error says the operation, the code and the message.
func (e *Error) Error() string {
	return fmt.Sprintf("client: %s: %s: %s", e.Op, e.Code, e.Message)
}

// GRPCStatus is the status, for status.FromError, status.Code and rpcstatus.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// Unwrap is the context's error when the call's own context ended, else nil.
func (e *Error) Unwrap() error { return e.ctxErr }

// Field is the first field a BadRequest names, or "".
func (e *Error) Field() string {
	if len(e.Fields) == 0 {
		return ""
	}
	return e.Fields[0].Field
}

// ReasonOutcomePending is the Reason of a sync invocation's UNAVAILABLE whose attempt ran but whose
// outcome was not recorded by the call's deadline: the provider work is done or under way, the
// execution settles on its own, and ExecutionID names it. Such a call must not be made again —
// without an IdempotencyKey that runs the work a second time: read the execution (Get) or wait for
// it (WaitForSettlement); InvokeAndWait does so itself. It is
// errorsv1.ErrorReason_OUTCOME_PENDING's name: the reasons are that enum's values
// (TestReasonOutcomePendingIsTheEnums holds it to the enum).
const ReasonOutcomePending = "OUTCOME_PENDING"

// ExecutionID is the execution the refusal is about, from its ErrorInfo metadata ("execution_id",
// as OUTCOME_PENDING carries it), or "".
func (e *Error) ExecutionID() string { return e.Metadata["execution_id"] }

// Retryable reports whether the same call may be made again, after RetryDelay when given:
// UNAVAILABLE (an outage or no connection; nothing is wrong with the request), RESOURCE_EXHAUSTED
// (a rate limit), ABORTED (the execution kept changing; retry), or any status that carries a
// RetryInfo. Not when the call's own context ended (the caller chose that), and not for
// ReasonOutcomePending, although it is UNAVAILABLE with a RetryInfo: the work already ran, and
// the execution is to be read or waited for, not invoked again.
//
// Repeating an invocation is safe only with the same IdempotencyKey: the gateway then answers the
// execution the first call made, if it made one. Without a key, an invocation that failed
// retryably may still have been accepted (the answer was lost on its way back), and each repeat
// may start one more execution.
func (e *Error) Retryable() bool {
	if e.ctxErr != nil || e.Reason == ReasonOutcomePending {
		return false
	}
	switch e.Code {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return e.RetryDelay > 0
}

// IsRetryable reports whether err is an *Error (or a gRPC status error) that says the same call
// may be made again (see Error.Retryable). An invocation is safe to repeat only with the same
// IdempotencyKey; and never after ReasonOutcomePending, which IsRetryable reports false: that
// execution ran, read it or wait for it (Error.ExecutionID names it).
func IsRetryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable()
	}
	if st, ok := status.FromError(err); ok && err != nil {
		return fromStatus("", st, nil).Retryable()
	}
	return false
}

// RetryDelay is the delay err's status advises before trying again (its RetryInfo), or 0.
func RetryDelay(err error) time.Duration { return rpcstatus.RetryDelay(err) }

// wrap is the error of a call made with ctx: an *Error for a status, err wrapped otherwise.
func wrap(ctx context.Context, op string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("client: %s: %w", op, err)
	}
	return fromStatus(op, st, ctxErr(ctx, st))
}

// ctxErr is the error of ctx when the call ended because of it. A DEADLINE_EXCEEDED can come
// back a moment before ctx's own timer fires (the server's copy of the deadline ran out first):
// with ctx's deadline passed, it is ctx's.
func ctxErr(ctx context.Context, st *status.Status) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && st.Code() == codes.DeadlineExceeded && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

func fromStatus(op string, st *status.Status, ctxErr error) *Error {
	e := &Error{Op: op, Code: st.Code(), Message: st.Message(), status: st, ctxErr: ctxErr,
		RetryDelay: rpcstatus.StatusRetryDelay(st)}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			e.Reason, e.Metadata = d.GetReason(), d.GetMetadata()
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.Fields = append(e.Fields, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
		}
	}
	return e
}
