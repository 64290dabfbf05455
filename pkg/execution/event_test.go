package execution_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// TestEventDataReadsTyped: the data the statements build (CompletedDataSQL, ProgressDataSQL) reads
// into the events' typed messages (webhooks.TypedData, as the gateway and the event router read
// it), and the typed message says exactly what the data says: written back as JSON, zero values
// and all, it is the same object. A member added to the SQL and not to the messages fails here.
func TestEventDataReadsTyped(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	read := func(t *testing.T, typ, query, id string) {
		t.Helper()
		var data []byte
		require.NoError(t, s.Pool.QueryRow(ctx, query, id).Scan(&data))
		typed, err := webhooks.TypedData(typ, data)
		require.NoError(t, err)
		require.NotNil(t, typed)
		back, err := protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}.Marshal(typed)
		require.NoError(t, err)
		require.JSONEq(t, string(data), string(back))
	}
	for _, tc := range []struct {
		name   string
		status execution.Status
		set    string
	}{
		{"succeeded, with a key and a result", execution.StatusSucceeded,
			`attempt = 2, event_seq = 3, idempotency_key = 'k-1', result = '{"echo": {"n": [1, 2.5], "s": "é"}}'`},
		{"failed, an empty code left out", execution.StatusFailed,
			`attempt = 1, event_seq = 1, failure_class = 'permanent', failure_reason = 'adapter.permanent', failure_code = '', failure_message = 'no'`},
		{"cancelled before an attempt", execution.StatusCancelled,
			`attempt = 0, event_seq = 1, failure_reason = 'cancelled', failure_message = 'cancelled by the operator'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := s.InsertExecution(t, dbtest.Execution{Status: tc.status})
			_, err := s.Pool.Exec(ctx, `UPDATE executions SET `+tc.set+` WHERE id = $1`, id)
			require.NoError(t, err)
			read(t, execution.EventTypeExecutionComplete, `SELECT `+execution.CompletedDataSQL("e")+` FROM executions e WHERE id = $1`, id)
		})
	}
	t.Run("progress", func(t *testing.T) {
		id := s.InsertExecution(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1})
		read(t, execution.EventTypeExecutionProgress,
			`SELECT `+execution.ProgressDataSQL("e", `'{"pct": 40, "step": "upload"}'::jsonb`)+` FROM executions e WHERE id = $1`, id)
	})
}
