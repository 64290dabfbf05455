package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
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

// Progress and results Postgres cannot store are refused naming the field, and change nothing:
// the execution keeps running with no progress, settlement is never called.
func TestCallbacksRefuseUnstorableDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.running(t)
	for name, raw := range unstorableDocs {
		_, err := b.client.ReportProgress(authed(credential), &adapterv1.ReportProgressRequest{ExecutionId: id, Attempt: 1,
			CallbackToken: token(id, 1), Progress: boundsStruct(t, raw)})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		require.Contains(t, status.Convert(err).Message(), "progress", name)

		_, err = b.client.Complete(authed(credential), &adapterv1.CompleteRequest{ExecutionId: id, Attempt: 1,
			CallbackToken: token(id, 1), Outcome: &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{Result: boundsStruct(t, raw)}}})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		require.Contains(t, status.Convert(err).Message(), "succeeded.result", name)
	}
	settles, fails := b.settlement.calls()
	require.Zero(t, settles+fails, "settlement never called")
	require.Equal(t, execution.StatusRunning, b.status(t, id))
	var progress *string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT progress::text FROM executions WHERE id = $1`, id).Scan(&progress))
	require.Nil(t, progress, "no progress written")

	// The refusal of a hostile id quotes it bounded.
	_, err := b.client.ReportProgress(authed(credential), &adapterv1.ReportProgressRequest{ExecutionId: strings.Repeat("x", 1<<20), Attempt: 1})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Less(t, len(status.Convert(err).Message()), 200)
}
