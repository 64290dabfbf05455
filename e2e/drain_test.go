package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSIGTERMDrainsTheExecutionConsumer: a deploy's SIGTERM reaches the execution-consumer while
// an adapter call is in flight (the dummy adapter sleeping, well within the soft timeout). The
// call is not cut: the attempt finishes and settles on the stopping consumer — succeeded at
// attempt 1, no second attempt, no lease waited out — and the process exits within
// INTEGRATIONS_SHUTDOWN_TIMEOUT.
func TestSIGTERMDrainsTheExecutionConsumer(t *testing.T) {
	s := newStack(t)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	const (
		sleep = 2 * time.Second
		hard  = 10 * time.Second
	)
	s.ProgramEnv["execution-consumer"] = []string{
		"INTEGRATIONS_DRAIN_WINDOW=200ms",
		"INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT=6s",
		"INTEGRATIONS_SHUTDOWN_TIMEOUT=" + hard.String(),
	}
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "dispatcher", "gateway")

	// dummy.long: a lease of an hour, 3.6 s time-scaled, longer than the call.
	id := s.invoke(t, "dummy.long", `{"mode": "MODE_ASYNC", "payload": {"dummy": {"sleep_ms": 2000}}}`)
	require.Eventually(t, func() bool {
		return s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id) == 1
	}, 10*time.Second, 2*time.Millisecond, "attempt 1 started: the adapter call is in flight")
	calledAt := time.Now()

	exit, err := s.Terminate("execution-consumer", hard+5*time.Second)
	require.NoError(t, err)
	require.True(t, exit.InTime, "the execution-consumer did not exit within its shutdown timeout:\n%s", s.LogTail("execution-consumer"))
	took := exit.Took
	t.Logf("exited %v after SIGTERM", took)
	assert.True(t, exit.State.Success(), "a clean exit: %v\n%s", exit.State, s.LogTail("execution-consumer"))
	assert.Less(t, took, hard, "the shutdown timeout is a bound")
	assert.GreaterOrEqual(t, time.Since(calledAt), sleep-100*time.Millisecond,
		"the process waited for the adapter call rather than cutting it")

	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM executions WHERE id = $1 AND status = 'succeeded' AND attempt = 1`, id),
		"settled by the stopping consumer, at attempt 1")
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id), "no attempt spent")
	logs := s.Log("execution-consumer")
	assert.NotContains(t, logs, "attempt interrupted by shutdown")
	assert.True(t, strings.Contains(logs, "no new calls or messages taken"), "the consumer drained:\n%s", s.LogTail("execution-consumer"))
}

// TestRollingRestartSpendsNoAttempt: while callers keep invoking async work that takes the adapter
// a while, every back-end service is restarted in turn with SIGTERM — the execution-consumer as two
// replicas, one after the other, the others as one. No attempt is spent by a restart (one attempt
// per execution, all succeeded), no client sees an error, and the delay a restart adds is
// measured.
func TestRollingRestartSpendsNoAttempt(t *testing.T) {
	s := newStack(t)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	const (
		drain   = 300 * time.Millisecond
		sleep   = 300 * time.Millisecond
		callers = 8
		// Each caller invokes at this pace: about 25 executions a second in all, within what one
		// consumer replica (16 at once) carries alone while the other restarts, so that what is
		// measured is the restarts, not a backlog.
		pace = 320 * time.Millisecond
	)
	restarts := []struct{ instance, binary string }{
		{"execution-consumer", "execution-consumer"},
		{"execution-consumer-2", "execution-consumer"},
		{"settlement", "settlement"},
		{"dispatcher", "dispatcher"},
		{"adapter-callback", "adapter-callback"},
		{"event-router", "event-router"},
	}
	for _, r := range restarts {
		s.ProgramEnv[r.instance] = []string{"INTEGRATIONS_DRAIN_WINDOW=" + drain.String()}
	}
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	s.startInstance("execution-consumer-2", "execution-consumer")

	body := []byte(fmt.Sprintf(`{"mode": "MODE_ASYNC", "payload": {"dummy": {"sleep_ms": %d}}}`, sleep.Milliseconds()))
	var (
		wg       sync.WaitGroup
		accepted atomic.Int64
		refused  atomic.Int64
		lastErr  atomic.Value
	)
	stop := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				code, resp := s.call(http.MethodPost, "/v1/capabilities/dummy.long:invoke", s.APIKey, body)
				if code == http.StatusAccepted {
					accepted.Add(1)
					continue
				}
				refused.Add(1)
				lastErr.Store(fmt.Sprint(code, resp))
			}
		}()
	}
	// Under load before, between and after the restarts.
	require.Eventually(t, func() bool { return accepted.Load() >= 20 }, 20*time.Second, 10*time.Millisecond)
	var longest time.Duration // the longest restart: SIGTERM to serving again
	for _, r := range restarts {
		t0 := time.Now()
		s.stop(r.instance)
		s.startInstance(r.instance, r.binary)
		took := time.Since(t0)
		longest = max(longest, took)
		t.Logf("restarted %s in %v", r.instance, took.Round(time.Millisecond))
	}
	n := accepted.Load()
	require.Eventually(t, func() bool { return accepted.Load() >= n+20 }, 20*time.Second, 10*time.Millisecond)
	close(stop)
	wg.Wait()
	assert.Zero(t, refused.Load(), "no client saw an error: last %v", lastErr.Load())

	total := s.count(t, `SELECT count(*) FROM executions`)
	require.Eventually(t, func() bool {
		return s.count(t, `SELECT count(*) FROM executions WHERE settled_at IS NOT NULL`) == total
	}, 60*time.Second, 50*time.Millisecond, "every execution settles")
	assert.Equal(t, total, s.count(t, `SELECT count(*) FROM executions WHERE status = 'succeeded' AND attempt = 1`),
		"all succeeded at their first attempt")
	assert.Equal(t, total, s.count(t, `SELECT count(*) FROM execution_attempts`), "no attempt spent by a restart")
	var p50, p99, worst float64
	require.NoError(t, s.schema.Pool.QueryRow(context.Background(), `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d)
		FROM (SELECT extract(epoch FROM settled_at - created_at) AS d FROM executions) x`).Scan(&p50, &p99, &worst))
	t.Logf("%d executions, accept → settled: p50 %.0f ms, p99 %.0f ms, max %.0f ms (adapter sleep %v, drain %v)",
		total, p50*1000, p99*1000, worst*1000, sleep, drain)
	// A restart takes its drain window and a process's start, which a loaded machine stretches:
	// the bound is the longest restart measured (at least the drain), not the drain alone.
	assert.Less(t, worst, (sleep + longest + 1500*time.Millisecond).Seconds(), "no execution delayed by much more than a restart")
}
