package webhooks_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// TestTypedData: a body's data reads into its type's message with every member, absent members
// unset, and a member the message does not know skipped.
func TestTypedData(t *testing.T) {
	t.Parallel()
	completed := `{"execution_id": "ex-1", "capability": "dummy.echo", "mode": "async", "status": "failed",
		"attempt": 3, "sequence": 4, "idempotency_key": "k-1", "failure": {"class": "permanent", "reason": "adapter.permanent"},
		"added_later": {"x": 1}}`
	m, err := webhooks.TypedData(webhooks.TypeExecutionCompleted, []byte(completed))
	require.NoError(t, err)
	want := &eventsv1.ExecutionCompletedData{ExecutionId: "ex-1", Capability: "dummy.echo", Mode: "async", Status: "failed",
		Attempt: 3, Sequence: 4, IdempotencyKey: proto.String("k-1"),
		Failure: &eventsv1.CompletionFailure{Class: proto.String("permanent"), Reason: proto.String("adapter.permanent")}}
	require.True(t, proto.Equal(want, m), "got %v", m)
	require.Nil(t, m.(*eventsv1.ExecutionCompletedData).GetFailure().Code, "an absent text is unset, not empty")

	progress := `{"execution_id": "ex-1", "capability": "dummy.echo", "attempt": 1, "sequence": 2, "progress": {"pct": 50}}`
	m, err = webhooks.TypedData(webhooks.TypeExecutionProgress, []byte(progress))
	require.NoError(t, err)
	pct, err := structpb.NewStruct(map[string]any{"pct": 50})
	require.NoError(t, err)
	require.True(t, proto.Equal(&eventsv1.ExecutionProgressData{ExecutionId: "ex-1", Capability: "dummy.echo", Attempt: 1, Sequence: 2,
		Progress: pct}, m), "got %v", m)

	// The typed message says what the data says: written back as JSON, it is the same object.
	back, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	require.NoError(t, err)
	require.JSONEq(t, progress, string(back))

	for _, none := range []struct{ typ, data string }{
		{"execution.other", completed}, {webhooks.TypeExecutionCompleted, ""}, {webhooks.TypeExecutionCompleted, "null"},
	} {
		m, err := webhooks.TypedData(none.typ, []byte(none.data))
		require.NoError(t, err, "%s %q", none.typ, none.data)
		require.Nil(t, m, "%s %q", none.typ, none.data)
	}
	_, err = webhooks.TypedData(webhooks.TypeExecutionCompleted, []byte(`{"attempt": "three"}`))
	require.Error(t, err, "a member of the wrong type")
}
