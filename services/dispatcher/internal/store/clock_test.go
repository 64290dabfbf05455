package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDispatchTimesAreTheDatabases: how long until the next record is claimable, which records are
// claimable, and how far ahead a claimed one is due are all measured on the database's clock, which
// wrote due_at: with that clock an hour off this host's, the dispatcher still wakes in 10 s for a
// record due in 10 s, claims it within a 30 s horizon and not within 5 s, and publishes it for 10 s.
func TestDispatchTimesAreTheDatabases(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.schema = b.schema.WithClockSkew(t, skew)
			b.store = New(b.schema.Pool)
			ctx := context.Background()
			b.insert(t, 1, 10*time.Second, nil)

			wait, err := b.nextDue(ctx, 0)
			require.NoError(t, err)
			require.NotNil(t, wait)
			require.InDelta(t, 10, wait.Seconds(), 2)

			none, err := b.claim(ctx, 10, time.Minute, 5*time.Second)
			require.NoError(t, err)
			require.Empty(t, none, "due in 10 s: not within a 5 s horizon")
			claimed, err := b.claim(ctx, 10, time.Minute, 30*time.Second)
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			require.InDelta(t, 10, claimed[0].DueAt.Sub(claimed[0].ClaimedAt).Seconds(), 2,
				"due 10 s after the claim, on the clock that wrote both")
			require.WithinDuration(t, time.Now().Add(skew+10*time.Second), claimed[0].DueAt, 2*time.Second)
		})
	}
}
