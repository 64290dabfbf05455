package mq

import (
	"context"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// STOMPFaults are the STOMP provider's fault hooks for the contract suite (pkg/mq/mqtest's
// Faults), on the sockets under the port's STOMP connections (pkg/stomp's WithDialer) and a test
// hook before each acknowledgement.
type STOMPFaults struct {
	url string

	mu          sync.Mutex
	consume     []*faultConn // the consuming connections, newest last
	publish     []*faultConn // the publishing connections, newest last
	withholding *faultConn
	armCopy     bool
	tearSettle  bool
	refuse      bool
}

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
func NewSTOMPEnv(t *testing.T, timeScale float64) (Broker, *STOMPFaults) {
	t.Helper()
	f := &STOMPFaults{url: stompTestURL(t)}
	hooks := &testHooks{
		wrapConn: func(purpose string, c net.Conn) net.Conn {
			fc := &faultConn{Conn: c, severed: make(chan struct{})}
			f.mu.Lock()
			defer f.mu.Unlock()
			if purpose == "consume" {
				f.consume = append(f.consume, fc)
			} else {
				f.publish = append(f.publish, fc)
			}
			return severing{fc}
		},
		copySending: func(string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.armCopy {
				f.armCopy = false
				f.withholding = f.publish[len(f.publish)-1]
				f.withholding.freeze()
			}
		},
		copySent: func(string) {
			f.mu.Lock()
			c := f.withholding
			f.withholding = nil
			f.mu.Unlock()
			if c != nil {
				c.sever()
			}
		},
		stompSettling: func(conn *stomp.Conn, m *stomp.Message) {
			f.mu.Lock()
			defer f.mu.Unlock()
			switch {
			case f.tearSettle:
				f.tearSettle = false
				c := f.consume[len(f.consume)-1]
				c.mu.Lock()
				c.failing = &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
				c.mu.Unlock()
			case f.refuse:
				f.refuse = false
				// Acknowledged behind the port's back, on the same connection and before the port's
				// own ACK: the broker no longer holds the delivery that ACK names, and answers it
				// with an ERROR.
				conn.Write(&stomp.Frame{Command: "ACK", Headers: []stomp.Header{{Key: "id", Value: m.AckID}}}) //nolint:errcheck // the port's ACK shows the outcome
			}
		},
	}
	logger := zap.NewNop()
	if os.Getenv("MQ_TEST_LOG") != "" {
		logger = zap.Must(zap.NewDevelopment())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	b, err := dial(ctx, Config{URL: f.url, Scope: "mqtest-" + uuid.NewString()[:8], TimeScale: timeScale,
		Logger: logger, hooks: hooks}, ProviderSTOMP)
	require.NoError(t, err)
	// Cleanups run last-registered first: the test's consumers stop, the queues are emptied, the
	// Broker closes.
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	t.Cleanup(func() {
		f.mu.Lock()
		for _, c := range slices.Concat(f.consume, f.publish) {
			c.mu.Lock()
			frozen := c.frozen
			c.mu.Unlock()
			if frozen {
				c.sever() // a frozen publishing connection is replaced by the next call
			}
		}
		f.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		b.mu.RLock()
		routes := make([]Route, 0, len(b.routes))
		for name := range b.routes {
			routes = append(routes, Route{Name: name})
		}
		b.mu.RUnlock()
		assert.NoError(t, b.DeleteRoutes(ctx, routes...))
	})
	return b, f
}

// Depth is the number of messages ready in a queue, browsed from a connection of the test's own.
func (f *STOMPFaults) Depth(t *testing.T, queue string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := stomp.Dial(ctx, f.url)
	require.NoError(t, err)
	defer c.Close(ctx) //nolint:errcheck // a test's own connection
	s, err := c.Subscribe(ctx, dest(queue), stomp.SubscribeOptions{Ack: stomp.AckAuto, Browser: true})
	require.NoError(t, err)
	n := 0
	for {
		select {
		case m, ok := <-s.C():
			require.True(t, ok, "browse %s: connection ended: %v", queue, c.Err())
			if stompValue(m.Headers, "browser") == "end" {
				return n
			}
			n++
		case <-ctx.Done():
			t.Fatalf("browse %s: %v", queue, ctx.Err())
		}
	}
}

// CutConsuming severs the newest consuming connection's socket: the port learns of it from the
// failed read, with no word from the broker.
func (f *STOMPFaults) CutConsuming(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	require.NotEmpty(t, f.consume, "no consuming connection yet")
	c := f.consume[len(f.consume)-1]
	f.mu.Unlock()
	c.sever()
}

// WithholdCopyConfirm: the next retry, defer or dead-letter copy is written on a publishing
// connection that then withholds every RECEIPT, and is severed once the copy is written.
func (f *STOMPFaults) WithholdCopyConfirm(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armCopy = true
}

// WithholdPublishConfirms freezes the publishing connection: SENDs are written, RECEIPTs never
// read. cut severs it, so the port dials another.
func (f *STOMPFaults) WithholdPublishConfirms(t *testing.T) (cut func()) {
	t.Helper()
	f.mu.Lock()
	require.NotEmpty(t, f.publish, "no publishing connection yet")
	c := f.publish[len(f.publish)-1]
	f.mu.Unlock()
	c.freeze()
	return c.sever
}

// TearDownOnNextSettle makes the next acknowledgement's write fail with a broken pipe, and the
// consuming socket close, as a connection being torn down does.
func (f *STOMPFaults) TearDownOnNextSettle(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tearSettle = true
}

// RefuseNextSettle has the broker refuse the next acknowledgement on a live connection: the
// delivery is acknowledged behind the port's back first, so ActiveMQ answers the port's ACK with
// an ERROR ("Unexpected ACK").
func (f *STOMPFaults) RefuseNextSettle(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = true
}
