package mq

import (
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// Faults are a provider's fault hooks for the contract suite (pkg/mq/mqtest's Faults), reaching
// the port through its test hooks: on the sockets under its connections, and before each
// settlement. They live in a _test file of package mq, so the external test package that runs the
// suite can use them and nothing else can. NewRabbitEnv (below) and NewSTOMPEnv
// (stomp_export_test.go) wire them into a Broker of their provider.
type Faults struct {
	depth func(t *testing.T, queue string) int
	// wrap is what the port's connection gets of a faultConn (STOMP's must sever on Close).
	wrap func(*faultConn) net.Conn

	mu      sync.Mutex
	consume []*faultConn // the consuming connections, newest last
	publish []*faultConn // the publishing connections, newest last
	// withholding is the publishing connection frozen for the copy being written (copySending),
	// severed once it is written (copySent).
	withholding *faultConn
	armCopy     bool
	tearSettle  bool
	refuse      bool
}

// faultConn is a TCP connection a test can freeze (reads withheld: confirms never arrive), sever,
// or make fail its next write as a socket being torn down does.
type faultConn struct {
	net.Conn
	mu      sync.Mutex
	frozen  bool
	failing error
	severed chan struct{}
	once    sync.Once
}

func (c *faultConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	frozen := c.frozen
	c.mu.Unlock()
	if frozen {
		<-c.severed
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *faultConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	err := c.failing
	c.mu.Unlock()
	if err != nil {
		c.Conn.Close() //nolint:errcheck // the socket is going away
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *faultConn) freeze() {
	c.mu.Lock()
	c.frozen = true
	c.mu.Unlock()
}

func (c *faultConn) sever() {
	c.once.Do(func() {
		close(c.severed)
		c.Conn.Close() //nolint:errcheck // cutting is the point
	})
}

// hooks are the port's test hooks that carry out the faults.
func (f *Faults) hooks() *testHooks {
	return &testHooks{
		wrapConn: func(purpose string, c net.Conn) net.Conn {
			fc := &faultConn{Conn: c, severed: make(chan struct{})}
			f.mu.Lock()
			defer f.mu.Unlock()
			if purpose == "consume" {
				f.consume = append(f.consume, fc)
			} else {
				f.publish = append(f.publish, fc)
			}
			if f.wrap != nil {
				return f.wrap(fc)
			}
			return fc
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
		settling: func(_ *Message, behind func()) {
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
				// Settled behind the port's back first, on the same connection: the port's own
				// settlement names a delivery the broker no longer holds (RabbitMQ: 406 and a
				// closed channel; ActiveMQ: an ERROR, "Unexpected ACK", and a closed connection).
				behind()
			}
		},
	}
}

// unfreeze severs the frozen connections: a frozen connection would hold the Broker's close.
func (f *Faults) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range slices.Concat(f.consume, f.publish) {
		c.mu.Lock()
		frozen := c.frozen
		c.mu.Unlock()
		if frozen {
			c.sever()
		}
	}
}

// NewRabbitEnv is the RabbitMQ provider of the contract suite: a RabbitMQ Broker on a scope of its
// own (its queues deleted at the end, see setupWith) and the faults wired into it.
func NewRabbitEnv(t *testing.T, timeScale float64) (Broker, *Faults) {
	t.Helper()
	f := &Faults{}
	tb := setupWith(t, Config{TimeScale: timeScale, hooks: f.hooks()})
	f.depth = tb.depth
	t.Cleanup(f.unfreeze)
	return tb.b, f
}

// Depth is the number of ready messages in a queue, from a connection of the test's own.
func (f *Faults) Depth(t *testing.T, queue string) int {
	t.Helper()
	return f.depth(t, queue)
}

// CutConsuming severs the newest consuming connection's socket, as a network fault would: the
// port learns of it from the failed read, with no word from the broker.
func (f *Faults) CutConsuming(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	require.NotEmpty(t, f.consume, "no consuming connection yet")
	c := f.consume[len(f.consume)-1]
	f.mu.Unlock()
	c.sever()
}

// WithholdCopyConfirm: the next retry, defer or dead-letter copy is written on a publishing
// connection that then withholds every confirm (RECEIPT), and is severed once the copy is written.
func (f *Faults) WithholdCopyConfirm(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armCopy = true
}

// WithholdPublishConfirms freezes the current publishing connection: publishes are written, their
// confirms (RECEIPTs) never read. cut severs it, so the port dials another.
func (f *Faults) WithholdPublishConfirms(t *testing.T) (cut func()) {
	t.Helper()
	f.mu.Lock()
	require.NotEmpty(t, f.publish, "no publishing connection yet")
	c := f.publish[len(f.publish)-1]
	f.mu.Unlock()
	c.freeze()
	return c.sever
}

// TearDownOnNextSettle makes the next handler settlement's write fail with a broken pipe, and the
// consuming socket close, as a connection being torn down does.
func (f *Faults) TearDownOnNextSettle(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tearSettle = true
}

// RefuseNextSettle has the next handler settlement refused by the broker on a live connection:
// the delivery is settled behind the port's back first, so the port's own settlement names a
// delivery the broker no longer holds.
func (f *Faults) RefuseNextSettle(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = true
}
