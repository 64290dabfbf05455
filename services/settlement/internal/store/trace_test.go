package store

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/execution"
)

// The completion event's row carries its execution's trace context, from a settlement and from a
// failure that ends the execution alike, so that the event's relay and delivery continue it.
func TestCompletionEventCarriesTheExecutionsTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	traced := func() string {
		id := b.insertRunning(t, 1, dayFromNow())
		_, err := b.schema.Pool.Exec(ctx, `UPDATE executions SET traceparent = $2, tracestate = 'v=1' WHERE id = $1`, id, tp)
		require.NoError(t, err)
		return id
	}
	eventTrace := func(id string) (tp, ts *string) {
		require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT traceparent, tracestate FROM integration_events WHERE execution_id = $1`, id).Scan(&tp, &ts))
		return tp, ts
	}

	settled := traced()
	_, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: settled, Attempt: 1, FromStatus: execution.StatusRunning,
		Status: execution.StatusSucceeded, Result: []byte(`{}`)})
	require.NoError(t, err)
	failed := traced()
	_, err = b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: failed, Attempt: 1, Scale: identity,
		Failure: execution.Failure{Class: execution.ClassPermanent, Code: "NO", Message: "no"}})
	require.NoError(t, err)
	for _, id := range []string{settled, failed} {
		gotTP, gotTS := eventTrace(id)
		if assert.NotNil(t, gotTP, id) && assert.NotNil(t, gotTS, id) {
			assert.Equal(t, tp, *gotTP)
			assert.Equal(t, "v=1", *gotTS)
		}
	}

	untraced := b.insertRunning(t, 1, dayFromNow())
	_, err = b.store.ExecutionSettle(ctx, Outcome{ExecutionID: untraced, Attempt: 1, FromStatus: execution.StatusRunning,
		Status: execution.StatusSucceeded, Result: []byte(`{}`)})
	require.NoError(t, err)
	gotTP, gotTS := eventTrace(untraced)
	assert.Nil(t, gotTP, "no trace: NULL")
	assert.Nil(t, gotTS)
}
