package server

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

func boundsStruct(t testing.TB, raw string) *structpb.Struct {
	t.Helper()
	s := &structpb.Struct{}
	require.NoError(t, protojson.Unmarshal([]byte(raw), s))
	return s
}

func boundsDeep(levels int) string {
	return strings.Repeat(`{"a":`, levels-1) + `{}` + strings.Repeat("}", levels-1)
}

func boundsRows(t *testing.T, b *bundle) (n int) {
	t.Helper()
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM executions) + (SELECT count(*) FROM integration_events)`).Scan(&n))
	return n
}

// Every input Postgres could not store, or could not give back, is refused as INVALID_ARGUMENT
// naming the field, with a bounded message, and nothing is written.
func TestInvokeRefusesUnstorableInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	huge := strings.Repeat("x", 1<<20)
	tests := []struct {
		name  string
		req   *gatewayv1.InvokeCapabilityRequest
		key   string
		field string
	}{
		{"NUL in a payload value", &gatewayv1.InvokeCapabilityRequest{Payload: boundsStruct(t, `{"a":"x\u0000"}`)}, "", "payload"},
		{"NUL in a payload key", &gatewayv1.InvokeCapabilityRequest{Payload: boundsStruct(t, `{"a":{"\u0000":1}}`)}, "", "payload"},
		{"65 levels", &gatewayv1.InvokeCapabilityRequest{Payload: boundsStruct(t, boundsDeep(65))}, "", "payload"},
		{"1000 levels", &gatewayv1.InvokeCapabilityRequest{Payload: boundsStruct(t, boundsDeep(1000))}, "", "payload"},
		{"NUL in the capability", &gatewayv1.InvokeCapabilityRequest{Capability: "dummy\x00"}, "", "capability"},
		{"a huge capability", &gatewayv1.InvokeCapabilityRequest{Capability: huge}, "", "capability"},
		{"NUL in the idempotency key field", &gatewayv1.InvokeCapabilityRequest{IdempotencyKey: "k\x00"}, "", "idempotency_key"},
		{"NUL in the idempotency key header", &gatewayv1.InvokeCapabilityRequest{}, "k\x00", "idempotency_key"},
	}
	for _, tc := range tests {
		before := boundsRows(t, b)
		if tc.req.Capability == "" {
			tc.req.Capability = dbtest.TestCapability
		}
		tc.req.Mode = executionv1.Mode_MODE_ASYNC
		ctx := b.ctx
		if tc.key != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(IdempotencyKeyHeader, tc.key))
		}
		_, err := b.server.InvokeCapability(ctx, tc.req)
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c, "%s: %v", tc.name, err)
		require.Equal(t, tc.field, field(err), tc.name)
		require.Less(t, len(grpcx.ToStatus(err).Message()), 512, "%s: the message is bounded", tc.name)
		require.Equal(t, before, boundsRows(t, b), "%s: nothing written", tc.name)
	}

	// Two idempotency keys in metadata (gRPC keeps both; REST gave both under two header
	// names): which one counted was chance. Refused, nothing written.
	before := boundsRows(t, b)
	_, err := b.server.InvokeCapability(metadata.NewIncomingContext(b.ctx, metadata.Pairs(IdempotencyKeyHeader, "k-1", IdempotencyKeyHeader, "k-2")),
		&gatewayv1.InvokeCapabilityRequest{Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_ASYNC})
	c, _ := code(err)
	require.Equal(t, codes.InvalidArgument, c, "%v", err)
	require.Equal(t, "idempotency_key", field(err))
	require.Equal(t, before, boundsRows(t, b), "two keys: nothing written")

	// An empty key in metadata would be no key at all: a retry would run the work again.
	for _, empty := range []string{"", "  "} {
		_, err = b.server.InvokeCapability(metadata.NewIncomingContext(b.ctx, metadata.Pairs(IdempotencyKeyHeader, empty)),
			&gatewayv1.InvokeCapabilityRequest{Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_ASYNC})
		c, _ = code(err)
		require.Equal(t, codes.InvalidArgument, c, "%q: %v", empty, err)
		require.Equal(t, "idempotency_key", field(err))
		require.Equal(t, before, boundsRows(t, b), "an empty key: nothing written")
	}

	// 64 levels is within the bound.
	_, err = b.server.InvokeCapability(b.ctx, &gatewayv1.InvokeCapabilityRequest{
		Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_ASYNC, Payload: boundsStruct(t, boundsDeep(64))})
	require.NoError(t, err)
}

func TestListsRefuseBadFiltersAndLeaveDocumentsOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, req := range map[string]*gatewayv1.ListExecutionsRequest{
		"NUL capability":  {Capability: "a\x00"},
		"page over 100":   {PageSize: MaxPageSize + 1},
		"negative page":   {PageSize: -1},
		"huge capability": {Capability: strings.Repeat("é", 5000)},
	} {
		_, err := b.server.ListExecutions(b.ctx, req)
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c, "%s: %v", name, err)
		require.Less(t, len(grpcx.ToStatus(err).Message()), 512, name)
	}
	_, err := b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{ExecutionId: "x\x00"})
	require.Equal(t, "execution_id", field(err))

	// A settled execution with a result: the list shows neither payload nor result, GET does.
	resp, err := b.server.InvokeCapability(b.ctx, &gatewayv1.InvokeCapabilityRequest{
		Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_ASYNC, Payload: boundsStruct(t, `{"p":1}`)})
	require.NoError(t, err)
	id := resp.GetExecution().GetId()
	_, err = b.schema.Pool.Exec(context.Background(),
		`UPDATE executions SET status = 'succeeded', result = '{"r":1}', progress = '{"pc":5}', settled_at = now() WHERE id = $1`, id)
	require.NoError(t, err)
	list, err := b.server.ListExecutions(b.ctx, &gatewayv1.ListExecutionsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetExecutions(), 1)
	item := list.GetExecutions()[0]
	require.Equal(t, id, item.GetId())
	require.Nil(t, item.GetPayload())
	require.Nil(t, item.GetResult())
	require.Nil(t, item.GetProgress())
	got, err := b.server.GetExecution(b.ctx, &gatewayv1.GetExecutionRequest{Id: id})
	require.NoError(t, err)
	require.Equal(t, float64(1), got.GetExecution().GetResult().GetFields()["r"].GetNumberValue())
	require.Equal(t, float64(1), got.GetExecution().GetPayload().GetFields()["p"].GetNumberValue())
}

func TestSetConsumerRefusesNUL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, req := range map[string]*gatewayv1.SetConsumerRequest{
		"webhook.url": {Consumer: &gatewayv1.SetConsumerRequest_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: "https://example.com/\x00"}}},
		"grpc.target": {Consumer: &gatewayv1.SetConsumerRequest_Grpc{Grpc: &gatewayv1.GrpcConsumer{Target: "exa\x00mple.com:443"}}},
	} {
		_, err := b.server.SetConsumer(b.ctx, req)
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c, "%s: %v", name, err)
		require.Equal(t, name, field(err))
	}
}
