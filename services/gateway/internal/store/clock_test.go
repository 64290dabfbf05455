package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/secret"
)

// TestAcceptSetsTheDeadlineOnTheDatabaseClock: an accepted execution's deadline (and a sync
// attempt's lease, the same) is the database's now() plus the budget, whichever way this host's
// clock is off: the sweeper and the retry decision compare it with the database's now().
func TestAcceptSetsTheDeadlineOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		for _, mode := range []string{execution.ModeAsync, execution.ModeSync} {
			t.Run(fmt.Sprintf("%s skew %v", mode, skew), func(t *testing.T) {
				t.Parallel()
				s := dbtest.NewSchema(t)
				s.ApplyCatalog(t, dbtest.TestCatalog)
				s = s.WithClockSkew(t, skew)
				ctx := context.Background()
				const budget = 90 * time.Second

				row, created, err := New(s.Pool).ExecutionAccept(ctx, NewExecution{
					ID: uuid.NewString(), ApplicationID: dbtest.TestApp, Capability: dbtest.TestCapability,
					Mode: mode, MaxAttempts: 1, Payload: []byte(`{}`), RequestHash: []byte("h"),
					Budget: budget, CallbackTokenHash: secret.Hash("cbt_token"),
				})
				require.NoError(t, err)
				require.True(t, created)
				require.WithinDuration(t, time.Now().Add(skew+budget), row.DeadlineAt, 2*time.Second,
					"the deadline returned is the database's")

				var deadlineIn float64
				var leaseIsDeadline *bool
				require.NoError(t, s.Pool.QueryRow(ctx, `
					SELECT extract(epoch FROM deadline_at - now())::float8, lease_expires_at = deadline_at
					FROM executions WHERE id = $1`, row.ID).Scan(&deadlineIn, &leaseIsDeadline))
				require.InDelta(t, budget.Seconds(), deadlineIn, 2, "deadline = the database's now() + budget")
				if mode == execution.ModeSync {
					require.NotNil(t, leaseIsDeadline)
					require.True(t, *leaseIsDeadline, "the sync attempt's lease is its deadline")
					return
				}
				require.Nil(t, leaseIsDeadline, "a pending execution holds no lease")
				var dueIn float64
				require.NoError(t, s.Pool.QueryRow(ctx,
					`SELECT extract(epoch FROM due_at - now())::float8 FROM dispatches WHERE execution_id = $1`, row.ID).Scan(&dueIn))
				require.InDelta(t, 0, dueIn, 2, "attempt 1 is due at once on the database's clock")
			})
		}
	}
}
