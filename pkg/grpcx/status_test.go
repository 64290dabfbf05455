package grpcx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

func TestToStatusMapsEachKind(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind apperr.Kind
		want codes.Code
	}{
		{apperr.KindInternal, codes.Internal},
		{apperr.KindInvalidArgument, codes.InvalidArgument},
		{apperr.KindNotFound, codes.NotFound},
		{apperr.KindUnauthenticated, codes.Unauthenticated},
		{apperr.KindPermissionDenied, codes.PermissionDenied},
		{apperr.KindAlreadyExists, codes.AlreadyExists},
		{apperr.KindFailedPrecondition, codes.FailedPrecondition},
		{apperr.KindAborted, codes.Aborted},
		{apperr.KindUnavailable, codes.Unavailable},
		{apperr.KindResourceExhausted, codes.ResourceExhausted},
		{apperr.KindCanceled, codes.Canceled},
		{apperr.KindDeadlineExceeded, codes.DeadlineExceeded},
		{apperr.Kind(99), codes.Internal}, // a kind without a code is not guessed at
	}
	for _, tt := range tests {
		t.Run(tt.want.String(), func(t *testing.T) {
			t.Parallel()
			err := apperr.New(tt.kind, "SOME_REASON", "execution %s is busy", "x").With("status", "running")
			st := grpcx.ToStatus(err)
			require.Equal(t, tt.want, st.Code())
			require.Equal(t, "execution x is busy", st.Message())

			// Through the wire form too: what a client's status.FromError sees.
			require.Equal(t, tt.want, status.Code(st.Err()))
			require.Equal(t, "SOME_REASON", rpcstatus.Reason(st.Err()))
			info := rpcstatus.ErrorInfo(st.Err())
			require.NotNil(t, info)
			require.Equal(t, grpcx.ErrorDomain, info.GetDomain())
			require.Equal(t, map[string]string{"status": "running"}, info.GetMetadata())
		})
	}
}

func TestToStatusInvalidArgumentNamesTheField(t *testing.T) {
	t.Parallel()
	st := grpcx.ToStatus(apperr.Invalid("capability", "must match %s", "^[a-z]+$"))
	require.Equal(t, codes.InvalidArgument, st.Code())
	require.Equal(t, "capability: must match ^[a-z]+$", st.Message())
	require.Equal(t, "INVALID_ARGUMENT", rpcstatus.Reason(st.Err()))

	var violations []*errdetails.BadRequest_FieldViolation
	for _, d := range status.Convert(st.Err()).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			violations = append(violations, br.GetFieldViolations()...)
		}
	}
	require.Len(t, violations, 1)
	require.Equal(t, "capability", violations[0].GetField())
	require.Equal(t, "must match ^[a-z]+$", violations[0].GetDescription())
}

func TestToStatusKeepsTheCauseOut(t *testing.T) {
	t.Parallel()
	cause := errors.New("dial tcp 10.0.0.7:5432: password authentication failed for user app")

	t.Run("arbitrary error", func(t *testing.T) {
		t.Parallel()
		st := grpcx.ToStatus(fmt.Errorf("load execution: %w", cause))
		require.Equal(t, codes.Internal, st.Code())
		require.Equal(t, "internal error", st.Message())
		require.Len(t, st.Details(), 1, "only the ErrorInfo that marks the status as ours")
		require.Equal(t, errorsv1.ErrorReason_INTERNAL.String(), rpcstatus.Reason(st.Err()))
		require.Zero(t, rpcstatus.RetryDelay(st.Err()), "a bug is not retried")
	})
	t.Run("typed error with a cause, wrapped", func(t *testing.T) {
		t.Parallel()
		err := fmt.Errorf("handler: %w", apperr.New(apperr.KindUnavailable, "STORE_UNAVAILABLE", "try again").Wrap(cause))
		st := grpcx.ToStatus(err)
		require.Equal(t, codes.Unavailable, st.Code())
		require.Equal(t, "try again", st.Message())
		require.NotContains(t, fmt.Sprint(status.Convert(st.Err()).Proto()), "10.0.0.7")
	})
}

func TestToStatusRetryHint(t *testing.T) {
	t.Parallel()
	st := grpcx.ToStatus(apperr.New(apperr.KindUnavailable, "X", "retry"))
	require.Equal(t, grpcx.DefaultRetryDelay, rpcstatus.RetryDelay(st.Err()))

	e := apperr.New(apperr.KindUnavailable, "X", "retry")
	e.RetryAfter = 3 * time.Second
	require.Equal(t, 3*time.Second, rpcstatus.RetryDelay(grpcx.ToStatus(e).Err()))

	// A rate limit's refusal carries the bucket's delay, under a second as it is (REST rounds
	// it up to whole seconds).
	limited := apperr.New(apperr.KindResourceExhausted, "RATE_LIMITED", "rate limit exceeded")
	limited.RetryAfter = 40 * time.Millisecond
	st = grpcx.ToStatus(limited)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, 40*time.Millisecond, rpcstatus.RetryDelay(st.Err()))

	require.Zero(t, rpcstatus.RetryDelay(grpcx.ToStatus(apperr.Invalid("id", "bad")).Err()), "a bad request is not retried")
}

// Connection-level failures of the database and the broker are UNAVAILABLE with a retry hint,
// never INTERNAL, and say nothing of their cause.
func TestToStatusDependencyFailures(t *testing.T) {
	t.Parallel()
	_, dialErr := net.Dial("tcp", "127.0.0.1:1")
	require.Error(t, dialErr)
	_, pgDialErr := pgconn.Connect(context.Background(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	require.Error(t, pgDialErr)
	tests := []struct {
		name string
		err  error
	}{
		{"database dial refused", pgDialErr},
		{"database backend terminated (57P01)", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}},
		{"database crash shutdown (57P02)", &pgconn.PgError{Code: "57P02"}},
		{"database starting up (57P03)", &pgconn.PgError{Code: "57P03"}},
		{"database connection failure (08006)", &pgconn.PgError{Code: "08006"}},
		{"database too many connections (53300)", &pgconn.PgError{Code: "53300"}},
		{"database pool closed", puddle.ErrClosedPool},
		{"connection closed mid-read", io.ErrUnexpectedEOF},
		{"connection reset", syscall.ECONNRESET},
		{"dial refused", dialErr},
		{"broker closed", mq.ErrClosed},
		{"publish not confirmed", mq.ErrUnconfirmed},
		{"publish nacked", mq.ErrNacked},
		{"broker connection closed", amqp.ErrClosed},
		{"broker channel closed by the server", &amqp.Error{Code: amqp.ChannelError, Reason: "CHANNEL_ERROR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := grpcx.ToStatus(fmt.Errorf("accept execution: %w", tt.err))
			require.Equal(t, codes.Unavailable, st.Code(), "%v", tt.err)
			require.Equal(t, errorsv1.ErrorReason_UNAVAILABLE.String(), rpcstatus.Reason(st.Err()))
			require.Equal(t, grpcx.DefaultRetryDelay, rpcstatus.RetryDelay(st.Err()))
			require.NotContains(t, st.Message(), "accept execution")
			require.NotContains(t, st.Message(), "127.0.0.1")
		})
	}
	// A server error about the statement is a bug, not an outage.
	st := grpcx.ToStatus(&pgconn.PgError{Code: "42601", Message: "syntax error"})
	require.Equal(t, codes.Internal, st.Code())
}

// A downstream status that the service did not map is not passed through: its text, addresses,
// fields and reason stay out of the answer.
func TestToStatusDoesNotPassADownstreamStatusThrough(t *testing.T) {
	t.Parallel()
	refused, err := status.New(codes.InvalidArgument, "result: not a JSON object").WithDetails(
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "result", Description: "not a JSON object"}}},
		&errdetails.ErrorInfo{Reason: "INVALID_ARGUMENT", Domain: grpcx.ErrorDomain})
	require.NoError(t, err)
	settled, err := status.New(codes.Aborted, "execution is succeeded at attempt 1").WithDetails(
		&errdetails.ErrorInfo{Reason: "ALREADY_SETTLED", Domain: grpcx.ErrorDomain, Metadata: map[string]string{"status": "succeeded"}})
	require.NoError(t, err)
	tests := []struct {
		name   string
		down   *status.Status
		want   codes.Code
		reason string
	}{
		{"unreachable", status.New(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:9094: connect: connection refused\""), codes.Unavailable, errorsv1.ErrorReason_UNAVAILABLE.String()},
		{"overloaded", status.New(codes.ResourceExhausted, "too many requests at 127.0.0.1:9094"), codes.Unavailable, errorsv1.ErrorReason_UNAVAILABLE.String()},
		{"a refusal of a field the client never sent", refused, codes.Internal, errorsv1.ErrorReason_INTERNAL.String()},
		{"a reason of the other service", settled, codes.Internal, errorsv1.ErrorReason_INTERNAL.String()},
		{"its own bug", status.New(codes.Internal, "internal error"), codes.Internal, errorsv1.ErrorReason_INTERNAL.String()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := grpcx.ToStatus(fmt.Errorf("settle sync execution 0190: %w", tt.down.Err()))
			require.Equal(t, tt.want, st.Code())
			require.Equal(t, tt.reason, rpcstatus.Reason(st.Err()))
			wire := fmt.Sprint(st.Proto())
			for _, leak := range []string{"9094", "127.0.0.1", "result", "ALREADY_SETTLED", "succeeded", "0190", "transport"} {
				require.NotContains(t, wire, leak)
			}
		})
	}
}

func TestDownstream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	unreachable := status.New(codes.Unavailable, "connection error: dial tcp 127.0.0.1:9094: connect: connection refused").Err()

	err := grpcx.Downstream(ctx, "settlement", unreachable)
	st := grpcx.ToStatus(fmt.Errorf("settle: %w", err))
	require.Equal(t, codes.Unavailable, st.Code())
	require.Equal(t, "settlement unavailable, retry", st.Message())
	require.Equal(t, grpcx.DefaultRetryDelay, rpcstatus.RetryDelay(st.Err()))
	require.NotContains(t, fmt.Sprint(st.Proto()), "9094")
	require.ErrorIs(t, err, unreachable, "the cause is kept for logs")

	// Its own advice on when to retry is kept.
	busy, derr := status.New(codes.Unavailable, "draining").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)})
	require.NoError(t, derr)
	require.Equal(t, 2*time.Second, rpcstatus.RetryDelay(grpcx.ToStatus(grpcx.Downstream(ctx, "settlement", busy.Err())).Err()))

	for _, c := range []codes.Code{codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted} {
		require.Equal(t, codes.Unavailable, grpcx.ToStatus(grpcx.Downstream(ctx, "settlement", status.Error(c, "x"))).Code(), c.String())
	}
	for _, c := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.Internal, codes.Unimplemented} {
		st := grpcx.ToStatus(grpcx.Downstream(ctx, "settlement", status.Error(c, "field result at 127.0.0.1")))
		require.Equal(t, codes.Internal, st.Code(), c.String())
		require.Equal(t, "internal error", st.Message())
	}

	// Not a status at all: a connection the client could not even make.
	require.Equal(t, codes.Unavailable, grpcx.ToStatus(grpcx.Downstream(ctx, "dispatcher", syscall.ECONNREFUSED)).Code())

	// Our own context's end is ours, not the other service's outage.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Equal(t, codes.Canceled, grpcx.ToStatus(grpcx.Downstream(cctx, "settlement", status.Error(codes.Canceled, "context canceled"))).Code())
	require.NoError(t, grpcx.Downstream(ctx, "settlement", nil))
}

func TestToStatusContextErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"canceled", context.Canceled, codes.Canceled},
		{"canceled, wrapped", fmt.Errorf("claim attempt 2: %w", context.Canceled), codes.Canceled},
		{"deadline exceeded", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"deadline exceeded, wrapped", fmt.Errorf("call adapter: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := grpcx.ToStatus(tt.err)
			require.Equal(t, tt.want, st.Code())
			require.NotContains(t, st.Message(), ":", "no wrapping text leaks")
			require.NotEmpty(t, rpcstatus.Reason(st.Err()), "marked as ours")
		})
	}
}

func TestToStatusNil(t *testing.T) {
	t.Parallel()
	require.Nil(t, grpcx.ToStatus(nil))
	require.Empty(t, rpcstatus.Reason(nil))
	require.Empty(t, rpcstatus.Reason(errors.New("plain")))
}

// An error of a protocol's own domain keeps it on its ErrorInfo; others have the project's.
func TestToStatusKeepsAnErrorsDomain(t *testing.T) {
	t.Parallel()
	e := apperr.New(apperr.KindUnauthenticated, "PLATFORM_TOKEN_REFUSED", "refused")
	e.Domain = "integrations.platform"
	for err, want := range map[error]string{e: "integrations.platform", apperr.Unauthenticated("no key"): grpcx.ErrorDomain} {
		var info *errdetails.ErrorInfo
		for _, d := range grpcx.ToStatus(err).Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		require.NotNil(t, info, "%v", err)
		require.Equal(t, want, info.GetDomain(), "%v", err)
	}
}

// TestAdapterTokenRefusalPassesThrough: an adapter served by grpcx.Server (the dummy adapter)
// answers the SDK's refusal of a platform token as the protocol's marker, byte for byte, not as
// INTERNAL: the platform reads the marker to know that nothing ran and no attempt is spent.
func TestAdapterTokenRefusalPassesThrough(t *testing.T) {
	t.Parallel()
	for _, why := range []error{platformtoken.ErrMissing, platformtoken.ErrInvalid, platformtoken.ErrReplayed} {
		err := fmt.Errorf("%w: %w", platformtoken.ErrRefused, why)
		want := platformtoken.RefusalStatus(err).Proto()
		got := grpcx.ToStatus(fmt.Errorf("execute: %w", platformtoken.Refuse(err)))
		require.True(t, proto.Equal(want, got.Proto()), "%v: %v", why, got)
		require.True(t, platformtoken.ReadRefusal(got.Err(), false).Marked, "%v", why)
	}
}
