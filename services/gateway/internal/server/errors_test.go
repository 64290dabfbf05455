package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// What the settlement service might answer, and what of it must never reach a client.
var (
	settlementUnreachable = status.New(codes.Unavailable,
		`connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:9094: connect: connection refused"`).Err()
	leaks = []string{"9094", "127.0.0.1", "transport", "JSON object", "field_violations", "result:"}
)

// requireOwnWords checks that the status a client gets of err says nothing of settlement's.
func requireOwnWords(t *testing.T, err error) *status.Status {
	t.Helper()
	st := grpcx.ToStatus(err)
	wire := fmt.Sprint(st.Proto())
	for _, leak := range leaks {
		require.NotContains(t, wire, leak)
	}
	for _, d := range st.Details() {
		_, isBadRequest := d.(*errdetails.BadRequest)
		require.False(t, isBadRequest, "no field violation about a field the client never sent")
	}
	return st
}

// Settlement refuses a sync call's outcome for a reason retrying cannot change (the reporter
// retries outages and turns a refused result into a protocol failure): the caller gets the
// gateway's INTERNAL, nothing of settlement's text, address or field.
func TestInvokeSyncSettlementRefusalInTheGatewaysWords(t *testing.T) {
	t.Parallel()
	refusals := map[string]error{
		"a field the caller never sent": func() error {
			st, err := status.New(codes.InvalidArgument, "from_status: must be PENDING or RUNNING (settlement at 127.0.0.1:9094)").WithDetails(
				&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "from_status", Description: "must be PENDING or RUNNING"}}})
			if err != nil {
				panic(err)
			}
			return st.Err()
		}(),
		"permission": status.Error(codes.PermissionDenied, "transport: peer 127.0.0.1:9094 refused"),
	}
	for name, refusal := range refusals {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := b.schema.Pool.Exec(context.Background(), `UPDATE capabilities SET modes = ARRAY['async', 'sync']`)
			require.NoError(t, err)
			b.settlement.errs = []error{refusal}

			_, err = b.server.InvokeCapability(b.ctx, &gatewayv1.InvokeCapabilityRequest{
				Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_SYNC})

			st := requireOwnWords(t, err)
			require.Equal(t, codes.Internal, st.Code(), "%v", err)
			require.Equal(t, errorsv1.ErrorReason_INTERNAL.String(), rpcstatus.Reason(st.Err()))
			require.NotContains(t, fmt.Sprint(st.Proto()), "from_status")
		})
	}
}

func TestCancelExecutionSettlementErrorsInTheGatewaysWords(t *testing.T) {
	t.Parallel()
	t.Run("settlement unreachable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusPending})
		b.settlement.errs = []error{settlementUnreachable}
		_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})
		st := requireOwnWords(t, err)
		require.Equal(t, codes.Unavailable, st.Code())
		require.Equal(t, "settlement unavailable, retry", st.Message())
	})
	t.Run("the execution keeps moving", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusPending})
		moved := grpcx.ToStatus(apperr.New(apperr.KindAborted, errorsv1.ErrorReason_STALE_ATTEMPT.String(), "attempt 0 is not current; the execution is at attempt 3")).Err()
		for range cancelTries {
			b.settlement.errs = append(b.settlement.errs, moved)
		}
		_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})
		st := requireOwnWords(t, err)
		require.Equal(t, codes.Aborted, st.Code())
		require.Equal(t, errorsv1.ErrorReason_EXECUTION_BUSY.String(), rpcstatus.Reason(st.Err()))
		require.NotContains(t, st.Message(), "attempt 3")
		require.Len(t, b.settlement.requests(), cancelTries)
	})
	t.Run("a completion won, with metadata that is not ours", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1})
		b.settlement.errs = []error{grpcx.ToStatus(apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_ALREADY_SETTLED.String(), "at 127.0.0.1:9094").
			With("status", "dial tcp 127.0.0.1:9094").With("host", "db-7")).Err()}
		_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})
		st := requireOwnWords(t, err)
		require.Equal(t, codes.FailedPrecondition, st.Code())
		require.Equal(t, errorsv1.ErrorReason_ALREADY_SETTLED.String(), rpcstatus.Reason(st.Err()))
		require.Empty(t, rpcstatus.ErrorInfo(st.Err()).GetMetadata())
		require.False(t, strings.Contains(st.Message(), "db-7"))
	})
}
