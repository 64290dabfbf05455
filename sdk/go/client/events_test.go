package client_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/sdk/go/client"
)

// TestEventData: CompletedData and ProgressData answer an event's typed data, and read it from
// the untyped data when a v0.1 gateway sent only that.
func TestEventData(t *testing.T) {
	t.Parallel()
	completed := &client.ExecutionCompletedData{ExecutionId: "ex-1", Capability: "dummy.echo", Mode: "async", Status: "succeeded",
		Attempt: 1, Sequence: 2, IdempotencyKey: proto.String("k-1")}
	data, err := structpb.NewStruct(map[string]any{"execution_id": "ex-1", "capability": "dummy.echo", "mode": "async",
		"status": "succeeded", "attempt": 1, "sequence": 2, "idempotency_key": "k-1"})
	require.NoError(t, err)

	typed := &client.Event{Type: "execution.completed", Data: data,
		TypedData: &eventsv1.Event_ExecutionCompleted{ExecutionCompleted: completed}}
	require.Same(t, completed, client.CompletedData(typed))
	require.Nil(t, client.ProgressData(typed))

	old := &client.Event{Type: "execution.completed", Data: data} // a v0.1 gateway's answer
	require.True(t, proto.Equal(completed, client.CompletedData(old)), "got %v", client.CompletedData(old))
	require.Nil(t, client.ProgressData(old))

	progress, err := structpb.NewStruct(map[string]any{"execution_id": "ex-1", "capability": "dummy.echo", "attempt": 1,
		"sequence": 1, "progress": map[string]any{"pct": 40}})
	require.NoError(t, err)
	p := client.ProgressData(&client.Event{Type: "execution.progress", Data: progress})
	require.Equal(t, float64(40), p.GetProgress().GetFields()["pct"].GetNumberValue())
	require.Nil(t, client.CompletedData(&client.Event{Type: "execution.progress", Data: progress}))
	require.Nil(t, client.CompletedData(&client.Event{Type: "execution.completed"}), "no data")
}
