package server

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// The operator (admin token) sees every application's events, narrows the list to one
// application, opens and redelivers any of them, and redrives one application's dead events or
// every application's, with the preview count first; an application's key is unchanged: its
// own events only, and naming another application is a 400.
func TestOperatorEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	mine, _ := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6})
	theirs, _ := insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDead, attempts: 6})
	insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDelivered})
	op := AsOperator(context.Background())

	ids := func(resp *gatewayv1.ListEventsResponse) map[string]string {
		out := map[string]string{}
		for _, e := range resp.GetEvents() {
			out[e.GetId()] = e.GetApplicationId()
		}
		return out
	}
	all, err := b.server.ListEvents(op, &gatewayv1.ListEventsRequest{})
	require.NoError(t, err)
	require.Len(t, all.GetEvents(), 3)
	require.Equal(t, dbtest.TestApp, ids(all)[mine], "each event names its application")
	require.Equal(t, otherApp, ids(all)[theirs])
	one, err := b.server.ListEvents(op, &gatewayv1.ListEventsRequest{ApplicationId: otherApp,
		Status: eventStatusToProto[execution.EventDead]})
	require.NoError(t, err)
	require.Equal(t, map[string]string{theirs: otherApp}, ids(one))
	_, err = b.server.ListEvents(op, &gatewayv1.ListEventsRequest{ApplicationId: "Not An App"})
	c, _ := code(err)
	require.Equal(t, codes.InvalidArgument, c)
	require.Equal(t, "application_id", field(err))

	own, err := b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{mine: dbtest.TestApp}, ids(own), "an application's list is its own")
	_, err = b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{ApplicationId: otherApp})
	c, _ = code(err)
	require.Equal(t, codes.InvalidArgument, c, "an application names only itself")
	_, err = b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: theirs})
	c, _ = code(err)
	require.Equal(t, codes.NotFound, c, "another application's event")

	got, err := b.server.GetEvent(op, &gatewayv1.GetEventRequest{Id: theirs})
	require.NoError(t, err)
	require.Equal(t, otherApp, got.GetEvent().GetApplicationId())

	preview := func(ctx context.Context, app string) int64 {
		resp, err := b.server.RedriveEvents(ctx, &gatewayv1.RedriveEventsRequest{ApplicationId: app, ValidateOnly: true})
		require.NoError(t, err)
		return resp.GetCount()
	}
	require.Equal(t, int64(2), preview(op, ""), "every application's dead events")
	require.Equal(t, int64(1), preview(op, otherApp))
	require.Equal(t, int64(1), preview(b.ctx, ""), "an application's own")
	_, err = b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{ApplicationId: otherApp})
	c, _ = code(err)
	require.Equal(t, codes.InvalidArgument, c, "an application redrives only its own")
	resp, err := b.server.RedriveEvents(op, &gatewayv1.RedriveEventsRequest{ApplicationId: otherApp})
	require.NoError(t, err)
	require.Equal(t, int64(1), resp.GetCount())
	require.Equal(t, int64(1), preview(op, ""), "the other application's was redriven, mine is still dead")

	_, err = b.server.RedeliverEvent(b.ctx, &gatewayv1.RedeliverEventRequest{Id: theirs})
	c, _ = code(err)
	require.Equal(t, codes.NotFound, c, "an application cannot redeliver another's event")
	red, err := b.server.RedeliverEvent(op, &gatewayv1.RedeliverEventRequest{Id: mine})
	require.NoError(t, err)
	require.Equal(t, eventStatusToProto[execution.EventPending], red.GetEvent().GetStatus())
	require.Equal(t, int64(0), preview(op, ""))
}

// The admin token may cancel any application's execution, through the interceptor too; it still
// may not invoke nor read an execution other than through lists and timelines.
func TestOperatorCancelsAnyApplicationsExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	theirs := b.schema.InsertExecution(t, dbtest.Execution{Application: otherApp, Status: execution.StatusPending})

	_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: theirs})
	c, _ := code(err)
	require.Equal(t, codes.NotFound, c, "another application's execution")
	require.Empty(t, b.settlement.requests())

	auth := AuthInterceptor(b.server.store, nil, "the-admin-token")
	call := func(method string, req any, h grpc.UnaryHandler) (any, error) {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer the-admin-token"))
		return auth(ctx, req, &grpc.UnaryServerInfo{Server: b.server, FullMethod: method}, h)
	}
	resp, err := call(gatewayv1.GatewayService_CancelExecution_FullMethodName, &gatewayv1.CancelExecutionRequest{Id: theirs},
		func(ctx context.Context, req any) (any, error) {
			return b.server.CancelExecution(ctx, req.(*gatewayv1.CancelExecutionRequest))
		})
	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED, resp.(*gatewayv1.CancelExecutionResponse).GetExecution().GetStatus())
	settles := b.settlement.requests()
	require.Len(t, settles, 1)
	require.Equal(t, theirs, settles[0].GetExecutionId())
	require.Equal(t, "cancelled by the operator", settles[0].GetFailure().GetMessage())

	_, err = call(gatewayv1.GatewayService_InvokeCapability_FullMethodName, &gatewayv1.InvokeCapabilityRequest{},
		func(ctx context.Context, req any) (any, error) { t.Fatal("the admin token invoked"); return nil, nil })
	c, _ = code(err)
	require.Equal(t, codes.PermissionDenied, c)
}
