package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// The relay's claim and the delivery's claim answer each event's execution and trace context (the
// relay's notice and the delivery continue it); an event without one answers empty.
func TestClaimsReadTheEventsTraceContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	insert := func(traceparent any) (event, exec string) {
		exec = s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
		event = uuid.NewString()
		_, err := s.Pool.Exec(ctx, `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload, traceparent, tracestate)
			VALUES ($1, $2, $3, 'execution.completed', '{}', $4, CASE WHEN $4::text IS NULL THEN NULL ELSE 'v=1' END)`,
			event, dbtest.TestApp, exec, traceparent)
		require.NoError(t, err)
		return event, exec
	}
	traced, tracedExec := insert(tp)
	untraced, untracedExec := insert(nil)

	// One handed over in process, one to publish.
	pub, here, _, err := st.EventClaimForRelay(ctx, 10, time.Minute, 1, time.Minute)
	require.NoError(t, err)
	require.Len(t, pub, 1)
	require.Len(t, here, 1)
	got := map[string][3]string{
		pub[0].ID:       {pub[0].ExecutionID, pub[0].Traceparent, pub[0].Tracestate},
		here[0].EventID: {here[0].ExecutionID, here[0].Traceparent, here[0].Tracestate},
	}
	assert.Equal(t, [3]string{tracedExec, tp, "v=1"}, got[traced])
	assert.Equal(t, [3]string{untracedExec, "", ""}, got[untraced])

	for event, want := range map[string][3]string{traced: {tracedExec, tp, "v=1"}, untraced: {untracedExec, "", ""}} {
		d, err := st.DeliveryClaim(ctx, event, time.Minute)
		require.NoError(t, err)
		assert.Equal(t, want, [3]string{d.ExecutionID, d.Traceparent, d.Tracestate}, "delivery claim of %s", event)
	}
}
