package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRecoveryAndCancellation: attempts whose outcome never arrives (a silent adapter, a killed
// consumer) end through lease expiry and the sweeper, exactly once; and cancellation settles
// through the same compare-and-set, with its completion event.
func TestRecoveryAndCancellation(t *testing.T) {
	s := newStack(t)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s)+`
  - name: dummy.slow
    adapter: dummy
    modes: [async]
    retry_delays: [1h]
`)
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	r := newReceiver(t)
	r.register(t, s)

	attemptOutcome := func(id string, n int) string {
		var outcome *string
		_ = s.schema.Pool.QueryRow(context.Background(),
			`SELECT outcome FROM execution_attempts WHERE execution_id = $1 AND n = $2`, id, n).Scan(&outcome)
		if outcome == nil {
			return ""
		}
		return *outcome
	}

	t.Run("the adapter going silent: lease expiry, retry, success", func(t *testing.T) {
		id := s.invoke(t, "dummy.echo", `{"mode": "MODE_ASYNC", "payload": {"dummy": {"complete_later_ms": 60000, "lease_ms": 200, "only_attempts": 1}}}`)
		require.Eventually(t, func() bool { return attemptOutcome(id, 1) == "accepted" }, 10*time.Second, 10*time.Millisecond,
			"attempt 1 accepted as long-running work")
		// The adapter dies with the work in hand: no renewal, no completion.
		s.kill("dummy-adapter")
		s.start("dummy-adapter")
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		assert.EqualValues(t, 2, data["attempt"])
		assert.Equal(t, "timeout", attemptOutcome(id, 1), "the expired lease is a timeout of attempt 1")
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id))
	})

	t.Run("kill -9 the execution-consumer in the middle of an attempt: settled exactly once, one completion event", func(t *testing.T) {
		id := s.invoke(t, "dummy.echo", `{"mode": "MODE_ASYNC", "payload": {"dummy": {"sleep_ms": 60000, "only_attempts": 1}}}`)
		require.Eventually(t, func() bool {
			return s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id) == 1
		}, 10*time.Second, 2*time.Millisecond, "attempt 1 started")
		s.kill("execution-consumer")
		s.start("execution-consumer")
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		assert.EqualValues(t, 2, data["attempt"])
		assert.Equal(t, "timeout", attemptOutcome(id, 1))
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id), "one completion event")
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM executions WHERE id = $1 AND status = 'succeeded'`, id))
	})

	t.Run("cancelling a pending execution settles it cancelled, with its event, and its next attempt never starts", func(t *testing.T) {
		id := s.invoke(t, "dummy.slow", `{"mode": "MODE_ASYNC", "payload": {"dummy": {"fail_transient": 5}}}`)
		require.Eventually(t, func() bool {
			return s.count(t, `SELECT count(*) FROM executions WHERE id = $1 AND status = 'pending' AND attempt = 1`, id) == 1
		}, 10*time.Second, 10*time.Millisecond, "attempt 1 failed; attempt 2 waits an hour (3.6 s scaled)")
		code, body := s.call(http.MethodPost, "/v1/executions/"+id+":cancel", s.APIKey, []byte(`{}`))
		require.Equal(t, http.StatusOK, code, "%v", body)
		assert.Equal(t, "EXECUTION_STATUS_CANCELLED", execution(body)["status"])
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "cancelled", data["status"])
		failure, _ := data["failure"].(map[string]any)
		assert.Equal(t, "cancelled", failure["reason"])
		assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM dispatches WHERE execution_id = $1`, id), "attempt 2's dispatch record went with the cancellation")
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id))

		code, body = s.call(http.MethodPost, "/v1/executions/"+id+":cancel", s.APIKey, []byte(`{}`))
		assert.Equal(t, http.StatusBadRequest, code, "a settled execution cannot be cancelled: %v", body)
		code, _ = s.call(http.MethodPost, "/v1/executions/"+id+":cancel", "wrong-key-0123456789", []byte(`{}`))
		assert.Equal(t, http.StatusUnauthorized, code)
	})

	t.Run("cancelling a running execution settles it cancelled and stops the adapter's work", func(t *testing.T) {
		// Work long enough that the cancellation always comes first, under a lease (dummy.long's:
		// 3.6 s scaled) that a late renewal on a loaded machine does not lose.
		id := s.invoke(t, "dummy.long", `{"mode": "MODE_ASYNC", "payload": {"dummy": {"complete_later_ms": 30000, "lease_ms": 3000}}}`)
		require.Eventually(t, func() bool { return attemptOutcome(id, 1) == "accepted" }, 10*time.Second, 10*time.Millisecond)
		code, body := s.call(http.MethodPost, "/v1/executions/"+id+":cancel", s.APIKey, []byte(`{}`))
		require.Equal(t, http.StatusOK, code, "%v", body)
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "cancelled", data["status"])
		// The adapter's work stopped without reporting an outcome: stopped by the Cancel call, or
		// abandoned first because a lease renewal racing the cancellation was refused.
		require.Eventually(t, func() bool {
			for _, line := range strings.Split(s.Log("dummy-adapter"), "\n") {
				if strings.Contains(line, id) && (strings.Contains(line, "background work stopped: the execution was cancelled") ||
					strings.Contains(line, "background work abandoned: the attempt is no longer open")) {
					return true
				}
			}
			return false
		}, 10*time.Second, 20*time.Millisecond)
		_, body = s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
		assert.Equal(t, "EXECUTION_STATUS_CANCELLED", execution(body)["status"])
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id))
	})
}
