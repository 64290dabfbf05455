package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// invokeWithKey accepts an async execution of the test application with idempotency key key and
// sets its created_at to at.
func invokeWithKey(t *testing.T, ctx context.Context, b *bundle, key string, at time.Time) string {
	t.Helper()
	resp, err := b.server.InvokeCapability(ctx, &gatewayv1.InvokeCapabilityRequest{
		Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_ASYNC, IdempotencyKey: key})
	require.NoError(t, err)
	id := resp.GetExecution().GetId()
	_, err = b.schema.Pool.Exec(context.Background(), `UPDATE executions SET created_at = $2 WHERE id = $1`, id, at)
	require.NoError(t, err)
	return id
}

func listIDs(t *testing.T, ctx context.Context, b *bundle, req *gatewayv1.ListExecutionsRequest) []string {
	t.Helper()
	resp, err := b.server.ListExecutions(ctx, req)
	require.NoError(t, err)
	var out []string
	for _, e := range resp.GetExecutions() {
		out = append(out, e.GetId())
	}
	return out
}

func TestListExecutionsFiltersByTimeAndQuery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	early := invokeWithKey(t, b.ctx, b, "order-1", base)
	late := invokeWithKey(t, b.ctx, b, "order-2", base.Add(time.Hour))
	other := invokeWithKey(t, b.ctx, b, "refund_1", base.Add(2*time.Hour))

	tests := map[string]struct {
		req  *gatewayv1.ListExecutionsRequest
		want []string
	}{
		"created from":           {&gatewayv1.ListExecutionsRequest{CreatedAfter: timestamppb.New(base.Add(time.Hour))}, []string{other, late}},
		"created before":         {&gatewayv1.ListExecutionsRequest{CreatedBefore: timestamppb.New(base.Add(time.Hour))}, []string{early}},
		"range":                  {&gatewayv1.ListExecutionsRequest{CreatedAfter: timestamppb.New(base.Add(time.Minute)), CreatedBefore: timestamppb.New(base.Add(90 * time.Minute))}, []string{late}},
		"key prefix":             {&gatewayv1.ListExecutionsRequest{Query: "order-"}, []string{late, early}},
		"underscore is literal":  {&gatewayv1.ListExecutionsRequest{Query: "refund_"}, []string{other}},
		"wildcard is no pattern": {&gatewayv1.ListExecutionsRequest{Query: "%"}, nil},
		"id":                     {&gatewayv1.ListExecutionsRequest{Query: early}, []string{early}},
	}
	for name, tt := range tests {
		require.Equal(t, tt.want, listIDs(t, b.ctx, b, tt.req), name)
	}

	// Pages of two over three executions: a token after the first, none after the last; a page
	// of three is the last, full, and has none.
	first, err := b.server.ListExecutions(b.ctx, &gatewayv1.ListExecutionsRequest{PageSize: 2})
	require.NoError(t, err)
	require.Len(t, first.GetExecutions(), 2)
	require.NotEmpty(t, first.GetNextPageToken())
	last, err := b.server.ListExecutions(b.ctx, &gatewayv1.ListExecutionsRequest{PageSize: 2, PageToken: first.GetNextPageToken()})
	require.NoError(t, err)
	require.Len(t, last.GetExecutions(), 1)
	require.Empty(t, last.GetNextPageToken())
	full, err := b.server.ListExecutions(b.ctx, &gatewayv1.ListExecutionsRequest{PageSize: 3})
	require.NoError(t, err)
	require.Len(t, full.GetExecutions(), 3)
	require.Empty(t, full.GetNextPageToken(), "the last page, full, has no next page")

	for name, req := range map[string]*gatewayv1.ListExecutionsRequest{
		"created_after":  {CreatedAfter: &timestamppb.Timestamp{Seconds: -1 << 60}},
		"created_before": {CreatedBefore: &timestamppb.Timestamp{Seconds: -1 << 60}},
		"query":          {Query: "has space"},
		"application_id": {ApplicationId: otherApp},
	} {
		_, err := b.server.ListExecutions(b.ctx, req)
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c, name)
		require.Equal(t, name, field(err))
	}
}

func TestListExecutionsAcrossApplicationsForTheOperatorOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	at := time.Now()
	mine := invokeWithKey(t, b.ctx, b, "", at)
	theirs := invokeWithKey(t, AsApplication(context.Background(), otherApp), b, "", at)

	require.Equal(t, []string{mine}, listIDs(t, b.ctx, b, &gatewayv1.ListExecutionsRequest{}), "an application sees its own")
	require.Equal(t, []string{mine}, listIDs(t, b.ctx, b, &gatewayv1.ListExecutionsRequest{ApplicationId: dbtest.TestApp}), "naming itself is allowed")
	op := AsOperator(context.Background())
	require.Equal(t, []string{theirs, mine}, listIDs(t, op, b, &gatewayv1.ListExecutionsRequest{}), "the operator sees every application's")
	require.Equal(t, []string{theirs}, listIDs(t, op, b, &gatewayv1.ListExecutionsRequest{ApplicationId: otherApp}))
	_, err := b.server.ListExecutions(op, &gatewayv1.ListExecutionsRequest{ApplicationId: "Bad App"})
	require.Equal(t, "application_id", field(err))
	_, err = b.server.ListExecutions(context.Background(), &gatewayv1.ListExecutionsRequest{})
	c, _ := code(err)
	require.Equal(t, codes.Unauthenticated, c, "no identity: never the operator's view")
}

func TestRedriveEventsValidateOnlyCountsAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	dead, _ := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6, deliveries: 6, age: time.Hour})
	insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6, deliveries: 6, age: 3 * time.Hour})
	insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDead, attempts: 6})
	before := readState(t, b, dead)

	resp, err := b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{ValidateOnly: true})
	require.NoError(t, err)
	require.Equal(t, int64(2), resp.GetCount(), "the application's dead events, not the other's")
	resp, err = b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{ValidateOnly: true, Since: timestamppb.New(time.Now().Add(-2 * time.Hour))})
	require.NoError(t, err)
	require.Equal(t, int64(1), resp.GetCount())
	require.Equal(t, before, readState(t, b, dead), "a preview changes nothing")

	resp, err = b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{})
	require.NoError(t, err)
	require.Equal(t, int64(2), resp.GetCount(), "the redrive does what the preview said")
}
