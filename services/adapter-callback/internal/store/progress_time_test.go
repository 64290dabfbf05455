package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/execution"
)

// TestProgressSetCountsReportsOnTheAttempt: each stored report is counted on the running
// attempt's row with its time, the execution's update time (the timeline places the progress
// entry there, within its attempt); a refused one is not counted.
func TestProgressSetCountsReportsOnTheAttempt(t *testing.T) {
	t.Parallel()
	b := setupProgress(t)
	ctx := context.Background()
	id := b.running(t, "test.progress", execution.ModeAsync)
	reports := func() (int32, *time.Time) {
		var n int32
		var at *time.Time
		require.NoError(t, b.schema.Pool.QueryRow(ctx,
			`SELECT progress_reports, last_progress_at FROM execution_attempts WHERE execution_id = $1 AND n = 1`, id).Scan(&n, &at))
		return n, at
	}
	n, at := reports()
	require.Zero(t, n)
	require.Nil(t, at)

	for _, pct := range []string{`{"percent": 10}`, `{"percent": 50}`} {
		_, err := b.store.ProgressSet(ctx, id, 1, []byte(pct))
		require.NoError(t, err)
	}
	n, at = reports()
	require.Equal(t, int32(2), n)
	require.NotNil(t, at)
	var updated time.Time
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT updated_at FROM executions WHERE id = $1`, id).Scan(&updated))
	require.True(t, updated.Equal(*at), "the last report's time is the execution's update (%s, %s)", at, updated)

	_, err := b.store.ProgressSet(ctx, id, 2, []byte(`{"percent": 90}`))
	require.ErrorIs(t, err, ErrNotRunning, "not the running attempt")
	n, _ = reports()
	require.Equal(t, int32(2), n, "a refused report is not counted")
}
