package mq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/stomp"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// The STOMP provider's own tests: what the contract suite does not reach (header encoding, the
// schedule header, a requeue whose copy is not confirmed, Discard, Diagnose).

func stompEnv(t *testing.T) (*port, *Faults, context.Context) {
	t.Helper()
	b, f := NewSTOMPEnv(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 4*waitFor)
	t.Cleanup(cancel)
	return b.(*port), f, ctx
}

func TestSTOMPHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	in := map[string]any{
		"tenant": "acme", "x-delivery-attempt": int32(3), "big": int64(1 << 40), "flag": true,
		"colon:less": nil, // replaced below: names are checked before values
	}
	delete(in, "colon:less")
	in["text"] = "a:b\nc\\d" // STOMP escapes these; the value comes back whole
	hs, err := stompHeaders(in)
	require.NoError(t, err)
	out := fromSTOMP(append(hs,
		stomp.Header{Key: "message-id", Value: "ID:1"}, stomp.Header{Key: "redelivered", Value: "true"},
		stomp.Header{Key: "AMQ_SCHEDULED_DELAY", Value: "10"}, stomp.Header{Key: hdrSTOMPID, Value: "m"},
		stomp.Header{Key: "tenant", Value: "second"},    // a repeated header: the first wins
		stomp.Header{Key: "a foreign name", Value: "v"}, // another producer's, not writable back
	))
	assert.Equal(t, map[string]any{
		"tenant": "acme", "x-delivery-attempt": int32(3), "big": int64(1 << 40), "flag": true, "text": "a:b\nc\\d",
	}, out, "the port's values come back typed; the broker's and the port's internal headers are dropped")

	crowded := []stomp.Header{{Key: "x-delivery-attempt", Value: "2"}}
	for k := range manyHeaders(stompMaxHeaders) {
		crowded = append(crowded, stomp.Header{Key: k, Value: "v"})
	}
	decoded := fromSTOMP(crowded)
	assert.Len(t, decoded, stompMaxHeaders-len(bookkeeping), "another producer's crowd of headers is cut to what a copy can carry")
	assert.Contains(t, decoded, "x-delivery-attempt", "the port's bookkeeping is kept")
	assert.Contains(t, decoded, "h00")
	_, err = stompHeaders(decoded)
	assert.NoError(t, err)

	for _, tc := range []struct {
		name string
		h    map[string]any
	}{
		{"a broker's header", map[string]any{"expires": "0"}},
		{"a broker's header in another case", map[string]any{"Persistent": "false"}},
		{"a JMS property", map[string]any{"JMSXGroupID": "g"}},
		{"ActiveMQ's schedule", map[string]any{"AMQ_SCHEDULED_DELAY": "1"}},
		{"the port's own", map[string]any{"mq_id": "other"}},
		{"a name STOMP escapes", map[string]any{"a:b": "v"}},
		{"an empty name", map[string]any{"": "v"}},
		{"a NUL in the value", map[string]any{"k": "a\x00b"}},
		{"not UTF-8", map[string]any{"k": "\xff"}},
		{"a type STOMP cannot carry", map[string]any{"k": 1.5}},
		{"a value over the line limit", map[string]any{"k": strings.Repeat("v", stompMaxHeaderLine)}},
		{"too many headers", manyHeaders(stompMaxHeaders + 1)},
	} {
		_, err := stompHeaders(tc.h)
		assert.ErrorIs(t, err, ErrSTOMPHeader, tc.name)
	}
}

// A header STOMP cannot carry fails its message, naming the header, and sends nothing; the other
// messages of the batch go.
func TestSTOMPPublishRefusesAHeaderItCannotWrite(t *testing.T) {
	t.Parallel()
	b, f, ctx := stompEnv(t)
	require.NoError(t, b.Declare(ctx, Route{Name: "work"}))
	errs := b.PublishAll(ctx, "work", []Outgoing{
		{ID: "ok-1"}, {ID: "bad", Headers: map[string]any{"expires": "1"}}, {ID: "ok-2"},
		{ID: "crowded", Headers: manyHeaders(stompMaxHeaders - len(bookkeeping) + 1)},
		{ID: "huge", Body: make([]byte, stompMaxBody+1)},
	})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrSTOMPHeader)
	assert.ErrorContains(t, errs[1], `"expires"`)
	require.NoError(t, errs[2])
	assert.ErrorIs(t, errs[3], ErrSTOMPHeader, "room is left for the copies' bookkeeping")
	assert.ErrorContains(t, errs[4], "body of")
	assert.Equal(t, Counters{Published: 2, Confirmed: 2}, b.Counters("work"))
	assert.Equal(t, 2, f.Depth(t, b.QueueName("work")))
}

// The schedule header is configuration: Classic's AMQ_SCHEDULED_DELAY keeps a delayed message out
// of the queue until (nearly) due; with schedule=artemis the copy carries _AMQ_SCHED_DELIVERY,
// which Classic ignores (it is in the queue at once), and the consumer still holds it to its due
// time: on either header a delayed message is never handled early.
func TestSTOMPScheduleHeaderByConfiguration(t *testing.T) {
	t.Parallel()
	for _, schedule := range []string{stompScheduleClassic, stompScheduleArtemis} {
		t.Run(schedule, func(t *testing.T) {
			t.Parallel()
			b, f, ctx := stompEnv(t)
			b.drv.(*stompDriver).schedule = schedule
			const delay = 1500 * time.Millisecond
			require.NoError(t, b.Declare(ctx, Route{Name: "later", DelayLevels: []time.Duration{delay}}))
			start := time.Now()
			require.NoError(t, b.PublishAfter(ctx, "later", []Outgoing{{ID: "m"}}, []time.Duration{delay})[0])
			inQueue := f.Depth(t, b.QueueName("later"))
			if schedule == stompScheduleClassic {
				assert.Zero(t, inQueue, "held by the broker's scheduler")
			} else {
				assert.Equal(t, 1, inQueue, "Classic ignores Artemis's header")
			}
			got := make(chan time.Time, 1)
			consumeIn(t, ctx, b, "later", 1, func(_ context.Context, m *Message) Result {
				got <- time.Now()
				return Ack()
			})
			select {
			case at := <-got:
				t.Logf("%s: handled %v after the publish (delay %v)", schedule, at.Sub(start), delay)
				assert.GreaterOrEqual(t, at.Sub(start), delay, "never handled early")
			case <-time.After(waitFor):
				t.Fatal("the delayed message never came")
			}
		})
	}
}

// A requeue whose copy is not confirmed leaves the original unacknowledged and recycles the
// subscription, which returns it: it is delivered again (redelivered) and acked.
func TestSTOMPUnconfirmedRequeueCopyRecyclesTheSubscription(t *testing.T) {
	t.Parallel()
	b, f, ctx := stompEnv(t)
	require.NoError(t, b.Declare(ctx, Route{Name: "shaky"}))
	require.NoError(t, b.Publish(ctx, "shaky", Outgoing{ID: "m"}))
	type seen struct{ redelivered bool }
	got := make(chan seen, 8)
	var calls, subscriptions atomic.Int32
	b.cfg.hooks.subscribed = func(string, uint64) { subscriptions.Add(1) }
	consumeIn(t, ctx, b, "shaky", 1, func(_ context.Context, m *Message) Result {
		got <- seen{redelivered: m.Redelivered}
		if calls.Add(1) == 1 {
			f.WithholdCopyConfirm(t) // the requeue's copy
			return Result{}
		}
		return Ack()
	})
	first := <-got
	assert.False(t, first.redelivered)
	select {
	case s := <-got:
		assert.True(t, s.redelivered, "returned by the recycled subscription")
	case <-time.After(waitFor):
		t.Fatal("the original never came back")
	}
	require.Eventually(t, func() bool { return b.Counters("shaky").Acknowledged >= 1 }, waitFor, 10*time.Millisecond)
	assert.EqualValues(t, 2, subscriptions.Load(), "the subscription was recycled")
	c := b.Counters("shaky")
	assert.EqualValues(t, 1, c.Requeued)
	assert.Zero(t, c.Lost)
}

// Discard removes every copy of the named dead letters and nothing else; an empty ids removes
// nothing.
func TestSTOMPDiscard(t *testing.T) {
	t.Parallel()
	b, f, ctx := stompEnv(t)
	require.NoError(t, b.Declare(ctx, Route{Name: "dead"}))
	stop := consumeIn(t, ctx, b, "dead", 1, func(context.Context, *Message) Result {
		return Reject(errors.New("no"))
	})
	for _, err := range b.PublishAll(ctx, "dead", []Outgoing{{ID: "a"}, {ID: "b"}, {ID: "a"}, {ID: "it's"}}) {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.Counters("dead").DeadLettered == 4 }, waitFor, 10*time.Millisecond)
	stop()
	n, err := b.Discard(ctx, "dead", nil)
	require.NoError(t, err)
	assert.Zero(t, n)
	n, err = b.Discard(ctx, "dead", []string{"a", "it's", "absent"})
	require.NoError(t, err)
	assert.Equal(t, 3, n, "both copies of a, and an id with a quote")
	dls, err := b.DeadLetters(ctx, "dead", 10)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	assert.Equal(t, "b", dls[0].ID)
	assert.Equal(t, 1, f.Depth(t, b.QueueName("dead")+".dlq"))
	_, err = b.Discard(ctx, "never-declared", []string{"a"})
	assert.ErrorIs(t, err, ErrUnknownRoute)
}

// Diagnose: a consumed route answers the probe (round trip, the consumer's counters, the queue
// depths as browsed); a route nobody consumes fails the round trip; a route never declared in
// the scope says so. The probe is never handled nor counted.
func TestSTOMPDiagnose(t *testing.T) {
	t.Parallel()
	b, _, ctx := stompEnv(t)
	served, idle := Route{Name: "served"}, Route{Name: "idle"}
	require.NoError(t, b.Declare(ctx, served, idle))
	var handled atomic.Int32
	consumeIn(t, ctx, b, "served", 1, func(context.Context, *Message) Result {
		handled.Add(1)
		return Ack()
	})
	require.NoError(t, b.Publish(ctx, "idle", Outgoing{ID: "waiting"}))
	ds := b.Diagnose(ctx, []Route{served, idle, {Name: "ghost"}}, time.Second)
	require.Len(t, ds, 3)
	assert.True(t, ds[0].OK, "%v", ds[0])
	assert.Positive(t, ds[0].RoundTrip)
	assert.Equal(t, processName, ds[0].AnsweredBy)
	assert.False(t, ds[1].OK)
	assert.Equal(t, 1, ds[1].Messages)
	assert.Contains(t, ds[1].String(), "no consumer answered")
	assert.False(t, ds[2].OK)
	assert.Contains(t, ds[2].String(), "not declared")
	assert.Zero(t, handled.Load(), "a probe is not the handler's")
	assert.Zero(t, b.Counters("served").Acknowledged, "nor counted")
}

// The three supersession checks, one at a time: a delivery is stale once its connection is not
// the consumer's current one, once its subscription was replaced, and once a newer delivery of
// the same SEND arrived (a reissue) — but not because another copy of the same message (same id,
// another SEND) arrived.
func TestSTOMPStaleChecks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := stomp.Dial(ctx, stompTestURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx) //nolint:errcheck // the test's own
	c := &stompLink{c: &consumer{top: &topology{route: "r"}}, latest: map[string]uint64{}}
	sub := &stompStream{l: c, conn: conn, inst: 1}
	c.curGen.Store(conn.Generation())
	c.curInst.Store(1)
	msg := func(send string) *stomp.Message {
		return &stomp.Message{Generation: conn.Generation(), Headers: []stomp.Header{
			{Key: hdrSTOMPID, Value: "m"}, {Key: hdrSTOMPSend, Value: send},
		}}
	}
	first := sub.delivery(msg("send-1"))
	require.False(t, first.stale())
	other := sub.delivery(msg("send-2"))
	assert.False(t, first.stale(), "another copy of the message is not a reissue")
	again := sub.delivery(msg("send-1"))
	assert.True(t, first.stale(), "reissued: the newer delivery settles it")
	assert.False(t, again.stale())

	c.curInst.Store(2)
	assert.True(t, other.stale(), "the consumer was replaced")
	c.curInst.Store(1)
	c.curGen.Store(conn.Generation() + 1)
	assert.True(t, other.stale(), "the connection changed")
	c.curGen.Store(conn.Generation())
	require.False(t, other.stale())
	require.NoError(t, conn.Close(ctx))
	assert.True(t, other.stale(), "the connection ended")
}

func manyHeaders(n int) map[string]any {
	h := make(map[string]any, n)
	for i := range n {
		h[fmt.Sprintf("h%02d", i)] = "v"
	}
	return h
}

// stomp+ssl:// with the TLS parameters of an amqps:// URL: the broker (a TLS proxy in front of
// ActiveMQ, with a certificate of a dev CA) is verified against cacertfile; the port publishes
// and consumes through it. TLS parameters on a plain stomp:// URL, and an unknown parameter, are
// refused without the password.
func TestSTOMPOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := devca.Ensure(dir)
	require.NoError(t, err)
	src, err := tlsx.NewSource(tlsx.Files{CertFile: devca.CertFile(dir, devca.Public), KeyFile: devca.KeyFile(dir, devca.Public), CAFile: devca.CAFile(dir)})
	require.NoError(t, err)
	l, err := tls.Listen("tcp", "127.0.0.1:0", tlsx.ServerConfig(src))
	require.NoError(t, err)
	target, err := url.Parse(stompTestURL(t))
	require.NoError(t, err)
	var conns sync.WaitGroup
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target.Host)
			if err != nil {
				_ = c.Close()
				continue
			}
			conns.Add(2)
			for _, p := range [][2]net.Conn{{c, b}, {b, c}} {
				go func() {
					defer conns.Done()
					_, _ = io.Copy(p[0], p[1])
					_ = p[0].Close()
					_ = p[1].Close()
				}()
			}
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		conns.Wait()
	})
	_, port, _ := net.SplitHostPort(l.Addr().String())
	u := "stomp+ssl://" + target.User.String() + "@localhost:" + port + "?cacertfile=" + url.QueryEscape(devca.CAFile(dir))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	b, err := dial(ctx, Config{URL: u, Scope: "mqtest-" + uuid.NewString()[:8]}, ProviderSTOMP)
	require.NoError(t, err)
	require.NoError(t, b.Declare(ctx, Route{Name: "tls"}))
	got := make(chan string, 1)
	stop := consumeIn(t, ctx, b, "tls", 1, func(_ context.Context, m *Message) Result {
		got <- m.ID
		return Ack()
	})
	require.NoError(t, b.Publish(ctx, "tls", Outgoing{ID: "over-tls"}))
	select {
	case id := <-got:
		assert.Equal(t, "over-tls", id)
	case <-time.After(waitFor):
		t.Fatal("nothing came through TLS")
	}
	stop()
	require.NoError(t, b.DeleteRoutes(ctx, Route{Name: "tls"}))
	require.NoError(t, b.Close())

	_, err = dial(ctx, Config{URL: "stomp+ssl://u:secret@localhost:" + port, Scope: "x"}, ProviderSTOMP)
	assert.Error(t, err, "the system's roots do not hold the dev CA")
	for _, bad := range []string{
		"stomp://u:secret@127.0.0.1:1?cacertfile=/ca.pem",
		"stomp+ssl://u:secret@127.0.0.1:1?certfile=/c.pem",
		"stomp://u:secret@127.0.0.1:1?vhost=x",
	} {
		_, err = dial(ctx, Config{URL: bad, Scope: "x"}, ProviderSTOMP)
		assert.Error(t, err, bad)
		assert.NotContains(t, err.Error(), "secret")
	}
}

// Drain on STOMP: once the consumer stops taking, no delivery starts a handler; the handlers in
// flight go on with a live context and their ACKs land; the deliveries the consumer held go back
// to the broker when it disconnects, and another consumer gets every one of them.
func TestSTOMPDrainLetsInFlightHandlersFinish(t *testing.T) {
	t.Parallel()
	const n, concurrency = 10, 2
	b, f, ctx := stompEnv(t)
	require.NoError(t, b.Declare(ctx, Route{Name: "drain", Prefetch: n}))
	msgs := make([]Outgoing, n)
	for i := range msgs {
		msgs[i] = Outgoing{ID: fmt.Sprintf("d-%02d", i)}
	}
	for i, err := range b.PublishAll(ctx, "drain", msgs) {
		require.NoError(t, err, "message %d", i)
	}
	started := make(chan string, n)
	release := make(chan struct{})
	finished := make(chan error, n)
	takeCtx, take := context.WithCancel(ctx)
	workCtx, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(takeCtx, "drain", concurrency, func(hctx context.Context, m *Message) Result {
			started <- m.ID
			select {
			case <-release:
			case <-hctx.Done():
			}
			finished <- hctx.Err()
			if hctx.Err() != nil {
				return Result{}
			}
			return Ack()
		}, Drain(workCtx, 5*time.Second))
	}()
	for range concurrency {
		select {
		case <-started:
		case <-time.After(waitFor):
			t.Fatal("handlers never started")
		}
	}
	take()
	close(release)
	for range concurrency {
		assert.NoError(t, <-finished, "the handlers' context outlives the consumer's")
	}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("Consume did not return")
	}
	assert.Empty(t, started, "no handler started after the consumer stopped taking")
	assert.EqualValues(t, concurrency, b.Counters("drain").Acknowledged)

	got := make(chan string, n)
	consumeIn(t, ctx, b, "drain", 1, func(_ context.Context, m *Message) Result {
		got <- m.ID
		return Ack()
	})
	require.Eventually(t, func() bool { return b.Counters("drain").Acknowledged == n }, waitFor, 10*time.Millisecond,
		"every held delivery came back to the next consumer")
	assert.Zero(t, b.Counters("drain").Lost+b.Counters("drain").Superseded)
	assert.Equal(t, 0, f.Depth(t, b.QueueName("drain")))
}

// A message that is never settled (here: always the zero Result) does not loop for ever. Each
// requeue is a copy the port sends, so no broker counts them (RabbitMQ's x-delivery-limit does
// for its provider): the copy carries the count, and at deliveryLimit the delivery is
// dead-lettered, saying why, as RabbitMQ's broker does.
func TestSTOMPRequeueLimitBackstop(t *testing.T) {
	t.Parallel()
	b, _, ctx := stompEnv(t)
	require.NoError(t, b.Declare(ctx, Route{Name: "poison"}))
	var calls atomic.Int32
	consumeIn(t, ctx, b, "poison", 1, func(context.Context, *Message) Result {
		calls.Add(1)
		return Result{}
	})
	require.NoError(t, b.Publish(ctx, "poison", Outgoing{ID: "m-poison", Headers: map[string]any{"k": "v"}}))

	var dls []DeadLetter
	require.Eventually(t, func() bool {
		var err error
		dls, err = b.DeadLetters(ctx, "poison", 10)
		return err == nil && len(dls) == 1
	}, waitFor, 20*time.Millisecond, "the requeued message was never dead-lettered")
	dl := dls[0]
	assert.Equal(t, "m-poison", dl.ID)
	assert.Equal(t, "delivery_limit", dl.Reason)
	assert.Equal(t, b.QueueName("poison"), dl.SourceQueue)
	assert.Equal(t, "v", dl.Headers["k"], "the application's headers kept")
	assert.EqualValues(t, deliveryLimit+1, calls.Load(), "first delivery plus %d requeues", deliveryLimit)
	// The dead letter is listed once its copy's RECEIPT is in; the worker counts it after it has
	// acknowledged the original, a moment later.
	require.Eventually(t, func() bool { return b.Counters("poison").DeadLettered == 1 }, waitFor, 5*time.Millisecond,
		"the dead letter counted")
	c := b.Counters("poison")
	assert.EqualValues(t, deliveryLimit, c.Requeued)
	assert.EqualValues(t, 1, c.DeadLettered)
	assert.Zero(t, c.Rejected, "the broker-side backstop is no Reject")
	assert.Zero(t, c.Lost)
}

// A subscription recycled while another worker is acknowledging one of its deliveries: that
// worker passed the supersession checks, so its ACK must reach the broker before the UNSUBSCRIBE.
// An ACK written after it names a delivery the broker no longer holds on that subscription:
// ActiveMQ answers with an ERROR and closes the connection, voiding every other acknowledgement in
// flight on it, and the acknowledged message comes back to be handled again.
func TestSTOMPRecycleWaitsForAcknowledgementsInFlight(t *testing.T) {
	t.Parallel()
	b, f, ctx := stompEnv(t)
	require.NoError(t, b.Declare(ctx, Route{Name: "recycled"}))
	var mu sync.Mutex
	calls := map[string]int{}
	aSettling, resubscribed, retiring := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var subscriptions atomic.Int32
	var onceRetiring sync.Once
	hooks := b.cfg.hooks
	faultSettling := hooks.settling
	hooks.subscribed = func(string, uint64) {
		if subscriptions.Add(1) == 2 {
			close(resubscribed)
		}
	}
	hooks.retiring = func() { onceRetiring.Do(func() { close(retiring) }) }
	var onceA sync.Once
	hooks.settling = func(m *Message, behind func()) {
		faultSettling(m, behind)
		if m.ID != "a" {
			return
		}
		onceA.Do(func() {
			close(aSettling)
			// Held past its checks until the owner recycles the subscription: until it waits for
			// this ACK, or (without that wait) until it has subscribed again.
			select {
			case <-retiring:
			case <-resubscribed:
			case <-ctx.Done():
			}
		})
	}
	// Published before the consumer starts: b's withheld copy freezes the publishing connection.
	for _, err := range b.PublishAll(ctx, "recycled", []Outgoing{{ID: "a"}, {ID: "b"}}) {
		require.NoError(t, err)
	}
	consumeIn(t, ctx, b, "recycled", 2, func(_ context.Context, m *Message) Result {
		mu.Lock()
		calls[m.ID]++
		n := calls[m.ID]
		mu.Unlock()
		if m.ID == "b" && n == 1 {
			select {
			case <-aSettling:
			case <-ctx.Done():
			}
			f.WithholdCopyConfirm(t) // b's requeue copy: the subscription is recycled to return b
			return Result{}
		}
		return Ack()
	})
	// b comes back (the original, returned by the recycle, and its copy, which reached the broker
	// though its RECEIPT was withheld) and every delivery but b's first is acknowledged. a came
	// back with b, had its ACK gone after the UNSUBSCRIBE.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls["b"] >= 2 && int(b.Counters("recycled").Acknowledged) == calls["a"]+calls["b"]-1
	}, waitFor, 10*time.Millisecond, "b came back through the recycled subscription and was acknowledged")
	assert.Zero(t, f.Depth(t, b.QueueName("recycled")))
	c := b.Counters("recycled")
	assert.Zero(t, c.Lost, "a's ACK was refused")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, calls["a"], "a was acknowledged once and not handled again")
}

// A dead letter another producer sent (no mq_id) is listed under the broker's message-id, and
// Discard and Redrive take it by that id, as they take the port's by theirs.
func TestSTOMPForeignDeadLetterByItsListedID(t *testing.T) {
	t.Parallel()
	b, f, ctx := stompEnv(t)
	require.NoError(t, b.Declare(ctx, Route{Name: "foreign"}))
	conn, err := stomp.Dial(ctx, stompTestURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx) //nolint:errcheck // the test's own
	dlq := b.QueueName("foreign") + ".dlq"
	for _, body := range []string{"redrive me", "discard me"} {
		require.NoError(t, conn.Send(ctx, dest(dlq), []stomp.Header{{Key: "persistent", Value: "true"}}, []byte(body)))
	}
	dls, err := b.DeadLetters(ctx, "foreign", 10)
	require.NoError(t, err)
	require.Len(t, dls, 2)
	require.NotEmpty(t, dls[0].ID)

	n, err := b.Discard(ctx, "foreign", []string{dls[1].ID})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "discarded by the id DeadLetters listed")
	n, err = b.Redrive(ctx, "foreign", []string{dls[0].ID})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "redriven by the id DeadLetters listed")
	assert.Zero(t, f.Depth(t, dlq))
	got := make(chan *Message, 1)
	consumeIn(t, ctx, b, "foreign", 1, func(_ context.Context, m *Message) Result {
		got <- m
		return Ack()
	})
	select {
	case m := <-got:
		assert.Equal(t, "redrive me", string(m.Body))
		assert.Equal(t, dls[0].ID, m.ID, "the redriven copy keeps the listed id")
	case <-ctx.Done():
		t.Fatal("the redriven message never came")
	}
}
