package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestLeaseRenewCountsRenewalsOnTheAttempt: each renewal that extends the lease is counted on
// the running attempt's row with its time (the timeline shows them); a refused one is not.
func TestLeaseRenewCountsRenewalsOnTheAttempt(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	ctx := context.Background()
	id := s.InsertExecution(t, dbtest.Execution{Status: "running", Attempt: 1})
	s.InsertAttempts(t, id, dbtest.Attempt{N: 1})
	_, err := s.Pool.Exec(ctx, `UPDATE executions SET lease_expires_at = now() + interval '10 seconds',
		deadline_at = now() + interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	renewals := func() (int32, *time.Time) {
		var n int32
		var at *time.Time
		require.NoError(t, s.Pool.QueryRow(ctx,
			`SELECT renewals, last_renewed_at FROM execution_attempts WHERE execution_id = $1 AND n = 1`, id).Scan(&n, &at))
		return n, at
	}
	n, at := renewals()
	require.Zero(t, n)
	require.Nil(t, at)

	for range 2 {
		_, _, err := st.LeaseRenew(ctx, id, 1, time.Minute)
		require.NoError(t, err)
	}
	n, at = renewals()
	require.Equal(t, int32(2), n)
	require.NotNil(t, at)

	_, _, err = st.LeaseRenew(ctx, id, 2, time.Minute)
	require.ErrorIs(t, err, ErrNotRunning, "not the running attempt")
	n, _ = renewals()
	require.Equal(t, int32(2), n, "a refused renewal is not counted")
}
