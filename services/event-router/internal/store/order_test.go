package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// orderBundle is an execution with events of sequence 1..n, unrelayed and pending.
type orderBundle struct {
	schema *dbtest.Schema
	store  *Store
	exec   string
	events []string // by sequence, from 1
}

func setupOrder(t *testing.T, n int) *orderBundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	b := &orderBundle{schema: s, store: New(s.Pool), exec: s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})}
	for seq := 1; seq <= n; seq++ {
		typ := execution.EventTypeExecutionProgress
		if seq == n {
			typ = execution.EventTypeExecutionComplete
		}
		id := uuid.NewString()
		_, err := s.Pool.Exec(context.Background(), `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload, sequence)
			VALUES ($1, $2, $3, $4, '{}', $5)`, id, dbtest.TestApp, b.exec, typ, seq)
		require.NoError(t, err)
		b.events = append(b.events, id)
	}
	return b
}

// claimAll runs the relay's claim with room for local events in process and returns the ids it
// claimed, published and handed alike.
func (b *orderBundle) claimAll(t *testing.T, local int) (pub, here []string) {
	t.Helper()
	p, h, _, err := b.store.EventClaimForRelay(context.Background(), 100, time.Minute, local, time.Minute)
	require.NoError(t, err)
	for _, u := range p {
		pub = append(pub, u.ID)
	}
	for _, d := range h {
		here = append(here, d.EventID)
	}
	return pub, here
}

// deliverOne records a successful (or, dead, a last failed) attempt of a claimed event.
func (b *orderBundle) record(t *testing.T, id, outcome string) {
	t.Helper()
	ev, err := b.store.DeliveryClaim(context.Background(), id, time.Minute)
	require.NoError(t, err)
	require.False(t, ev.Claim.IsZero(), "claimed")
	applied, err := b.store.DeliveryRecord(context.Background(), id, Attempt{Outcome: outcome, Claim: ev.Claim, Attempts: ev.Attempts})
	require.NoError(t, err)
	require.True(t, applied)
}

// The ordering rule at the relay: of an execution's pending events only the earliest is claimed,
// for publishing or in process; the next goes once it is delivered, and a dead one holds nothing
// back.
func TestRelayClaimsAnExecutionsEventsInSequence(t *testing.T) {
	t.Parallel()
	for _, local := range []int{0, 10} {
		b := setupOrder(t, 3)
		for i, outcome := range []string{"delivered", "dead", "delivered"} {
			pub, here := b.claimAll(t, local)
			claimed := append(pub, here...)
			require.Equal(t, []string{b.events[i]}, claimed, "local %d: only sequence %d is claimed", local, i+1)
			pub, here = b.claimAll(t, local)
			require.Empty(t, append(pub, here...), "local %d: nothing more while sequence %d is pending", local, i+1)
			if local == 0 {
				// Published: its notice claims it for delivery.
				require.NoError(t, b.store.EventMarkRelayed(context.Background(), claimed, time.Now()))
			} else {
				// Handed in process: already claimed for delivery; release it for record's claim.
				_, err := b.schema.Pool.Exec(context.Background(), `UPDATE integration_events SET delivery_claimed_until = NULL WHERE id = $1`, claimed[0])
				require.NoError(t, err)
			}
			b.record(t, b.events[i], outcome)
		}
		pub, here := b.claimAll(t, local)
		require.Empty(t, append(pub, here...))
	}
}

// A notice of an event whose predecessor is pending again (redelivered after this one was
// relayed) claims nothing: the event comes back Held and is given back to the relay, which claims
// it after its predecessor.
func TestDeliveryClaimHoldsAnEventBehindAnEarlierPendingOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupOrder(t, 2)
	b.record(t, b.events[0], "delivered")
	_, err := b.schema.Pool.Exec(ctx, `UPDATE integration_events SET relayed_at = now() WHERE id = $1`, b.events[1])
	require.NoError(t, err)
	// Sequence 1 is redelivered: pending again, unrelayed.
	_, err = b.schema.Pool.Exec(ctx, `UPDATE integration_events SET delivery_status = 'pending', attempts = 0, delivered_at = NULL,
		relayed_at = NULL WHERE id = $1`, b.events[0])
	require.NoError(t, err)

	ev, err := b.store.DeliveryClaim(ctx, b.events[1], time.Minute)
	require.NoError(t, err)
	require.True(t, ev.Held)
	require.True(t, ev.Claim.IsZero(), "not claimed")
	var relayed, claimed bool
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT relayed_at IS NOT NULL, delivery_claimed_until IS NOT NULL
		FROM integration_events WHERE id = $1`, b.events[1]).Scan(&relayed, &claimed))
	require.False(t, relayed, "given back to the relay")
	require.False(t, claimed)

	pub, here := b.claimAll(t, 10)
	require.Equal(t, []string{b.events[0]}, append(pub, here...), "the redelivered predecessor goes first")
	_, err = b.schema.Pool.Exec(ctx, `UPDATE integration_events SET delivery_claimed_until = NULL WHERE id = $1`, b.events[0])
	require.NoError(t, err)
	b.record(t, b.events[0], "delivered")
	pub, here = b.claimAll(t, 10)
	require.Equal(t, []string{b.events[1]}, append(pub, here...))
}

// The record that delivers an event with a successor waiting wakes the relay (NOTIFY at commit);
// one without a successor waiting does not.
func TestDeliveryRecordWakesTheRelayForTheNextEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupOrder(t, 2)
	conn, err := b.schema.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+execution.EventsNotifyChannel)
	require.NoError(t, err)
	// The channel is the database's: other tests' notifications come too. Ours name our execution.
	// Awaited with a generous bound when it must come (it returns as soon as it does); its
	// absence can only be watched for a while, which a loaded machine cannot turn into a failure.
	notified := func(within time.Duration) bool {
		wctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		for {
			n, err := conn.Conn().WaitForNotification(wctx)
			if err != nil {
				return false
			}
			if n.Payload == b.exec {
				return true
			}
		}
	}

	b.record(t, b.events[0], "delivered")
	require.True(t, notified(30*time.Second), "sequence 2 may go now")
	b.record(t, b.events[1], "delivered")
	require.False(t, notified(300*time.Millisecond), "no event waits behind the last one")
	// The LISTEN ends with the connection; it must not go back to the pool listening.
	conn.Conn().Close(ctx) //nolint:errcheck // closing is the point
}

// A replica that dies holding an execution's first event in process: its successor stays held
// while the hand-off's claim lasts and after the hand-off is released; the relay gives the first
// event out again, and the second only once that one is delivered.
func TestOrderSurvivesALostHandoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupOrder(t, 2)
	_, here := b.claimAll(t, 10)
	require.Equal(t, []string{b.events[0]}, here)
	// The replica dies: its hand-off mark and delivery claim run out.
	_, err := b.schema.Pool.Exec(ctx, `UPDATE integration_events SET relay_claimed_until = now() - interval '1 second',
		delivery_claimed_until = now() - interval '1 second' WHERE id = $1`, b.events[0])
	require.NoError(t, err)
	pub, here := b.claimAll(t, 10)
	require.Empty(t, append(pub, here...), "the successor is held behind the lost event")

	n, err := b.store.EventReleaseHandoffs(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	pub, here = b.claimAll(t, 10)
	require.Equal(t, []string{b.events[0]}, append(pub, here...), "the lost event goes out again, first")
	_, err = b.schema.Pool.Exec(ctx, `UPDATE integration_events SET delivery_claimed_until = NULL WHERE id = $1`, b.events[0])
	require.NoError(t, err)
	b.record(t, b.events[0], "delivered")
	pub, here = b.claimAll(t, 10)
	require.Equal(t, []string{b.events[1]}, append(pub, here...))
}
