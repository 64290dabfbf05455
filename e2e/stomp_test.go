package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	launcher "github.com/integrations-platform/integrations/e2e/stack"
)

// TestFlowOnSTOMP runs the platform on a STOMP broker (INTEGRATIONS_BROKER=stomp, ActiveMQ from
// scripts/deps.sh up stomp): every service's port is the STOMP provider, and RabbitMQ is out of
// reach (see launcher.Broker). The flow issue 15 names, with TestFlow's own checks: an async call
// completed and its webhook delivered and verified; a transient failure retried through the
// broker's scheduled delivery and then succeeding; the broker diagnostic answered through the
// real consumers. It fails, never skips, without INTEGRATIONS_STOMP_URL.
func TestFlowOnSTOMP(t *testing.T) {
	b, err := launcher.STOMP()
	require.NoError(t, err)
	s := newStackOn(t, b, timeScale, os.Getenv(publicTLSEnv) == "true")
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
		sent, err := s.PortCounters(t.Context(), "dispatcher")
		require.NoError(t, err)
		assert.GreaterOrEqual(t, sent["executions/confirmed"], 4.0)
		// The last acknowledgement may follow the settlement the test saw.
		require.Eventually(t, func() bool {
			taken, err := s.PortCounters(t.Context(), "execution-consumer")
			return err == nil && taken["executions/acknowledged"] >= 4
		}, startTimeout, 20*time.Millisecond)
	}
}
