package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestDeliveryRecordBatchEachCallerItsOwnAnswer: concurrent records share statements (the
// batcher's counts say fewer batches than records), each caller is answered for its own event —
// a loser (a claim that is no longer the event's) is told not applied and moves nothing while the
// others in its batch apply — and every attempt, the loser's too, is in the history.
func TestDeliveryRecordBatchEachCallerItsOwnAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)

	const n = 40
	ids := make([]string, n)
	claims := make([]time.Time, n)
	for i := range ids {
		exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
		ids[i] = uuid.NewString()
		_, err := s.Pool.Exec(ctx, `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at)
			VALUES ($1, $2, $3, 'execution.completed', '{}', now())`, ids[i], dbtest.TestApp, exec)
		require.NoError(t, err)
		ev, err := st.DeliveryClaim(ctx, ids[i], time.Minute)
		require.NoError(t, err)
		require.False(t, ev.Claim.IsZero())
		claims[i] = ev.Claim
	}
	// Event 0's claim was taken over by another delivery: its record must lose.
	_, err := s.Pool.Exec(ctx, `UPDATE integration_events SET delivery_claimed_until = now() + interval '2 minutes' WHERE id = $1`, ids[0])
	require.NoError(t, err)

	applied := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			a := Attempt{StatusCode: 200, Duration: time.Millisecond, Outcome: "delivered", Claim: claims[i]}
			if i%2 == 1 {
				a = Attempt{StatusCode: 503, Err: "webhook answered 503", Outcome: "pending", NextIn: time.Minute, Claim: claims[i]}
			}
			applied[i], errs[i] = st.DeliveryRecord(ctx, ids[i], a)
		})
	}
	wg.Wait()
	for i := range ids {
		require.NoError(t, errs[i])
		require.Equal(t, i != 0, applied[i], "event %d", i)
		var status string
		var attempts, history int
		var claimed bool
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT delivery_status, attempts, delivery_claimed_until IS NOT NULL FROM integration_events WHERE id = $1`,
			ids[i]).Scan(&status, &attempts, &claimed))
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM event_deliveries WHERE event_id = $1`, ids[i]).Scan(&history))
		require.Equal(t, 1, history, "event %d: the attempt is in the history", i)
		switch {
		case i == 0:
			require.Equal(t, "pending", status)
			require.Zero(t, attempts, "the loser moves nothing")
			require.True(t, claimed, "the other delivery's claim stays")
		case i%2 == 1:
			require.Equal(t, "pending", status)
			require.Equal(t, 1, attempts)
			require.False(t, claimed)
		default:
			require.Equal(t, "delivered", status)
			require.Equal(t, 1, attempts)
		}
	}
	stats := st.RecordStats()
	require.EqualValues(t, n, stats.Items)
	t.Logf("%d records in %d batches (largest %d)", stats.Items, stats.Batches, stats.Largest)
}

// TestDeliveryRecordBatchNumbersOneEventsAttemptsApart: two records of one event in one batch
// (a stale claim's beside the live one) get consecutive numbers after the history, and only the
// live one applies.
func TestDeliveryRecordBatchNumbersOneEventsAttemptsApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
	id := uuid.NewString()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, relayed_at)
		VALUES ($1, $2, $3, 'execution.completed', '{}', now())`, id, dbtest.TestApp, exec)
	require.NoError(t, err)
	ev, err := st.DeliveryClaim(ctx, id, time.Minute)
	require.NoError(t, err)
	applied, errs, err := st.recordBatch(ctx, []record{
		{eventID: id, a: Attempt{Err: "timeout", Outcome: "pending", NextIn: time.Minute, Claim: ev.Claim.Add(-time.Second)}},
		{eventID: id, a: Attempt{StatusCode: 200, Outcome: "delivered", Claim: ev.Claim}},
	})
	require.NoError(t, err)
	require.Nil(t, errs)
	require.Equal(t, []bool{false, true}, applied)
	var ns []int
	rows, err := s.Pool.Query(ctx, `SELECT n FROM event_deliveries WHERE event_id = $1 ORDER BY n`, id)
	require.NoError(t, err)
	for rows.Next() {
		var n int
		require.NoError(t, rows.Scan(&n))
		ns = append(ns, n)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int{1, 2}, ns)
}
