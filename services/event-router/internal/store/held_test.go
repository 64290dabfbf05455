package store

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// scanRows is the rows the plan's scans of the table aliased alias answered, summed over their
// loops, in the EXPLAIN ANALYZE (FORMAT JSON) answer plan: whatever index or none the planner
// chose, each is a row the statement went on to probe its execution's events for.
func scanRows(t *testing.T, plan any, alias string) float64 {
	t.Helper()
	var sum float64
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Alias"] == alias && strings.HasSuffix(n["Node Type"].(string), "Scan") {
			sum += n["Actual Rows"].(float64) * n["Actual Loops"].(float64)
		}
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(plan.([]any)[0].(map[string]any)["Plan"].(map[string]any))
	return sum
}

// The relay's claim does not walk the events held behind a pending predecessor. With a receiver
// down, every execution's completion waits behind a progress event in retry backoff for hours;
// the scan used to read each of those, with a probe of its execution's events, on every pass and
// every NOTIFY before it reached an event it could claim (50,000 held: 200,000 buffers, 0.1–0.2 s a
// pass). Once a pass has set them aside, a claim reads only what it can claim, and an event held
// that way still goes once its predecessor is delivered.
func TestRelayClaimDoesNotWalkHeldEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	const held = 300
	proto := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO executions (id, application_id, capability, mode, status, attempt, max_attempts, payload, request_hash, deadline_at, settled_at)
		SELECT gen_random_uuid(), application_id, capability, mode, status, attempt, max_attempts, payload, request_hash, deadline_at, settled_at
		FROM executions, generate_series(1, $2) WHERE id = $1`, proto, held-1)
	require.NoError(t, err)
	// Each execution: its progress event relayed and in retry backoff, its completion behind it.
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, sequence, created_at, relayed_at, attempts, next_attempt_at)
		SELECT gen_random_uuid(), application_id, id, 'execution.progress', '{}', 1, now() - interval '2 hours', now(), 3, now() + interval '1 hour'
		FROM executions;
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, sequence, created_at)
		SELECT gen_random_uuid(), application_id, id, 'execution.completed', '{}', 2, now() - interval '1 hour' FROM executions`)
	require.NoError(t, err)

	// The relay's passes: nothing to claim; the held events are set aside.
	for range held/100 + 2 {
		pub, here, _, err := st.EventClaimForRelay(ctx, 100, time.Minute, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, pub)
		require.Empty(t, here)
	}

	// A fresh event of another execution comes: the claim reads it and no held one.
	fresh := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
	_, err = s.Pool.Exec(ctx, `INSERT INTO integration_events (id, application_id, execution_id, type, payload, sequence)
		SELECT gen_random_uuid(), application_id, id, 'execution.completed', '{}', 1 FROM executions WHERE id = $1`, fresh)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `ANALYZE integration_events`)
	require.NoError(t, err)
	var plan []byte
	require.NoError(t, s.Pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+relayClaimSQL, 100, 60, 0, 60).Scan(&plan))
	var p any
	require.NoError(t, json.Unmarshal(plan, &p))
	require.Equal(t, 1.0, scanRows(t, p, "t"), "the scan answered only the fresh event:\n%s", plan)

	// The first execution's progress event is delivered: its completion goes.
	var first string
	require.NoError(t, s.Pool.QueryRow(ctx, `
		UPDATE integration_events SET relayed_at = now(), attempts = 0, next_attempt_at = NULL
		WHERE execution_id = $1 AND sequence = 1 RETURNING id::text`, proto).Scan(&first))
	ev, err := st.DeliveryClaim(ctx, first, time.Minute)
	require.NoError(t, err)
	applied, err := st.DeliveryRecord(ctx, first, Attempt{Outcome: "delivered", Claim: ev.Claim, Attempts: ev.Attempts})
	require.NoError(t, err)
	require.True(t, applied)
	var completion string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT id::text FROM integration_events WHERE execution_id = $1 AND sequence = 2`, proto).Scan(&completion))
	pub, here, _, err := st.EventClaimForRelay(ctx, 100, time.Minute, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, here, 1)
	require.Equal(t, completion, here[0].EventID)
	require.Empty(t, pub)
}

// The race DeliveryRecord cannot see: a relay that read the predecessor pending sets its
// successor aside after the record that delivered the predecessor committed. The recovery pass
// lets go of it (and of no event still behind a pending one), and the relay claims it.
func TestEventUnholdReleasedLetsGoOfAnEventARaceLeftHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupOrder(t, 3)
	_, here := b.claimAll(t, 10)
	require.Equal(t, []string{b.events[0]}, here)
	pub, here := b.claimAll(t, 10)
	require.Empty(t, append(pub, here...))
	var held int
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM integration_events WHERE execution_id = $1 AND held`, b.exec).Scan(&held))
	require.Equal(t, 2, held, "both successors set aside")

	// Sequence 1 is delivered by a statement that did not let its successors go (the race).
	_, err := b.schema.Pool.Exec(ctx, `UPDATE integration_events SET delivery_status = 'delivered', delivered_at = now(),
		delivery_claimed_until = NULL WHERE id = $1`, b.events[0])
	require.NoError(t, err)
	pub, here = b.claimAll(t, 10)
	require.Empty(t, append(pub, here...), "set aside, the successor is not scanned")

	n, err := b.store.EventUnholdReleased(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only sequence 2: sequence 3 is still behind it")
	pub, here = b.claimAll(t, 10)
	require.Equal(t, []string{b.events[1]}, append(pub, here...))
}
