package mq

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// rabbitmqctl runs rabbitmqctl on the node the tests' broker is: $INTEGRATIONS_RABBITMQCTL
// (scripts/deps.sh writes it to .run/deps.env for a project-local node, whose name, cookie and
// epmd port a plain rabbitmqctl does not know) on $INTEGRATIONS_RABBITMQ_NODE, or plain
// rabbitmqctl on its default node (the system's broker). Without either it skips the test.
func rabbitmqctl(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	bin := os.Getenv("INTEGRATIONS_RABBITMQCTL")
	if bin == "" {
		if _, err := exec.LookPath("rabbitmqctl"); err != nil {
			t.Skip("rabbitmqctl not on PATH and INTEGRATIONS_RABBITMQCTL not set: cannot close a connection from the broker side")
		}
		bin = "rabbitmqctl"
	}
	if node := os.Getenv("INTEGRATIONS_RABBITMQ_NODE"); node != "" {
		args = append([]string{"-n", node}, args...)
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w", bin, err)
	}
	return string(out), nil
}

// closeFromBroker closes, on the broker's side, the connection whose client-provided name is name
// (see Broker.dial): one rabbitmqctl call to find its pid, one to close it (~1 s each idle, over
// 10 s each on a loaded two-core machine: ctx must allow for it).
func closeFromBroker(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	out, err := rabbitmqctl(t, ctx, "list_connections", "-q", "--no-table-headers", "pid", "client_properties")
	require.NoError(t, err, "rabbitmqctl list_connections: %s", out)
	var pid string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `{"connection_name","`+name+`"}`) {
			pid = strings.Fields(line)[0]
		}
	}
	require.NotEmpty(t, pid, "no connection named %q in:\n%s", name, out)
	out, err = rabbitmqctl(t, ctx, "close_connection", pid, "mq test: closed from the broker side")
	require.NoError(t, err, "rabbitmqctl close_connection: %s", out)
}

// no406 fails the test if any log entry mentions a 406 PRECONDITION_FAILED: what the broker
// answers when a stale delivery tag is settled on a new channel.
func no406(t *testing.T, logs *observer.ObservedLogs) {
	t.Helper()
	for _, e := range logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		assert.NotContains(t, line, "PRECONDITION_FAILED")
		assert.NotContains(t, line, "406")
	}
}

// TestBrokerClosesConsumingConnection: the broker closes the consuming connection while eight
// handlers are mid-flight and more deliveries wait in the port. The port resubscribes by itself;
// the mid-flight results are superseded, never acked on the new channel (no 406); the broker
// redelivers everything; every message is acked exactly once and the queue ends empty.
func TestBrokerClosesConsumingConnection(t *testing.T) {
	t.Parallel()
	const (
		n           = 40
		concurrency = 8
	)
	core, logs := observer.New(zap.DebugLevel)
	var mu sync.Mutex
	acks := map[string]int{}        // acks the broker accepted, per message id
	completions := map[string]int{} // handler returns, per message id
	gens := make(chan uint64, 8)
	tb := setupWith(t, Config{Logger: zap.New(core), hooks: &testHooks{
		subscribed: func(_ string, gen uint64) {
			select {
			case gens <- gen:
			default: // never block the owner goroutine; the asserts below notice what is missing
			}
		},
		settled: func(_, id string, ev event) {
			if ev == evAcknowledged {
				mu.Lock()
				acks[id]++
				mu.Unlock()
			}
		},
	}})
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "killed", Prefetch: 16}))
	msgs := make([]Outgoing, n)
	for i := range msgs {
		msgs[i] = Outgoing{ID: fmt.Sprintf("k-%02d", i)}
	}
	for i, err := range tb.b.PublishAll(tb.ctx, "killed", msgs) {
		require.NoError(t, err, "message %d", i)
	}

	started := make(chan struct{}, 4*n)
	release := make(chan struct{})
	stop := tb.consume(t, "killed", concurrency, func(ctx context.Context, m *Message) Result {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return Result{}
		}
		mu.Lock()
		completions[m.ID]++
		mu.Unlock()
		return Ack()
	})
	assert.EqualValues(t, 1, receive(t, gens, "first subscription"))
	for i := range concurrency {
		receive(t, started, fmt.Sprintf("handler %d mid-flight", i+1))
	}

	t0 := time.Now()
	closeFromBroker(t, tb.ctx, tb.b.cfg.Scope+"/consume")
	t.Logf("rabbitmqctl took %v", time.Since(t0))
	assert.EqualValues(t, 2, receive(t, gens, "resubscription after the broker closed the connection"))
	t.Logf("resubscribed after %v", time.Since(t0))
	close(release) // the mid-flight handlers now return Ack for deliveries of the dead channel

	require.Eventually(t, func() bool { return tb.b.Counters("killed").Acknowledged == n }, waitFor, 10*time.Millisecond)
	stop()
	assert.Equal(t, 0, tb.depth(t, tb.b.QueueName("killed")), "nothing left unacked")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, acks, n)
	total := 0
	for id, a := range acks {
		assert.Equal(t, 1, a, "message %s acked %d times", id, a)
	}
	for _, c := range completions {
		total += c
	}
	assert.Equal(t, n+concurrency, total, "every message handled once more for each mid-flight handler")
	c := tb.b.Counters("killed")
	assert.GreaterOrEqual(t, c.Superseded, uint64(concurrency), "the mid-flight results")
	assert.LessOrEqual(t, c.Superseded, uint64(16), "at most a prefetch worth of deliveries was on the dead channel")
	assert.Zero(t, c.Lost+c.Requeued+c.Retried+c.DeadLettered)
	no406(t, logs)
	assert.NotEmpty(t, logs.FilterMessage("mq consumer lost its subscription; resubscribing").All())
}

// cutConn is a TCP connection the test can cut without the broker's last words reaching the
// client: once frozen, whatever it reads is withheld, and sever closes it. Freezing before a
// publish and severing after it leaves the publish unconfirmed, deterministically.
type cutConn struct {
	net.Conn
	frozen  atomic.Bool
	severed chan struct{}
	once    sync.Once
}

func (c *cutConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.frozen.Load() {
		<-c.severed
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *cutConn) sever() {
	c.once.Do(func() {
		close(c.severed)
		c.Conn.Close()
	})
}
