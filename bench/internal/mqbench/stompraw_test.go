package mqbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// stompURL is the STOMP broker the tests use; scripts/deps.sh up stomp starts one. Without it the
// tests fail: a baseline that was never run is not a baseline.
func stompURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("INTEGRATIONS_STOMP_URL")
	require.NotEmpty(t, u, "INTEGRATIONS_STOMP_URL is not set: scripts/deps.sh up stomp && set -a && . .run/deps.env && set +a")
	return u
}

func newSTOMPBaseline(t *testing.T) (*STOMPBaseline, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := DialSTOMPBaseline(ctx, stompURL(t))
	require.NoError(t, err)
	t.Cleanup(b.Close)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	return b, "test.mqbench." + t.Name() + "." + hex.EncodeToString(suffix)
}

// TestSTOMPBaselineRuns: both paths settle every message once and measure something; a failed
// path's copy comes back through the broker's scheduler (AMQ_SCHEDULED_DELAY).
func TestSTOMPBaselineRuns(t *testing.T) {
	b, q := newSTOMPBaseline(t)
	assert.Contains(t, b.ServerVersion(), "ActiveMQ")
	require.NoError(t, b.Declare(q, 50*time.Millisecond))
	p := Params{N: 200, Concurrency: 4, Prefetch: 32, Window: 50, BodySize: 64, Timeout: 30 * time.Second}

	r, err := b.Run(context.Background(), q, p)
	require.NoError(t, err)
	assert.Empty(t, r.Note)
	assert.Positive(t, r.Elapsed)
	assert.Positive(t, r.P99, "latencies come from the bench-ts header")

	// Every ACK awaiting its RECEIPT: the same messages settled, each one a round trip more.
	b.AckReceipt = true
	r, err = b.Run(context.Background(), q, p)
	require.NoError(t, err)
	assert.Empty(t, r.Note)
	b.AckReceipt = false

	start := time.Now()
	p.N = 50
	r, err = b.RunFail(context.Background(), q, p)
	require.NoError(t, err)
	assert.Empty(t, r.Note)
	assert.GreaterOrEqual(t, r.Elapsed, 50*time.Millisecond, "the copies wait out the scheduled delay")
	assert.Less(t, time.Since(start), 30*time.Second)
	require.NoError(t, b.Cleanup())
}

// TestSTOMPBaselineConsumers: the consumer count follows a subscription coming and going, as the
// broker's advisories report it.
func TestSTOMPBaselineConsumers(t *testing.T) {
	b, q := newSTOMPBaseline(t)
	n, err := b.Consumers(q)
	require.NoError(t, err)
	assert.Zero(t, n)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := stomp.Dial(ctx, stompURL(t))
	require.NoError(t, err)
	defer c.Close(ctx) //nolint:errcheck // test cleanup
	sub, err := c.Subscribe(ctx, "/queue/"+q, stomp.SubscribeOptions{Prefetch: 1})
	require.NoError(t, err)
	count := func() int {
		n, err := b.Consumers("/queue/" + q) // the port may name its queues with the prefix
		require.NoError(t, err)
		return n
	}
	require.Eventually(t, func() bool { return count() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, sub.Unsubscribe(ctx))
	require.Eventually(t, func() bool { return count() == 0 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, b.Cleanup())
}
