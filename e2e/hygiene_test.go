package e2e

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHotUpdatesOnTheHappyPath carries async executions through the six services, stops them
// (so that every backend flushes its statistics), and reports how many updates of each hot table
// were HOT (heap-only: no index entry written). Every update of execution_attempts changes no
// indexed column, so all of them must be HOT where the page has room: the table's fillfactor
// keeps that room (migration 00011; without it 90-92% were, with it 100% in every run so far).
// docs/capacity.md, "Index and row hygiene (issue 13)", has the figures.
func TestHotUpdatesOnTheHappyPath(t *testing.T) {
	s := newStack(t)
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "gateway", "dispatcher")
	r := newReceiver(t)
	r.register(t, s)
	done := make(chan struct{})
	defer close(done)
	go func() { // the receiver's channel holds 100: drain it
		for {
			select {
			case <-r.events:
			case <-done:
				return
			}
		}
	}()

	const n, callers = 400, 8
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < n; i += callers {
				code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
					[]byte(`{"mode": "MODE_ASYNC", "payload": {"n": 1}}`))
				assert.Equal(t, http.StatusAccepted, code, "%v", body)
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		return s.count(t, `SELECT count(*) FROM integration_events WHERE delivery_status = 'delivered'`) == n
	}, 60*time.Second, 50*time.Millisecond, "every event delivered")
	s.StopAll()

	ctx := context.Background()
	upd, hot := map[string]int64{}, map[string]int64{}
	// A backend's counters reach the shared statistics when it exits, shortly after its
	// connection closes: wait until the attempts' updates (one per execution) are all counted.
	require.Eventually(t, func() bool {
		rows, err := s.schema.Pool.Query(ctx, `
			SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = current_schema()`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var name string
			var u, h int64
			require.NoError(t, rows.Scan(&name, &u, &h))
			upd[name], hot[name] = u, h
		}
		require.NoError(t, rows.Err())
		return upd["execution_attempts"] >= n
	}, 15*time.Second, 100*time.Millisecond, "statistics flushed")
	for _, table := range []string{"executions", "execution_attempts", "dispatches", "integration_events", "event_deliveries"} {
		t.Logf("%-20s updates %6d  HOT %6d  (%.0f%%)", table, upd[table], hot[table], 100*float64(hot[table])/float64(max(upd[table], 1)))
	}
	assert.GreaterOrEqual(t, float64(hot["execution_attempts"]), 0.95*float64(upd["execution_attempts"]),
		"updates of execution_attempts change no indexed column: they are HOT")
}
