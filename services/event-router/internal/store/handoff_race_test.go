package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// progressReplaceSQL is the coalescing half of the adapter-callback's progressSetSQL (its
// waiting and upd CTEs; that package is internal to its service): a report replaces the progress
// of the execution's latest progress event while no one has claimed it, and gives it the next
// sequence. $1 event id, $2 the new payload.
const progressReplaceSQL = `
	WITH waiting AS (
		SELECT ev.id FROM integration_events ev
		WHERE ev.id = $1 AND ev.delivery_status = 'pending' AND ev.attempts = 0
			AND ev.relayed_at IS NULL
			AND (ev.relay_claimed_until IS NULL OR ev.relay_claimed_until < now())
			AND (ev.delivery_claimed_until IS NULL OR ev.delivery_claimed_until < now())
			AND NOT EXISTS (SELECT 1 FROM event_deliveries d WHERE d.event_id = ev.id)
		FOR UPDATE OF ev SKIP LOCKED
	)
	UPDATE integration_events ev SET sequence = ev.sequence + 1, payload = $2
	FROM waiting w WHERE ev.id = w.id
	RETURNING true`

// TestRelayClaimsAProgressEventAsItLocksIt: a progress report that replaces a waiting progress
// event (coalescing: a new payload and the next sequence) while the relay's claim runs leaves
// the event as if the two had run one after the other. The relay's statement read the event
// from its snapshot while it locked the row's newest version, so a report committed between the
// two made it (a) park the event as held behind its own older version, which the snapshot still
// showed pending at the sequence before — no relay claimed it until the recovery pass let it go,
// and the execution's later events waited behind it — and, that fixed alone, (b) hand it for
// delivery in process with the older payload, so that the last report was never delivered
// (docs/decisions.md "Progress events": "the last report is always delivered"). Each round
// starts the report and the relay at once.
func TestRelayClaimsAProgressEventAsItLocksIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)

	const rounds = 300
	var handedBefore, handedAfter, skipped int
	for round := range rounds {
		exec := s.InsertExecution(t, dbtest.Execution{Status: "running", Attempt: 1})
		id := uuid.NewString()
		_, err := s.Pool.Exec(ctx, `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload)
			VALUES ($1, $2, $3, $4, '{"progress": 1}')`, id, dbtest.TestApp, exec, execution.EventTypeExecutionProgress)
		require.NoError(t, err)
		newer := fmt.Sprintf(`{"progress": 2, "round": %d}`, round)

		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			replaced bool
			here     []*Delivery
			errs     [2]error
		)
		wg.Go(func() {
			<-start
			errs[0] = s.Pool.QueryRow(ctx, progressReplaceSQL, id, newer).Scan(&replaced)
			if errors.Is(errs[0], pgx.ErrNoRows) {
				errs[0] = nil
			}
		})
		wg.Go(func() {
			<-start
			_, here, _, errs[1] = st.EventClaimForRelay(ctx, 10, time.Minute, 10, time.Minute)
		})
		close(start)
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])

		var stored string
		var held bool
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT payload::text, held FROM integration_events WHERE id = $1`, id).
			Scan(&stored, &held))
		require.False(t, held, "round %d: the relay parked event %s, which has no earlier event (replaced: %v)", round, id, replaced)
		i := slices.IndexFunc(here, func(d *Delivery) bool { return d.EventID == id })
		switch {
		case i < 0: // the report held the row's lock as the relay reached it
			skipped++
		case replaced:
			handedAfter++
		default:
			handedBefore++
		}
		if i >= 0 {
			require.JSONEq(t, stored, string(here[i].Payload),
				"round %d: the relay handed event %s with a payload that is not its row's (replaced: %v)", round, id, replaced)
		}
		// Settled, so that the next round's event is the only one the relay can claim.
		_, err = s.Pool.Exec(ctx, `UPDATE integration_events SET delivery_status = 'delivered' WHERE id = $1`, id)
		require.NoError(t, err)
	}
	t.Logf("%d rounds: handed before the report %d, after it %d; skipped %d", rounds, handedBefore, handedAfter, skipped)
}
