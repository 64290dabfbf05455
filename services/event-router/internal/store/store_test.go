package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

func TestEventReleaseStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)

	// insert adds a pending event with the given SQL expressions for its relay and delivery state.
	insert := func(relayedAt, nextAttemptAt, claimedUntil, status string) string {
		exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
		id := uuid.NewString()
		_, err := s.Pool.Exec(ctx, `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at,
				next_attempt_at, delivery_claimed_until, delivery_status)
			VALUES ($1, $2, $3, 'execution.completed', '{}', `+relayedAt+`, `+nextAttemptAt+`, `+claimedUntil+`, $4)`,
			id, dbtest.TestApp, exec, status)
		require.NoError(t, err)
		return id
	}
	lost := insert("now() - interval '2 hours'", "now() - interval '1 hour'", "NULL", "pending")
	neverTried := insert("now() - interval '2 hours'", "NULL", "NULL", "pending")
	waiting := insert("now() - interval '2 hours'", "now() + interval '1 hour'", "NULL", "pending")
	recentlyDue := insert("now() - interval '2 hours'", "now() - interval '1 minute'", "NULL", "pending")
	delivering := insert("now() - interval '2 hours'", "now() - interval '1 hour'", "now() + interval '10 seconds'", "pending")
	unrelayed := insert("NULL", "NULL", "NULL", "pending")
	delivered := insert("now() - interval '2 hours'", "now() - interval '1 hour'", "NULL", "delivered")

	n, err := st.EventReleaseStale(ctx, 10*time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	relayed := func(id string) bool {
		var at *string
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT relayed_at::text FROM integration_events WHERE id = $1`, id).Scan(&at))
		return at != nil
	}
	require.False(t, relayed(lost), "its next attempt was due an hour ago: the notice is lost")
	require.False(t, relayed(neverTried), "relayed two hours ago and never tried")
	require.True(t, relayed(waiting), "its next attempt is not due yet")
	require.True(t, relayed(recentlyDue), "within the grace")
	require.True(t, relayed(delivering), "a delivery holds it")
	require.False(t, relayed(unrelayed), "already waiting for the relay")
	require.True(t, relayed(delivered), "delivered events are done")
}
