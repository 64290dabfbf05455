package store

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// progressCatalog is the standard test catalog with a capability that declares progress_events.
const progressCatalog = dbtest.TestCatalog + `
  - name: test.progress
    adapter: adp
    modes: [async, sync]
    progress_events: true
`

type progressBundle struct {
	schema *dbtest.Schema
	store  *Store
}

func setupProgress(t *testing.T) *progressBundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, progressCatalog)
	return &progressBundle{schema: s, store: New(s.Pool)}
}

// running inserts a running execution of capability in mode at attempt 1.
func (b *progressBundle) running(t *testing.T, capability, mode string) string {
	t.Helper()
	id := b.schema.InsertExecution(t, dbtest.Execution{Capability: capability, Mode: mode, Status: execution.StatusRunning, Attempt: 1})
	b.schema.InsertAttempts(t, id, dbtest.Attempt{N: 1})
	return id
}

type storedEvent struct {
	ID       string
	Type     string
	Sequence int32
	Payload  map[string]any
}

// events reads the execution's events in sequence order.
func (b *progressBundle) events(t *testing.T, id string) []storedEvent {
	t.Helper()
	rows, err := b.schema.Pool.Query(context.Background(),
		`SELECT id::text, type, sequence, payload FROM integration_events WHERE execution_id = $1 ORDER BY sequence`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []storedEvent
	for rows.Next() {
		var e storedEvent
		var raw []byte
		require.NoError(t, rows.Scan(&e.ID, &e.Type, &e.Sequence, &raw))
		require.NoError(t, json.Unmarshal(raw, &e.Payload))
		out = append(out, e)
	}
	require.NoError(t, rows.Err())
	return out
}

// claim marks the event relayed, as the event router's relay does when it takes it for delivery.
func (b *progressBundle) claim(t *testing.T, eventID string) {
	t.Helper()
	_, err := b.schema.Pool.Exec(context.Background(), `UPDATE integration_events SET relayed_at = now() WHERE id = $1`, eventID)
	require.NoError(t, err)
}

func percent(p int) []byte { return fmt.Appendf(nil, `{"percent": %d}`, p) }

// A report of an async execution of a progress_events capability writes an execution.progress
// event with the documented payload, sequence 1 first; a capability without the flag, and a sync
// execution, store the progress and write no event.
func TestProgressSetWritesAnEventOnlyWhenDeclared(t *testing.T) {
	t.Parallel()
	b := setupProgress(t)
	ctx := context.Background()

	id := b.running(t, "test.progress", execution.ModeAsync)
	ev, err := b.store.ProgressSet(ctx, id, 1, percent(10))
	require.NoError(t, err)
	require.NotEmpty(t, ev.ID)
	require.Equal(t, int32(1), ev.Sequence)
	require.False(t, ev.Replaced)
	evs := b.events(t, id)
	require.Len(t, evs, 1)
	require.Equal(t, ev.ID, evs[0].ID)
	require.Equal(t, execution.EventTypeExecutionProgress, evs[0].Type)
	p := evs[0].Payload
	require.Equal(t, ev.ID, p["id"])
	require.Equal(t, "execution.progress", p["type"])
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$`, p["timestamp"])
	require.Equal(t, map[string]any{"execution_id": id, "capability": "test.progress", "attempt": 1.0, "sequence": 1.0,
		"progress": map[string]any{"percent": 10.0}}, p["data"])

	for _, c := range []struct{ capability, mode string }{
		{dbtest.TestCapability, execution.ModeAsync}, // no progress_events
		{"test.progress", execution.ModeSync},
	} {
		id := b.running(t, c.capability, c.mode)
		ev, err := b.store.ProgressSet(ctx, id, 1, percent(50))
		require.NoError(t, err, c)
		require.Empty(t, ev.ID, c)
		require.Empty(t, b.events(t, id), c)
		var stored []byte
		require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT progress FROM executions WHERE id = $1`, id).Scan(&stored))
		require.JSONEq(t, `{"percent": 50}`, string(stored), "the progress is stored all the same")
	}

	// An attempt that is not running stores nothing and writes no event.
	_, err = b.store.ProgressSet(ctx, id, 2, percent(99))
	require.ErrorIs(t, err, ErrNotRunning)
	require.Len(t, b.events(t, id), 1)
}

// Coalescing: while the execution's latest progress event waits unclaimed, a report replaces its
// progress and gives it the next sequence number (same id: it was never sent); once the event is
// claimed for delivery, the next report makes a new event. A burst of reports behind an event in
// delivery leaves one event waiting, holding the last progress.
func TestProgressSetCoalescesWhileAnEventWaits(t *testing.T) {
	t.Parallel()
	b := setupProgress(t)
	ctx := context.Background()
	id := b.running(t, "test.progress", execution.ModeAsync)

	first, err := b.store.ProgressSet(ctx, id, 1, percent(1))
	require.NoError(t, err)
	again, err := b.store.ProgressSet(ctx, id, 1, percent(2))
	require.NoError(t, err)
	require.True(t, again.Replaced, "the first event was not claimed yet")
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, int32(2), again.Sequence, "a replacement takes a new sequence number")
	evs := b.events(t, id)
	require.Len(t, evs, 1)
	require.Equal(t, map[string]any{"percent": 2.0}, evs[0].Payload["data"].(map[string]any)["progress"])
	require.Equal(t, 2.0, evs[0].Payload["data"].(map[string]any)["sequence"])

	// Claimed for delivery: the next report is an event of its own, and then a burst folds into it.
	b.claim(t, first.ID)
	const burst = 50
	var last ProgressEvent
	for i := range burst {
		last, err = b.store.ProgressSet(ctx, id, 1, percent(10+i))
		require.NoError(t, err)
		require.Equal(t, i > 0, last.Replaced, "report %d", i)
	}
	evs = b.events(t, id)
	require.Len(t, evs, 2, "%d reports behind an event in delivery make one event", burst)
	require.Equal(t, first.ID, evs[0].ID)
	require.Equal(t, last.ID, evs[1].ID)
	require.Equal(t, int32(2+burst), evs[1].Sequence, "each report took a sequence number")
	require.Equal(t, map[string]any{"percent": float64(10 + burst - 1)}, evs[1].Payload["data"].(map[string]any)["progress"],
		"the last progress is the one delivered")

	// An event that had a delivery attempt is never rewritten, even once it is back to unrelayed
	// (a redelivery): the receiver may have it under its id.
	_, err = b.schema.Pool.Exec(ctx, `INSERT INTO event_deliveries (event_id, n, status_code, duration_ms) VALUES ($1, 1, 500, 3)`, last.ID)
	require.NoError(t, err)
	fresh, err := b.store.ProgressSet(ctx, id, 1, percent(99))
	require.NoError(t, err)
	require.False(t, fresh.Replaced)
	require.NotEqual(t, last.ID, fresh.ID)
	require.Len(t, b.events(t, id), 3)
}

// Concurrent reports of one execution wait for each other on the execution's row and each takes
// its own sequence number from the counter there, even though a waiting statement's snapshot
// predates the event the other wrote: no report fails on the (execution_id, sequence) key.
func TestProgressSetConcurrentReportsTakeDistinctSequences(t *testing.T) {
	t.Parallel()
	b := setupProgress(t)
	ctx := context.Background()
	id := b.running(t, "test.progress", execution.ModeAsync)
	const reports = 24
	errs := make(chan error, reports)
	for i := range reports {
		go func() {
			_, err := b.store.ProgressSet(ctx, id, 1, percent(i))
			errs <- err
		}()
	}
	for range reports {
		require.NoError(t, <-errs)
	}
	var seq int32
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT event_seq FROM executions WHERE id = $1`, id).Scan(&seq))
	require.Equal(t, int32(reports), seq, "every report took a number")
	evs := b.events(t, id)
	require.NotEmpty(t, evs)
	require.Equal(t, int32(reports), evs[len(evs)-1].Sequence, "the latest event holds the last number")
}

// A report that arrives while the settlement holds the execution's row waits for it, then finds
// the execution settled: no progress event after the completion event, none with a higher
// sequence, and the adapter is told the execution is not running.
func TestProgressSetDuringSettlementWritesNoEventAfterTheCompletion(t *testing.T) {
	t.Parallel()
	b := setupProgress(t)
	ctx := context.Background()
	id := b.running(t, "test.progress", execution.ModeAsync)
	_, err := b.store.ProgressSet(ctx, id, 1, percent(10))
	require.NoError(t, err)

	// The settlement's statement, as far as the row and the counter go: uncommitted, holding the row.
	tx, err := b.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below; a failed test rolls back
	_, err = tx.Exec(ctx, `
		WITH s AS (
			UPDATE executions SET status = 'succeeded', settled_at = now(), event_seq = event_seq + 1 WHERE id = $1
			RETURNING application_id, id, event_seq
		)
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, sequence)
		SELECT gen_random_uuid(), application_id, id, 'execution.completed', '{}', event_seq FROM s`, id)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))

	done := make(chan error, 1)
	go func() {
		_, err := b.store.ProgressSet(ctx, id, 1, percent(90))
		done <- err
	}()
	// The report waits on the settlement's row lock.
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)))`, pid).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))

	require.ErrorIs(t, <-done, ErrNotRunning)
	evs := b.events(t, id)
	require.Len(t, evs, 2)
	require.Equal(t, execution.EventTypeExecutionProgress, evs[0].Type)
	require.Equal(t, map[string]any{"percent": 10.0}, evs[0].Payload["data"].(map[string]any)["progress"], "not replaced either")
	require.Equal(t, execution.EventTypeExecutionComplete, evs[1].Type, "the completion is the last event")
	require.Equal(t, int32(2), evs[1].Sequence)
}

// A progress event carries its execution's trace context, as the completion event does (migration
// 00015), so that the event router's relay and delivery continue the execution's trace.
func TestProgressEventCarriesTheExecutionsTraceContext(t *testing.T) {
	t.Parallel()
	b := setupProgress(t)
	ctx := context.Background()
	id := b.running(t, "test.progress", execution.ModeAsync)
	const tp, ts = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=x"
	_, err := b.schema.Pool.Exec(ctx, `UPDATE executions SET traceparent = $2, tracestate = $3 WHERE id = $1`, id, tp, ts)
	require.NoError(t, err)
	ev, err := b.store.ProgressSet(ctx, id, 1, percent(10))
	require.NoError(t, err)
	var gotTP, gotTS *string
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT traceparent, tracestate FROM integration_events WHERE id = $1`, ev.ID).
		Scan(&gotTP, &gotTS))
	require.NotNil(t, gotTP, "the event is in the execution's trace")
	require.Equal(t, tp, *gotTP)
	require.NotNil(t, gotTS)
	require.Equal(t, ts, *gotTS)
}
