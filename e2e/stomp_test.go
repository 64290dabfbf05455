package e2e

import (
	"bufio"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFlowOnSTOMP runs the platform on a STOMP broker (INTEGRATIONS_BROKER=stomp, ActiveMQ from
// scripts/deps.sh up stomp): every service's port is the STOMP provider, and RabbitMQ is out of
// reach (see broker.env). The flow issue 15 names, with TestFlow's own checks: an async call
// completed and its webhook delivered and verified; a transient failure retried through the
// broker's scheduled delivery and then succeeding; the broker diagnostic answered through the
// real consumers. It fails, never skips, without INTEGRATIONS_STOMP_URL.
func TestFlowOnSTOMP(t *testing.T) {
	s := newStackOn(t, stompBroker(t), timeScale, os.Getenv(publicTLSEnv) == "true")
	// The dispatcher starts inside asyncCallDelivered, as in TestFlow.
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "gateway")
	r := newReceiver(t)
	r.register(t, s)

	t.Run("async call answers 202 pending at attempt 0, then completes and is delivered", asyncCallDelivered(s, r))
	t.Run("an async call that fails transiently is retried by the schedule and succeeds", transientFailureRetried(s, r))
	t.Run("the dispatches went through the broker and its consumer", dispatchesThroughBroker(s))
	t.Run("the broker diagnostic answers one line per route, through the real consumers", brokerDiagnosticAnswers(s))
}

// dispatchesThroughBroker checks, after asyncCallDelivered and transientFailureRetried (and no
// other async call), that their four dispatches — the first call's attempt, the retried call's
// three — were confirmed by the dispatcher's port and acknowledged by the execution-consumer's:
// the work went through the broker the stack runs on. On a STOMP stack, where RabbitMQ is out of
// reach, that broker can only be the STOMP one.
func dispatchesThroughBroker(s *stack) func(t *testing.T) {
	return func(t *testing.T) {
		assert.GreaterOrEqual(t, mqCounter(t, "http://"+s.metricsAddr("dispatcher")+"/metrics", "executions", "confirmed"), 4.0)
		// The last acknowledgement may follow the settlement the test saw.
		require.Eventually(t, func() bool {
			return mqCounter(t, "http://"+s.metricsAddr("execution-consumer")+"/metrics", "executions", "acknowledged") >= 4
		}, s.timeout, 20*time.Millisecond)
	}
}

// mqCounter is the value of integrations_mq_messages_total{route, event} on the metrics page at
// url (0 when the series is not there yet).
func mqCounter(t *testing.T, url, route, event string) float64 {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec // the test's own listener
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// The text format sorts labels by name.
	series := `integrations_mq_messages_total{event="` + event + `",route="` + route + `"} `
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			require.NoError(t, err, sc.Text())
			return f
		}
	}
	require.NoError(t, sc.Err())
	return 0
}
