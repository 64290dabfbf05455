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

	// Relayed again (a fresh notice is out): not released again until that one had its time.
	_, err = s.Pool.Exec(ctx, `UPDATE integration_events SET relayed_at = now() WHERE id = ANY($1::uuid[])`, []string{lost, neverTried})
	require.NoError(t, err)
	n, err = st.EventReleaseStale(ctx, 10*time.Minute)
	require.NoError(t, err)
	require.Zero(t, n, "an event is not republished on every pass")
}

// TestDeliveryRecordAfterRedelivery: an attempt that was in flight when the event was redelivered
// (its count reset to 0) belongs to the old budget: it is kept in the history but does not count
// against the fresh budget or settle the event.
func TestDeliveryRecordAfterRedelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
	id := uuid.NewString()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at, attempts)
		VALUES ($1, $2, $3, 'execution.completed', '{}', now(), 5)`, id, dbtest.TestApp, exec)
	require.NoError(t, err)

	ev, err := st.DeliveryClaim(ctx, id, time.Minute)
	require.NoError(t, err)
	require.False(t, ev.Claim.IsZero(), "claimed")
	require.EqualValues(t, 5, ev.Attempts)
	// The application redelivers the event while attempt 6 is in flight.
	_, err = s.Pool.Exec(ctx, `UPDATE integration_events SET attempts = 0, relayed_at = NULL WHERE id = $1`, id)
	require.NoError(t, err)

	applied, err := st.DeliveryRecord(ctx, id, Attempt{StatusCode: 500, Err: "webhook answered 500", Outcome: "dead",
		Claim: ev.Claim, Attempts: ev.Attempts})
	require.NoError(t, err)
	require.False(t, applied, "the old budget's last attempt does not kill the redelivered event")
	var status string
	var attempts, history int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT delivery_status, attempts FROM integration_events WHERE id = $1`, id).Scan(&status, &attempts))
	require.Equal(t, "pending", status)
	require.Zero(t, attempts)
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM event_deliveries WHERE event_id = $1`, id).Scan(&history))
	require.Equal(t, 1, history, "the attempt is in the history")

	// A claim that expired and was taken by another delivery is not released by the first.
	_, err = s.Pool.Exec(ctx, `UPDATE integration_events SET delivery_claimed_until = now() + interval '1 minute' WHERE id = $1`, id)
	require.NoError(t, err)
	require.NoError(t, st.DeliveryRelease(ctx, id, ev.Claim))
	var claimed bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT delivery_claimed_until IS NOT NULL FROM integration_events WHERE id = $1`, id).Scan(&claimed))
	require.True(t, claimed, "another delivery's claim stays")
}

// TestEventReleaseDeadNoticed: an event whose notice is in the DLQ gets a fresh one at once if it
// is still pending, was relayed longer ago than the notice budget, and nothing delivers it now;
// the others are only reported, and an unknown id is left out.
func TestEventReleaseDeadNoticed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	insert := func(relayedAt, claimedUntil, status string) string {
		exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
		id := uuid.NewString()
		_, err := s.Pool.Exec(ctx, `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at,
				delivery_claimed_until, delivery_status)
			VALUES ($1, $2, $3, 'execution.completed', '{}', `+relayedAt+`, `+claimedUntil+`, $4)`,
			id, dbtest.TestApp, exec, status)
		require.NoError(t, err)
		return id
	}
	lost := insert("now() - interval '20 seconds'", "NULL", "pending")
	// Relayed 2 s ago, within an 11 s budget: the dead letter is of an earlier notice.
	fresh := insert("now() - interval '2 seconds'", "NULL", "pending")
	delivering := insert("now() - interval '20 seconds'", "now() + interval '10 seconds'", "pending")
	delivered := insert("now() - interval '20 seconds'", "NULL", "delivered")
	dead := insert("now() - interval '20 seconds'", "NULL", "dead")
	unknown := uuid.NewString()

	got, err := st.EventReleaseDeadNoticed(ctx, []string{lost, fresh, delivering, delivered, dead, unknown}, 11*time.Second)
	require.NoError(t, err)
	byID := map[string]DeadNotice{}
	for _, n := range got {
		byID[n.EventID] = n
	}
	require.Len(t, byID, 5, "the unknown id is left out")
	require.Equal(t, DeadNotice{EventID: lost, Status: "pending", Released: true}, byID[lost])
	require.Equal(t, DeadNotice{EventID: fresh, Status: "pending"}, byID[fresh])
	require.Equal(t, DeadNotice{EventID: delivering, Status: "pending"}, byID[delivering])
	require.Equal(t, DeadNotice{EventID: delivered, Status: "delivered"}, byID[delivered])
	require.Equal(t, DeadNotice{EventID: dead, Status: "dead"}, byID[dead])
	var unrelayed []string
	rows, err := s.Pool.Query(ctx, `SELECT id::text FROM integration_events WHERE relayed_at IS NULL`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		unrelayed = append(unrelayed, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{lost}, unrelayed, "only the lost one waits for the relay")

	// Its fresh notice is out (relayed again): the same dead letter does not release it again.
	_, err = s.Pool.Exec(ctx, `UPDATE integration_events SET relayed_at = now() WHERE id = $1`, lost)
	require.NoError(t, err)
	got, err = st.EventReleaseDeadNoticed(ctx, []string{lost}, 11*time.Second)
	require.NoError(t, err)
	require.Equal(t, []DeadNotice{{EventID: lost, Status: "pending"}}, got)
}

// TestEventReleaseDeadNoticedInBackoff: an event whose old notice is in the DLQ but which is now
// on its delivery schedule (a fresh notice was delivered, the receiver failed, the next attempt
// is ahead) has a live notice deferred until that attempt: it is not released on pass after pass
// while the dead letter stays, only once its next attempt is overdue by the notice budget.
func TestEventReleaseDeadNoticedInBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	insert := func(nextAttemptAt string) string {
		exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
		id := uuid.NewString()
		_, err := s.Pool.Exec(ctx, `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at,
				attempts, next_attempt_at, delivery_status)
			VALUES ($1, $2, $3, 'execution.completed', '{}', now() - interval '1 hour', 1, `+nextAttemptAt+`, 'pending')`,
			id, dbtest.TestApp, exec)
		require.NoError(t, err)
		return id
	}
	backoff := insert("now() + interval '5 minutes'")
	justDue := insert("now() - interval '2 seconds'")
	overdue := insert("now() - interval '20 seconds'")

	for pass := range 5 {
		got, err := st.EventReleaseDeadNoticed(ctx, []string{backoff, justDue}, 11*time.Second)
		require.NoError(t, err)
		require.Len(t, got, 2)
		for _, n := range got {
			require.False(t, n.Released, "pass %d: event %s has a live notice on its schedule", pass, n.EventID)
		}
	}
	got, err := st.EventReleaseDeadNoticed(ctx, []string{overdue}, 11*time.Second)
	require.NoError(t, err)
	require.Equal(t, []DeadNotice{{EventID: overdue, Status: "pending", Released: true}}, got,
		"its next attempt was due longer ago than the budget: the notice is lost")

	var relayed int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM integration_events WHERE relayed_at IS NOT NULL`).Scan(&relayed))
	require.Equal(t, 2, relayed, "only the overdue event waits for the relay")
}
