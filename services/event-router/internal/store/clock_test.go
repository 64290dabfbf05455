package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestDeliveryTimesAreTheDatabases: a failed delivery's next attempt is due the delay after the
// database's now(), and the claim reads how long is left of it on the same clock, whichever way
// this host's clock is off.
func TestDeliveryTimesAreTheDatabases(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			t.Parallel()
			s := dbtest.NewSchema(t)
			s.ApplyCatalog(t, dbtest.TestCatalog)
			s = s.WithClockSkew(t, skew)
			st := New(s.Pool)
			ctx := context.Background()
			exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
			id := uuid.NewString()
			_, err := s.Pool.Exec(ctx, `
				INSERT INTO integration_events (id, application_id, execution_id, type, payload, next_attempt_at)
				VALUES ($1, $2, $3, 'execution.completed', '{}', now())`, id, dbtest.TestApp, exec)
			require.NoError(t, err)

			d, err := st.DeliveryClaim(ctx, id, time.Minute)
			require.NoError(t, err)
			require.False(t, d.Claim.IsZero(), "due: claimed")
			require.WithinDuration(t, time.Now().Add(skew+time.Minute), d.Claim, 2*time.Second, "the claim runs a minute on the database's clock")
			applied, err := st.DeliveryRecord(ctx, id, Attempt{Outcome: "pending", NextIn: 90 * time.Second,
				Claim: d.Claim, Attempts: d.Attempts, Err: "webhook answered 503"})
			require.NoError(t, err)
			require.True(t, applied)

			d, err = st.DeliveryClaim(ctx, id, time.Minute)
			require.NoError(t, err)
			require.True(t, d.Claim.IsZero(), "not due yet: not claimed")
			require.InDelta(t, 90, d.Wait.Seconds(), 2, "due 90 s after the database's now")
		})
	}
}
