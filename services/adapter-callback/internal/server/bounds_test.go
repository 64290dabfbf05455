package server_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
)

func boundsStruct(t *testing.T, raw string) *structpb.Struct {
	t.Helper()
	s := &structpb.Struct{}
	require.NoError(t, protojson.Unmarshal([]byte(raw), s))
	return s
}

var unstorableDocs = map[string]string{
	"NUL":       `{"a":"x\u0000"}`,
	"NUL key":   `{"a":{"\u0000":true}}`,
	"65 levels": strings.Repeat(`{"a":`, 64) + `{}` + strings.Repeat(`}`, 64),
}

// deepStruct is a struct nested levels deep: protobuf marshals it, and refuses to decode it past
// 10 000 levels.
func deepStruct(levels int) *structpb.Struct {
	v := structpb.NewNullValue()
	for range levels {
		v = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"a": v}})
	}
	return v.GetStructValue()
}

// Progress Postgres cannot store is refused naming the field and changes nothing: the execution
// keeps running with no progress. A result it cannot store, or this service cannot decode, sent
// by a plain gRPC client (no SDK to turn the refusal into a protocol failure), is refused naming
// succeeded.result, and this service records the attempt's permanent protocol failure itself:
// the attempt does not run on until its lease ends, to run the work again.
func TestCallbacksRefuseUnstorableDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.running(t)
	for name, raw := range unstorableDocs {
		_, err := b.client.ReportProgress(authed(credential), &adapterv1.ReportProgressRequest{ExecutionId: id, Attempt: 1,
			CallbackToken: token(id, 1), Progress: boundsStruct(t, raw)})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		require.Contains(t, status.Convert(err).Message(), "progress", name)
	}
	_, err := b.client.ReportProgress(authed(credential), &adapterv1.ReportProgressRequest{ExecutionId: id, Attempt: 1,
		CallbackToken: token(id, 1), Progress: deepStruct(20000)})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "progress:", "the field is named, not the request")
	settles, fails := b.settlement.calls()
	require.Zero(t, settles+fails, "settlement never called for progress")
	require.EqualValues(t, execution.StatusRunning, b.status(t, id))

	results := map[string]*structpb.Struct{"20000 levels": deepStruct(20000)}
	for name, raw := range unstorableDocs {
		results[name] = boundsStruct(t, raw)
	}
	for name, result := range results {
		_, err := b.client.Complete(authed(credential), &adapterv1.CompleteRequest{ExecutionId: id, Attempt: 1,
			CallbackToken: token(id, 1), Outcome: &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{Result: result}}})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		require.Contains(t, status.Convert(err).Message(), "succeeded.result", name)
		require.Less(t, len(status.Convert(err).Message()), 600, name)

		b.settlement.mu.Lock()
		last := b.settlement.fails[len(b.settlement.fails)-1]
		b.settlement.mu.Unlock()
		require.Equal(t, id, last.GetExecutionId(), name)
		require.Equal(t, int32(1), last.GetAttempt(), name)
		require.Equal(t, execution.ClassProtocol, last.GetFailure().GetClass(), name)
		require.Equal(t, "adapter.invalid_result", last.GetFailure().GetCode(), name)
		require.False(t, last.GetRetryable(), "%s: permanent", name)
	}
	settles, fails = b.settlement.calls()
	require.Zero(t, settles, "no result settled")
	require.Equal(t, len(results), fails, "one protocol failure recorded per refused result")

	// An undecodable field that is not the outcome names it, and records nothing.
	raw, err := proto.Marshal(&adapterv1.CompleteRequest{ExecutionId: id, Attempt: 1,
		CallbackToken: "tok\x01", Outcome: &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{}}})
	require.NoError(t, err)
	raw = bytes.Replace(raw, []byte("tok\x01"), []byte("tok\xff"), 1) // a token that is not UTF-8
	var resp []byte
	err = b.conn.Invoke(authed(credential), adapterv1.AdapterCallbackService_Complete_FullMethodName, &raw, &resp, grpc.ForceCodecV2(rawCodec{}))
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "callback_token:")
	_, fails = b.settlement.calls()
	require.Equal(t, len(results), fails)
	var progress *string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT progress::text FROM executions WHERE id = $1`, id).Scan(&progress))
	require.Nil(t, progress, "no progress written")

	// The refusal of a hostile id quotes it bounded.
	_, err = b.client.ReportProgress(authed(credential), &adapterv1.ReportProgressRequest{ExecutionId: strings.Repeat("x", 1<<20), Attempt: 1})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Less(t, len(status.Convert(err).Message()), 200)
}

// rawCodec sends the bytes it is given as the message, as a hostile client would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }
