package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestLeaseRenewIsOnTheDatabaseClock: a renewed lease ends the lease after the database's now(),
// never past the deadline the database wrote, and a lease that ended by the database's clock is
// not renewed — whichever way this host's clock is off.
func TestLeaseRenewIsOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			t.Parallel()
			s := dbtest.NewSchema(t)
			s.ApplyCatalog(t, dbtest.TestCatalog)
			s = s.WithClockSkew(t, skew)
			st := New(s.Pool)
			ctx := context.Background()
			secondsLeft := func(id string) float64 {
				var secs float64
				require.NoError(t, s.Pool.QueryRow(ctx,
					`SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM executions WHERE id = $1`, id).Scan(&secs))
				return secs
			}
			insert := func(lease, deadline string) string {
				id := s.InsertExecution(t, dbtest.Execution{Status: "running", Attempt: 1})
				_, err := s.Pool.Exec(ctx, `UPDATE executions SET lease_expires_at = now() + $2::interval,
					deadline_at = now() + $3::interval WHERE id = $1`, id, lease, deadline)
				require.NoError(t, err)
				return id
			}

			live := insert("10 seconds", "1 hour")
			until, granted, err := st.LeaseRenew(ctx, live, 1, 2*time.Minute)
			require.NoError(t, err)
			require.InDelta(t, 120, granted.Seconds(), 1, "the lease granted, as the database measured it")
			require.InDelta(t, 120, secondsLeft(live), 2, "two minutes after the database's now")
			require.WithinDuration(t, time.Now().Add(skew+2*time.Minute), until, 2*time.Second)

			nearDeadline := insert("10 seconds", "30 seconds")
			_, granted, err = st.LeaseRenew(ctx, nearDeadline, 1, 2*time.Minute)
			require.NoError(t, err)
			require.InDelta(t, 30, granted.Seconds(), 1, "granted up to the deadline")
			require.InDelta(t, 30, secondsLeft(nearDeadline), 2, "held to the deadline")

			ended := insert("-1 second", "1 hour")
			_, _, err = st.LeaseRenew(ctx, ended, 1, 2*time.Minute)
			require.ErrorIs(t, err, ErrNotRunning, "the lease ended on the database's clock")
		})
	}
}
