package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
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
		code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
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
		// Retryable, and in the gateway's own words: the attempt ended but its outcome is not
		// recorded yet, and where to read it — not settlement's status passed through.
		t.Logf("answered 503: %v", a.body)
		require.EqualValues(t, codes.Unavailable, a.body["code"], "%v", a.body)
		info := errorInfo(t, a.body)
		require.Equal(t, "OUTCOME_PENDING", info["reason"], "%v", a.body)
		metadata, _ := info["metadata"].(map[string]any)
		require.Equal(t, id, metadata["execution_id"], "%v", a.body)
		require.NotContains(t, fmt.Sprint(a.body), "127.0.0.1", "no downstream address")
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
		return strings.Count(s.Log("execution-consumer"), "attempt not spent, dispatch rescheduled") >= 2*len(ids)
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

// errorInfo is the google.rpc.ErrorInfo among a REST error body's details.
func errorInfo(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	details, _ := body["details"].([]any)
	for _, d := range details {
		if m, ok := d.(map[string]any); ok && m["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" {
			return m
		}
	}
	t.Fatalf("no ErrorInfo in the error: %v", body)
	return nil
}

// TestGatewaySIGTERMKeepsASyncOutcome: a deploy's SIGTERM reaches the gateway while a sync call's
// adapter work outlasts the gateway's soft timeout. The caller is cut off at the soft timeout, but
// the attempt goes on and its outcome is reported before the gateway closes its adapter and
// settlement connections: the execution ends settled with the adapter's result, never swept as a
// failure, and the gateway exits within its shutdown timeout.
func TestGatewaySIGTERMKeepsASyncOutcome(t *testing.T) {
	s := newStack(t)
	const (
		sleep = 2500 * time.Millisecond
		hard  = 8 * time.Second
	)
	s.ProgramEnv["gateway"] = []string{
		"INTEGRATIONS_DRAIN_WINDOW=100ms",
		"INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT=1s",
		"INTEGRATIONS_SHUTDOWN_TIMEOUT=" + hard.String(),
	}
	s.start("settlement", "adapter-callback", "dummy-adapter", "gateway")

	// The caller is cut off at the soft timeout (the connection closes under it): not s.call,
	// which fails the test on a transport error.
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		req, err := http.NewRequest(http.MethodPost, s.RESTURL+"/v1/capabilities/dummy.echo:invoke", strings.NewReader(
			fmt.Sprintf(`{"mode": "MODE_SYNC", "payload": {"greeting": "through a deploy", "dummy": {"sleep_ms": %d}}}`, sleep.Milliseconds())))
		if err != nil {
			t.Error(err)
			return
		}
		req.Header.Set("Authorization", "Bearer "+s.APIKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.http.Do(req)
		if err != nil {
			t.Logf("the sync call was cut off: %v", err)
			return
		}
		_ = resp.Body.Close()
		t.Logf("the sync call answered %d", resp.StatusCode)
	}()
	var id string
	require.Eventually(t, func() bool {
		return s.schema.Pool.QueryRow(t.Context(),
			`SELECT id::text FROM executions WHERE mode = 'sync' AND status = 'running'`).Scan(&id) == nil
	}, 10*time.Second, 5*time.Millisecond, "the attempt is running at the adapter")

	exit, err := s.Terminate("gateway", hard+5*time.Second)
	require.NoError(t, err)
	require.True(t, exit.InTime, "the gateway did not exit within its shutdown timeout:\n%s", s.LogTail("gateway"))
	took := exit.Took
	t.Logf("the gateway exited %v after SIGTERM", took.Round(time.Millisecond))
	require.True(t, exit.State.Success(), "a clean exit: %v\n%s", exit.State, s.LogTail("gateway"))
	require.Less(t, took, hard, "the shutdown timeout is a bound")
	<-answered

	var status string
	var reason *string
	var greeting *string
	require.NoError(t, s.schema.Pool.QueryRow(t.Context(),
		`SELECT status, failure_reason, result #>> '{echo,greeting}' FROM executions WHERE id = $1`, id).Scan(&status, &reason, &greeting))
	require.Equal(t, "succeeded", status, "settled by the stopping gateway, not swept (failure reason %v):\n%s", reason, s.LogTail("gateway"))
	require.NotNil(t, greeting)
	require.Equal(t, "through a deploy", *greeting)
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id), "one completion event")
}
