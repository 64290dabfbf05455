package mq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// consumeDrained runs Consume with Drain in the background: take stops it taking deliveries,
// work cancels its handlers. The returned channel yields what Consume returned.
func (tb *bundle) consumeDrained(t *testing.T, route string, concurrency int, grace time.Duration, h Handler) (take, work context.CancelFunc, done <-chan error) {
	t.Helper()
	takeCtx, stopTaking := context.WithCancel(tb.ctx)
	workCtx, cancelWork := context.WithCancel(tb.ctx)
	ch := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		ch <- tb.b.Consume(takeCtx, route, concurrency, h, Drain(workCtx, grace))
	}()
	t.Cleanup(func() {
		stopTaking()
		cancelWork()
		select {
		case <-returned:
		case <-time.After(waitFor):
			t.Error("Consume did not return")
		}
	})
	return stopTaking, cancelWork, ch
}

// TestDrainLetsInFlightHandlersFinish: once a drained consumer stops taking, no new delivery
// reaches a handler (those it held go back to the queue at once, for another replica), while the
// two handlers in flight go on with a live context; when they finish, their acks land, and
// Consume returns without its work context ever being cancelled.
func TestDrainLetsInFlightHandlersFinish(t *testing.T) {
	t.Parallel()
	const n, concurrency = 10, 2
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "drain", Prefetch: n}))
	msgs := make([]Outgoing, n)
	for i := range msgs {
		msgs[i] = Outgoing{ID: fmt.Sprintf("d-%02d", i)}
	}
	for i, err := range tb.b.PublishAll(tb.ctx, "drain", msgs) {
		require.NoError(t, err, "message %d", i)
	}
	var calls atomic.Int32
	started := make(chan string, n)
	release := make(chan struct{})
	finished := make(chan error, n) // the handler's ctx.Err() as it returned
	take, _, done := tb.consumeDrained(t, "drain", concurrency, 5*time.Second, func(ctx context.Context, m *Message) Result {
		calls.Add(1)
		started <- m.ID
		select {
		case <-release:
		case <-ctx.Done():
		}
		finished <- ctx.Err()
		if ctx.Err() != nil {
			return Result{}
		}
		return Ack()
	})
	for i := range concurrency {
		receive(t, started, fmt.Sprintf("handler %d in flight", i+1))
	}
	// All ten were delivered (prefetch 10): two in handlers, eight held by the port.
	require.Eventually(t, func() bool { return tb.depth(t, tb.b.QueueName("drain")) == 0 }, waitFor, 10*time.Millisecond)

	take()
	require.Eventually(t, func() bool { return tb.depth(t, tb.b.QueueName("drain")) == n-concurrency }, waitFor, 10*time.Millisecond,
		"the deliveries not started are back in the queue while the handlers still run")
	select {
	case err := <-done:
		t.Fatalf("Consume returned (%v) with handlers in flight", err)
	default:
	}
	close(release)
	for range concurrency {
		assert.NoError(t, receive(t, finished, "handler finished"), "the handler's context stayed alive")
	}
	assert.NoError(t, receive(t, done, "Consume's return"))
	assert.EqualValues(t, concurrency, calls.Load(), "no delivery reached a handler after the consumer stopped taking")
	c := tb.b.Counters("drain")
	assert.EqualValues(t, concurrency, c.Acknowledged, "the in-flight handlers' acks landed")
	assert.EqualValues(t, n-concurrency, c.Requeued)
	assert.Zero(t, c.Lost+c.Superseded+c.Retried)
	assert.Equal(t, n-concurrency, tb.depth(t, tb.b.QueueName("drain")), "the two acked are gone, the rest wait")
}

// TestDrainCancelsHandlersAtTheEndOfWork: a handler outlasting the drain keeps its context until
// the work context ends, then sees it cancelled; its result is a requeue, not a retry, and the
// message is redelivered at the same attempt.
func TestDrainCancelsHandlersAtTheEndOfWork(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "outlast", Retry: RetryPolicy{Delays: []time.Duration{time.Second}}}))
	require.NoError(t, tb.b.Publish(tb.ctx, "outlast", Outgoing{ID: "m-outlast"}))
	started := make(chan struct{})
	cancelledAt := make(chan time.Time, 1)
	take, work, done := tb.consumeDrained(t, "outlast", 1, 5*time.Second, func(ctx context.Context, m *Message) Result {
		close(started)
		<-ctx.Done()
		cancelledAt <- time.Now()
		return Fail(ctx.Err()) // a cut-off handler's Fail is not a retry
	})
	receive(t, started, "handler start")
	take()
	// A message published now is not taken, while the first handler still runs.
	require.NoError(t, tb.b.Publish(tb.ctx, "outlast", Outgoing{ID: "m-later"}))
	require.Eventually(t, func() bool { return tb.depth(t, tb.b.QueueName("outlast")) == 1 }, waitFor, 10*time.Millisecond)
	select {
	case <-cancelledAt:
		t.Fatal("the handler's context was cancelled when the consumer stopped taking")
	default:
	}
	workEnded := time.Now()
	work()
	assert.False(t, receive(t, cancelledAt, "handler cancelled").Before(workEnded))
	assert.NoError(t, receive(t, done, "Consume's return"))

	got := make(chan seen, 2)
	tb.consume(t, "outlast", 1, func(_ context.Context, m *Message) Result {
		got <- see(m)
		return Ack()
	})
	byID := map[string]seen{}
	for range 2 {
		s := receive(t, got, "delivery to the next consumer")
		byID[s.ID] = s
	}
	require.Contains(t, byID, "m-outlast")
	assert.Equal(t, 1, byID["m-outlast"].Attempt, "no attempt spent")
	assert.True(t, byID["m-outlast"].Redelivered)
	require.Contains(t, byID, "m-later")
	require.Eventually(t, func() bool { return tb.b.Counters("outlast").Acknowledged == 2 }, waitFor, 10*time.Millisecond)
	c := tb.b.Counters("outlast")
	// m-later too if it reached the port before the broker consumer was cancelled.
	assert.Contains(t, []uint64{1, 2}, c.Requeued)
	assert.Zero(t, c.Retried+c.DeadLettered+c.Lost)
}

// TestDrainGraceBoundsAHandlerIgnoringItsContext: a handler that ignores its cancelled context
// does not hold Consume past the grace; the broker redelivers its message.
func TestDrainGraceBoundsAHandlerIgnoringItsContext(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "stubborn"}))
	require.NoError(t, tb.b.Publish(tb.ctx, "stubborn", Outgoing{ID: "m-stubborn"}))
	started := make(chan struct{})
	hang := make(chan struct{})
	const grace = 300 * time.Millisecond
	take, work, done := tb.consumeDrained(t, "stubborn", 1, grace, func(context.Context, *Message) Result {
		close(started)
		<-hang
		return Ack()
	})
	t.Cleanup(func() { close(hang) }) // after the checks: goleak wants the worker gone
	receive(t, started, "handler start")
	take()
	work()
	t0 := time.Now()
	assert.NoError(t, receive(t, done, "Consume's return"))
	// The handler hangs until the test ends: returning within 10 s is the grace's doing, with room
	// for a loaded machine.
	assert.Less(t, time.Since(t0), grace+10*time.Second, "Consume returns about a grace after its work context ended")
	require.Eventually(t, func() bool { return tb.depth(t, tb.b.QueueName("stubborn")) == 1 }, waitFor, 10*time.Millisecond,
		"the unsettled delivery went back to the broker with the channel")
}

// failingConn fails its writes once armed, as a socket being torn down does, and closes itself.
type failingConn struct {
	net.Conn
	armed atomic.Pointer[error]
}

func (c *failingConn) Write(p []byte) (int, error) {
	if err := c.armed.Load(); err != nil {
		c.Conn.Close() //nolint:errcheck // the socket is going away
		return 0, *err
	}
	return c.Conn.Write(p)
}

// TestSettleOnATornDownSocketIsSuperseded: the consuming connection's socket fails while a
// handler's Ack is written (broken pipe, connection reset). amqp091-go hands back the socket's
// error, not ErrClosed, before it has noticed: the ack is counted superseded, not lost; the
// broker redelivers the message on the next subscription and it is acked there.
func TestSettleOnATornDownSocketIsSuperseded(t *testing.T) {
	t.Parallel()
	for name, sockErr := range map[string]error{
		"broken pipe":      &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)},
		"connection reset": &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var conns []*failingConn
			tb := setupWith(t, Config{hooks: &testHooks{wrapConn: func(purpose string, c net.Conn) net.Conn {
				if purpose != "consume" {
					return c
				}
				fc := &failingConn{Conn: c}
				mu.Lock()
				conns = append(conns, fc)
				mu.Unlock()
				return fc
			}}})
			require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "torn"}))
			require.NoError(t, tb.b.Publish(tb.ctx, "torn", Outgoing{ID: "m-torn"}))
			var calls atomic.Int32
			tb.consume(t, "torn", 1, func(_ context.Context, m *Message) Result {
				if calls.Add(1) == 1 {
					mu.Lock()
					conns[len(conns)-1].armed.Store(&sockErr) // the ack is the next write
					mu.Unlock()
				}
				return Ack()
			})
			require.Eventually(t, func() bool { return tb.b.Counters("torn").Acknowledged == 1 }, waitFor, 10*time.Millisecond,
				"redelivered on the next subscription and acked there")
			c := tb.b.Counters("torn")
			assert.EqualValues(t, 1, c.Superseded, "the ack on the dying socket")
			assert.Zero(t, c.Lost, "no loss happened")
			assert.EqualValues(t, 2, calls.Load())
		})
	}
}

// TestClassifySettle classifies settle errors without waiting: teardown (superseded), a protocol
// error of the port's own such as 406 PRECONDITION_FAILED (lost: a bug, not hidden), or unknown.
func TestClassifySettle(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(testURL())
	require.NoError(t, err)
	defer conn.Close()
	live, err := conn.Channel()
	require.NoError(t, err)
	defer live.Close()
	closed, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, closed.Close())

	for _, tc := range []struct {
		name string
		ch   *amqp.Channel
		err  error
		want settleFault
	}{
		{"ErrClosed", live, amqp.ErrClosed, faultTornDown},
		{"connection-forced", live, &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure"}, faultTornDown},
		{"frame error of a failed write", live, &amqp.Error{Code: amqp.FrameError, Reason: "write tcp: broken pipe"}, faultTornDown},
		{"broker internal error", live, &amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR"}, faultTornDown},
		{"unknown delivery tag", live, &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - unknown delivery tag 7", Server: true, Recover: true}, faultOurs},
		{"no such queue", live, &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'q'"}, faultOurs},
		{"command invalid", live, &amqp.Error{Code: amqp.CommandInvalid, Reason: "COMMAND_INVALID"}, faultOurs},
		{"broken pipe", live, fmt.Errorf("ack: %w", &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)}), faultTornDown},
		{"connection reset", live, syscall.ECONNRESET, faultTornDown},
		{"use of closed connection", live, net.ErrClosed, faultTornDown},
		{"unknown error, channel already closed", closed, errors.New("something else"), faultTornDown},
		{"unknown error on a live channel", live, errors.New("something else"), faultUnknown},
	} {
		assert.Equal(t, tc.want, classifySettle(&rabbitStream{ch: tc.ch}, tc.err), tc.name)
	}
}

// TestSettleFailedDecidesOffTheOwner: an unknown settle error is decided in a goroutine of its
// own — settleFailed returns at once — as a teardown if the channel shuts down within
// tornDownWait, as a loss if it stays open.
func TestSettleFailedDecidesOffTheOwner(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(testURL())
	require.NoError(t, err)
	defer conn.Close()
	c := &rabbitLink{}
	unknown := errors.New("something else")

	live, err := conn.Channel()
	require.NoError(t, err)
	defer live.Close()
	// Events, not elapsed times (tornDownWait is 100 ms, less than a loaded machine's delays):
	// the decision is held at a gate until settleFailed has returned, so a caller that waited for
	// it would never return; and the decision's own time is a lower bound.
	type decision struct {
		torn bool
		at   time.Duration
	}
	gate, returned := make(chan struct{}), make(chan struct{})
	decisions := make(chan decision, 1)
	t0 := time.Now()
	go func() {
		c.settleFailed(&rabbitStream{ch: live}, unknown, func(torn bool) {
			at := time.Since(t0)
			<-gate
			decisions <- decision{torn, at}
		})
		close(returned)
	}()
	receive(t, returned, "settleFailed's return: the caller does not wait for the decision")
	close(gate)
	d := receive(t, decisions, "decision on the live channel")
	assert.GreaterOrEqual(t, d.at, tornDownWait, "not decided before the channel had its time to close")
	assert.False(t, d.torn, "a live channel: lost")

	decided := make(chan bool, 1)

	closing, err := conn.Channel()
	require.NoError(t, err)
	down := make(chan struct{})
	watch := closing.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		for range watch { // until amqp091-go closes it at the channel's shutdown
		}
		close(down)
	}()
	c.settleFailed(&rabbitStream{ch: closing, down: down}, unknown, func(torn bool) { decided <- torn })
	require.NoError(t, closing.Close()) // the teardown the error came from
	assert.True(t, receive(t, decided, "decision on the closing channel"), "closed meanwhile: superseded")
}

// TestUnknownDeliveryTagIsLost: a settle the broker refuses with 406 PRECONDITION_FAILED (an ack of
// a tag the channel does not know: a bug of the port) is not answered, so it was counted when it
// was written; when the channel closes for it, one settlement is counted lost, not hidden.
func TestUnknownDeliveryTagIsLost(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	conn, err := amqp.Dial(testURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	require.NoError(t, ch.Ack(4242, false), "acks are not answered: the write succeeds")
	e := receive(t, closes, "the broker closing the channel")
	require.NotNil(t, e)
	require.Equal(t, amqp.PreconditionFailed, e.Code)
	// amqp091-go closed closes after sending e; lose() reads its subscription's own copy.
	reason := make(chan *amqp.Error, 1)
	reason <- e

	c := &consumer{p: tb.b, top: &topology{route: "bad-tag"}, rules: &rules{st: tb.b.routeStats("bad-tag"), log: zap.NewNop()}}
	l := &rabbitLink{b: tb.r, c: c}
	o := &owner[amqp.Delivery]{consumer: c, l: l, s: &rabbitStream{l: l, ch: ch, closes: reason}}
	o.lose()
	got := tb.b.Counters("bad-tag")
	assert.EqualValues(t, 1, got.Lost)
	assert.Zero(t, got.Superseded)
}

// TestCloseContextBoundsAHangingConsumer: a handler that ignores its cancelled context does not
// hold CloseContext past its ctx; the connections are closed all the same and the broker gets
// the delivery back.
func TestCloseContextBoundsAHangingConsumer(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "hung"}))
	require.NoError(t, tb.b.Publish(tb.ctx, "hung", Outgoing{ID: "m-hung"}))
	started := make(chan struct{})
	hang := make(chan struct{})
	consumed := make(chan error, 1)
	go func() {
		consumed <- tb.b.Consume(context.Background(), "hung", 1, func(context.Context, *Message) Result {
			close(started)
			<-hang
			return Ack()
		})
	}()
	t.Cleanup(func() {
		close(hang)
		assert.ErrorIs(t, <-consumed, ErrClosed)
	})
	receive(t, started, "handler start")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := tb.b.CloseContext(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the consumer was still stopping")
	// The handler hangs until the test ends: returning within 10 s is the ctx's doing.
	assert.Less(t, time.Since(t0), 10*time.Second, "CloseContext returned at its ctx's end")
	require.Eventually(t, func() bool { return tb.depth(t, tb.b.QueueName("hung")) == 1 }, waitFor, 10*time.Millisecond,
		"the connection is closed: the delivery is back in the queue")
}

// TestDrainBoundsASilentBroker: the broker stops answering the consuming connection (nothing it
// sends is read) while a drained consumer stops taking. The cancel goes unanswered, so the
// channel is closed, which goes unanswered too: Consume returns within a few graces, rather than
// when heartbeats notice the dead connection (tens of seconds).
func TestDrainBoundsASilentBroker(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var conns []*cutConn
	subscribed := make(chan struct{}, 1)
	tb := setupWith(t, Config{hooks: &testHooks{
		wrapConn: func(purpose string, c net.Conn) net.Conn {
			if purpose != "consume" {
				return c
			}
			cc := &cutConn{Conn: c, severed: make(chan struct{})}
			mu.Lock()
			conns = append(conns, cc)
			mu.Unlock()
			return cc
		},
		subscribed: func(string, uint64) {
			select {
			case subscribed <- struct{}{}:
			default:
			}
		},
	}})
	t.Cleanup(func() { // before the Broker closes: its close of a frozen connection would wait
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.sever()
		}
	})
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "silent"}))
	const grace = 200 * time.Millisecond
	take, _, done := tb.consumeDrained(t, "silent", 1, grace, func(context.Context, *Message) Result { return Ack() })
	receive(t, subscribed, "subscription")
	mu.Lock()
	conns[len(conns)-1].frozen.Store(true)
	mu.Unlock()
	t0 := time.Now()
	take()
	assert.NoError(t, receive(t, done, "Consume's return"))
	// A grace for the cancel, one for the close, one for the cancel call to end, and slack.
	// Heartbeats would notice the dead connection only after tens of seconds: 10 s of slack tells
	// the graces apart from them, with room for a loaded machine.
	assert.Less(t, time.Since(t0), 3*grace+10*time.Second, "Consume returned about three graces after it stopped taking")
}

// TestDrainWaitsForACopyBeingConfirmed: a handler's retry copy is still waiting for its confirm
// when the work context ends and the grace passes. The consumer does not abandon it (closing the
// channel would requeue the original beside the copy): it waits for the confirm, acks the
// original, and the message exists once, as the retry copy.
func TestDrainWaitsForACopyBeingConfirmed(t *testing.T) {
	t.Parallel()
	sent := make(chan struct{})
	release := make(chan struct{})
	tb := setupWith(t, Config{hooks: &testHooks{
		copySent: func(string) {
			close(sent)
			<-release // a confirm that takes longer than the grace
		},
	}})
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "slowcopy", Retry: RetryPolicy{Delays: []time.Duration{time.Hour}}}))
	require.NoError(t, tb.b.Publish(tb.ctx, "slowcopy", Outgoing{ID: "m-slow"}))
	const grace = 200 * time.Millisecond
	var calls atomic.Int32
	take, work, done := tb.consumeDrained(t, "slowcopy", 1, grace, func(context.Context, *Message) Result {
		calls.Add(1)
		return Fail(errors.New("transient"))
	})
	receive(t, sent, "the retry copy written")
	take()
	work()
	// The grace runs out while the copy waits: time passing is the condition under test.
	time.Sleep(3 * grace)
	select {
	case err := <-done:
		t.Fatalf("Consume returned (%v) with a copy being confirmed", err)
	default:
	}
	close(release)
	assert.NoError(t, receive(t, done, "Consume's return"))
	c := tb.b.Counters("slowcopy")
	assert.EqualValues(t, 1, c.Retried, "the copy was confirmed and the original acked")
	assert.Zero(t, c.Requeued+c.Superseded+c.Lost, "the original was not given back beside its copy")
	assert.Zero(t, tb.depth(t, tb.b.QueueName("slowcopy")), "no original left in the work queue")
	assert.EqualValues(t, 1, calls.Load())
}
