package e2e

import (
	"strings"
	"syscall"
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
	s.extraEnv["execution-consumer"] = []string{
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

	s.mu.Lock()
	p := s.procs["execution-consumer"]
	delete(s.procs, "execution-consumer")
	s.mu.Unlock()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	sent := time.Now()
	select {
	case <-p.done:
	case <-time.After(hard + 5*time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("the execution-consumer did not exit within its shutdown timeout:\n%s", s.logTail("execution-consumer"))
	}
	took := time.Since(sent)
	t.Logf("exited %v after SIGTERM", took)
	assert.True(t, p.cmd.ProcessState.Success(), "a clean exit: %v\n%s", p.cmd.ProcessState, s.logTail("execution-consumer"))
	assert.Less(t, took, hard, "the shutdown timeout is a bound")
	assert.GreaterOrEqual(t, time.Since(calledAt), sleep-100*time.Millisecond,
		"the process waited for the adapter call rather than cutting it")

	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM executions WHERE id = $1 AND status = 'succeeded' AND attempt = 1`, id),
		"settled by the stopping consumer, at attempt 1")
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id), "no attempt spent")
	logs := s.log("execution-consumer")
	assert.NotContains(t, logs, "attempt interrupted by shutdown")
	assert.True(t, strings.Contains(logs, "no new calls or messages taken"), "the consumer drained:\n%s", s.logTail("execution-consumer"))
}
