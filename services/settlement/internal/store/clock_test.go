package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// skewed is a bundle on a database whose clock is skew away from this host's.
func skewed(t *testing.T, skew time.Duration) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	s = s.WithClockSkew(t, skew)
	return &bundle{schema: s, store: New(s.Pool)}
}

// dbSeconds evaluates a time expression of the row of executions (or of its dispatch) minus the
// database's now(), in seconds, on the bundle's (skewed) clock.
func (b *bundle) dbSeconds(t *testing.T, query, id string) float64 {
	t.Helper()
	var s float64
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), query, id).Scan(&s))
	return s
}

// TestRetryDecisionRunsOnTheDatabaseClock: the next attempt's due time is the database's now()
// plus the delay, and "would it start past the deadline" is asked of the database's clock, which
// wrote the deadline — whichever way and however far this host's clock is off. With the host's
// clock in either, an hour of skew would schedule the retry an hour off, or spend or keep the
// budget wrongly.
func TestRetryDecisionRunsOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		for _, tc := range []struct {
			deadline   time.Duration // after the database's now()
			wantReason string        // empty: the next attempt is scheduled
		}{
			{deadline: 2 * time.Minute},
			{deadline: 30 * time.Second, wantReason: execution.ReasonBudget},
		} {
			t.Run(fmt.Sprintf("skew %v deadline %v", skew, tc.deadline), func(t *testing.T) {
				t.Parallel()
				b := skewed(t, skew)
				ctx := context.Background()
				id := b.insertRunning(t, 1, time.Time{})
				_, err := b.schema.Pool.Exec(ctx,
					`UPDATE executions SET deadline_at = now() + make_interval(secs => $2) WHERE id = $1`,
					id, tc.deadline.Seconds())
				require.NoError(t, err)

				out, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: id, Attempt: 1, Retryable: true,
					Failure: execution.Failure{Class: execution.ClassTransient}, Scale: identity})
				require.NoError(t, err)
				row := b.execution(t, id)
				if tc.wantReason != "" {
					require.Equal(t, execution.StatusFailed, row.Status)
					require.Equal(t, tc.wantReason, *row.FailureReason)
					return
				}
				require.Equal(t, execution.StatusPending, row.Status)
				require.NotNil(t, out.NextAttemptAt)
				// The catalog's delay before attempt 2 is 1m: due a minute after the database's now
				// (less the little time the test took since), not a minute after this host's.
				inSecs := b.dbSeconds(t, `SELECT extract(epoch FROM due_at - now())::float8 FROM dispatches WHERE execution_id = $1`, id)
				require.InDelta(t, 60, inSecs, 2, "due in a minute on the database's clock")
				require.WithinDuration(t, time.Now().Add(skew+time.Minute), *out.NextAttemptAt, 2*time.Second,
					"the due time reported is the one the database wrote")
			})
		}
	}
}

// TestSweeperUsesTheDatabaseClock: a lease that expired on the database's clock is swept even
// while this host's clock says it has an hour to run, and one the database says still runs is
// left alone though this host's clock says it ended an hour ago.
func TestSweeperUsesTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			t.Parallel()
			b := skewed(t, skew)
			ctx := context.Background()
			expiredID := b.insertRunningAs(t, 1, dbtest.Execution{})
			liveID := b.insertRunningAs(t, 1, dbtest.Execution{})
			_, err := b.schema.Pool.Exec(ctx, `
				UPDATE executions SET lease_expires_at = CASE WHEN id = $1 THEN now() - interval '10 seconds'
					ELSE now() + interval '5 minutes' END
				WHERE id IN ($1, $2)`, expiredID, liveID)
			require.NoError(t, err)

			swept, err := b.store.ExecutionSweep(ctx, 10, time.Second, identity)
			require.NoError(t, err)
			require.Len(t, swept, 1)
			require.Equal(t, expiredID, swept[0].ExecutionID)
			require.NoError(t, swept[0].Err)
			require.NotNil(t, swept[0].Result.NextAttemptAt, "retried: attempt 1 of 3, a day of budget")
			inSecs := b.dbSeconds(t, `SELECT extract(epoch FROM due_at - now())::float8 FROM dispatches WHERE execution_id = $1`, expiredID)
			require.InDelta(t, 60, inSecs, 2, "due in a minute on the database's clock")
			require.Equal(t, execution.StatusRunning, b.execution(t, liveID).Status)
		})
	}
}
