package store

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestRelayAndNoticeNeverBothClaimAnEvent: a notice's delivery claim and the relay's claim for
// delivery in process, racing for one event, never both get it. The relay's statement once read
// the event's delivery state from its snapshot while it locked the row's newest version, so a
// notice's claim committed between the two was overwritten, and the event was delivered twice
// (issue 22: TestConcurrentDuplicateNoticesDeliverOnce on a loaded machine). Each round starts
// both at once; a few hundred rounds met the window every time before the fix.
func TestRelayAndNoticeNeverBothClaimAnEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)

	const rounds = 300
	var relayWon, noticeWon int
	for round := range rounds {
		exec := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
		id := uuid.NewString()
		_, err := s.Pool.Exec(ctx, `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload)
			VALUES ($1, $2, $3, 'execution.completed', '{}')`, id, dbtest.TestApp, exec)
		require.NoError(t, err)

		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			notice *Delivery
			here   []*Delivery
			errs   [2]error
		)
		wg.Go(func() {
			<-start
			notice, errs[0] = st.DeliveryClaim(ctx, id, time.Minute)
		})
		wg.Go(func() {
			<-start
			_, here, _, errs[1] = st.EventClaimForRelay(ctx, 10, time.Minute, 10, time.Minute)
		})
		close(start)
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		byNotice := !notice.Claim.IsZero()
		byRelay := slices.ContainsFunc(here, func(d *Delivery) bool { return d.EventID == id })
		require.False(t, byNotice && byRelay, "round %d: the notice and the relay both claimed event %s", round, id)
		if byRelay {
			relayWon++
		} else if byNotice {
			noticeWon++
		}
		// Settled, so that the next round's event is the only one the relay can claim.
		_, err = s.Pool.Exec(ctx, `UPDATE integration_events SET delivery_status = 'delivered' WHERE id = $1`, id)
		require.NoError(t, err)
	}
	t.Logf("%d rounds: the relay claimed %d, the notice %d", rounds, relayWon, noticeWon)
}
