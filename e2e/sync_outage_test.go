package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSyncCallThroughASettlementOutage: when settlement is down for two seconds during a sync
// call, the call still answers the adapter's result (or a retryable 503), and the execution ends
// settled with that result — never swept as a failure.
func TestSyncCallThroughASettlementOutage(t *testing.T) {
	s := newStack(t)
	s.start("settlement", "adapter-callback", "dummy-adapter", "gateway")

	type answer struct {
		code int
		body map[string]any
	}
	answered := make(chan answer, 1)
	go func() {
		code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.apiKey,
			[]byte(`{"mode": "MODE_SYNC", "payload": {"greeting": "through an outage", "dummy": {"sleep_ms": 1000}}}`),
			"Idempotency-Key", "sync-outage-1")
		answered <- answer{code, body}
	}()

	// The attempt is running at the adapter: stop settlement under it, for two seconds.
	var id string
	require.Eventually(t, func() bool {
		return s.schema.Pool.QueryRow(t.Context(),
			`SELECT id::text FROM executions WHERE mode = 'sync' AND status = 'running'`).Scan(&id) == nil
	}, 10*time.Second, 10*time.Millisecond)
	s.kill("settlement")
	stoppedAt := time.Now()
	// The outage itself lasts two seconds: that is the scenario, not a wait for an event.
	time.Sleep(2 * time.Second)
	s.start("settlement")
	t.Logf("settlement down for %s", time.Since(stoppedAt).Round(time.Millisecond))

	var a answer
	select {
	case a = <-answered:
	case <-time.After(40 * time.Second):
		t.Fatal("the sync call did not answer")
	}
	switch a.code {
	case http.StatusOK:
		e := execution(a.body)
		require.Equal(t, id, e["id"])
		require.Equal(t, "EXECUTION_STATUS_SUCCEEDED", e["status"], "%v", a.body)
		result, _ := e["result"].(map[string]any)
		echo, _ := result["echo"].(map[string]any)
		require.Equal(t, "through an outage", echo["greeting"])
	case http.StatusServiceUnavailable:
		t.Logf("answered 503: %v", a.body)
	default:
		t.Fatalf("answered %d: %v", a.code, a.body)
	}

	// Either way the execution ends settled with the adapter's result, never swept.
	require.Eventually(t, func() bool {
		var status string
		return s.schema.Pool.QueryRow(t.Context(), `SELECT status FROM executions WHERE id = $1`, id).Scan(&status) == nil &&
			status != "running"
	}, 15*time.Second, 20*time.Millisecond)
	var status string
	var reason *string
	require.NoError(t, s.schema.Pool.QueryRow(t.Context(),
		`SELECT status, failure_reason FROM executions WHERE id = $1`, id).Scan(&status, &reason))
	require.Equal(t, "succeeded", status, "failure reason %v", reason)
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id), "one completion event")
}

// TestAdapterOutageSpendsNoAttempt: dispatches that find the adapter unreachable go back to wait
// without spending an attempt (no attempt row, executions.attempt still 0), and run attempt 1
// once the adapter is back.
func TestAdapterOutageSpendsNoAttempt(t *testing.T) {
	s := newStack(t)
	s.start("settlement", "adapter-callback", "execution-consumer", "dispatcher", "gateway")

	var ids []string
	for range 3 {
		ids = append(ids, s.invoke(t, "dummy.echo", `{"mode": "MODE_ASYNC", "payload": {"greeting": "later"}}`))
	}
	// Each dispatch reaches the consumer, finds no adapter, and is rescheduled.
	require.Eventually(t, func() bool {
		return strings.Count(s.log("execution-consumer"), "attempt not spent, dispatch rescheduled") >= 2*len(ids)
	}, 30*time.Second, 50*time.Millisecond)
	require.Zero(t, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = ANY($1::uuid[])`, ids), "no attempt row")
	require.Equal(t, len(ids), s.count(t, `SELECT count(*) FROM executions WHERE id = ANY($1::uuid[]) AND status = 'pending' AND attempt = 0`, ids))

	s.start("dummy-adapter")
	require.Eventually(t, func() bool {
		return s.count(t, `SELECT count(*) FROM executions WHERE id = ANY($1::uuid[]) AND status = 'succeeded'`, ids) == len(ids)
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, len(ids), s.count(t, `SELECT count(*) FROM executions WHERE id = ANY($1::uuid[]) AND attempt = 1`, ids), "attempt 1 each")
	require.Equal(t, len(ids), s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = ANY($1::uuid[])`, ids), "one attempt row each")
}
