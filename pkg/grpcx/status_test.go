package grpcx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/grpcx"
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
			require.Equal(t, "SOME_REASON", grpcx.Reason(st.Err()))
			info := grpcx.ErrorInfo(st.Err())
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
	require.Equal(t, "INVALID_ARGUMENT", grpcx.Reason(st.Err()))

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
		require.Empty(t, st.Details())
		require.Empty(t, grpcx.Reason(st.Err()))
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

func TestToStatusPassesADownstreamStatusThrough(t *testing.T) {
	t.Parallel()
	down, err := status.New(codes.Aborted, "execution is succeeded at attempt 1").WithDetails(
		&errdetails.ErrorInfo{Reason: "ALREADY_SETTLED", Domain: grpcx.ErrorDomain, Metadata: map[string]string{"status": "succeeded"}})
	require.NoError(t, err)

	st := grpcx.ToStatus(down.Err())
	require.True(t, proto.Equal(down.Proto(), st.Proto()), "got %v, want %v", st.Proto(), down.Proto())
	require.Equal(t, "ALREADY_SETTLED", grpcx.Reason(st.Err()))

	// Wrapped on its way up, the code and the details still pass through.
	wrapped := grpcx.ToStatus(fmt.Errorf("settle sync execution 0190: %w", down.Err()))
	require.Equal(t, codes.Aborted, wrapped.Code())
	require.Equal(t, "ALREADY_SETTLED", grpcx.Reason(wrapped.Err()))
}

func TestToStatusWrappedDownstreamStatusKeepsItsMessage(t *testing.T) {
	t.Parallel()
	down := status.New(codes.Aborted, "execution is succeeded at attempt 1")
	st := grpcx.ToStatus(fmt.Errorf("settle sync execution 0190: %w", down.Err()))
	require.Equal(t, down.Message(), st.Message())
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
		})
	}
}

func TestToStatusNil(t *testing.T) {
	t.Parallel()
	require.Nil(t, grpcx.ToStatus(nil))
	require.Empty(t, grpcx.Reason(nil))
	require.Empty(t, grpcx.Reason(errors.New("plain")))
}
