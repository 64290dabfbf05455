package mq

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// stompTestURL is the ActiveMQ of the tests (scripts/deps.sh up stomp; make test starts it).
func stompTestURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("INTEGRATIONS_STOMP_URL")
	if u == "" {
		t.Fatal("INTEGRATIONS_STOMP_URL is not set: run scripts/deps.sh up stomp and source .run/deps.env (make test does)")
	}
	return u
}

// severing is a faultConn whose Close severs it: a frozen read must not outlive the connection's
// close (pkg/stomp's Close waits for its reader).
type severing struct{ *faultConn }

func (c severing) Close() error {
	c.sever()
	return nil
}

// NewSTOMPEnv is the STOMP provider of the contract suite: a STOMP Broker on ActiveMQ on a scope
// of its own (its queues emptied at the end: STOMP cannot delete them), with the faults wired in.
func NewSTOMPEnv(t *testing.T, timeScale float64) (Broker, *Faults) {
	t.Helper()
	url := stompTestURL(t)
	f := &Faults{
		depth: func(t *testing.T, queue string) int { return stompDepth(t, url, queue) },
		wrap:  func(fc *faultConn) net.Conn { return severing{fc} },
	}
	logger := zap.NewNop()
	if os.Getenv("MQ_TEST_LOG") != "" {
		logger = zap.Must(zap.NewDevelopment())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	b, err := dial(ctx, Config{URL: url, Scope: "mqtest-" + uuid.NewString()[:8], TimeScale: timeScale,
		Logger: logger, hooks: f.hooks()}, ProviderSTOMP)
	require.NoError(t, err)
	// Cleanups run last-registered first: the test's consumers stop, the queues are emptied, the
	// Broker closes.
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	t.Cleanup(func() {
		f.unfreeze() // a frozen publishing connection is replaced by the next call
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		routes := make([]Route, 0)
		for _, top := range b.declared() {
			routes = append(routes, Route{Name: top.route})
		}
		assert.NoError(t, b.DeleteRoutes(ctx, routes...))
	})
	return b, f
}

// stompDepth is the number of messages ready in a queue, browsed from a connection of the test's
// own.
func stompDepth(t *testing.T, url, queue string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := stomp.Dial(ctx, url)
	require.NoError(t, err)
	defer c.Close(ctx) //nolint:errcheck // a test's own connection
	s, err := c.Subscribe(ctx, dest(queue), stomp.SubscribeOptions{Ack: stomp.AckAuto, Browser: true})
	require.NoError(t, err)
	n := 0
	for {
		select {
		case m, ok := <-s.C():
			require.True(t, ok, "browse %s: connection ended: %v", queue, c.Err())
			if m.Value("browser") == "end" {
				return n
			}
			n++
		case <-ctx.Done():
			t.Fatalf("browse %s: %v", queue, ctx.Err())
		}
	}
}
