// Package mqtest is the message port's contract suite: one set of behaviour tests that every
// provider of [mq.Broker] runs against a real broker, as Watermill runs one suite per pub/sub.
// A provider's own test calls [Run] with a [Provider]; the suite skips nothing, so a provider
// passes it whole or fails it.
//
// What it holds a provider to: the handler's return settles the delivery (Ack acks, the zero
// Result, a panic and a cancelled handler return it to the broker); Fail retries with
// x-delivery-attempt incremented after the policy's delays and dead-letters past the budget
// (retry_exhausted), Reject dead-letters at once (rejected), with the reason, the handler's error,
// the attempt and the times in headers; a copy that is not confirmed (a publisher confirm, a STOMP
// RECEIPT) never lets its original be acknowledged; listing dead letters loses and reorders
// nothing, and Redrive moves the chosen ones back with a fresh budget; a connection closed
// mid-flight loses nothing and settles nothing twice; a publish whose confirm is withheld is an
// error; a settlement withheld because its connection went away is counted superseded, one the
// broker refused on a live connection lost; and Defer waits in the route's delay levels (or, below
// the smallest, in the worker) without spending an attempt.
//
// Both providers' runs are in pkg/mq (contract_test.go): RabbitMQ's TestContract and the STOMP
// provider's TestContractSTOMP on ActiveMQ, with one set of Faults (export_test.go) on the sockets
// under either's connections — freezing reads withholds confirms and RECEIPTs, a refused
// settlement is one of a delivery settled behind the port's back (RabbitMQ's 406, ActiveMQ's
// ERROR frame).
package mqtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/mq"
)

// WaitFor bounds every wait on the broker; generous because the tests share a 2-CPU machine.
const WaitFor = 15 * time.Second

// Provider is one provider of the port, as the suite runs it.
type Provider struct {
	// Name names the provider in the subtests' names ("rabbitmq", "stomp").
	Name string
	// New returns one test's Broker on a scope no other test uses, with opts applied and its
	// Faults wired in, and registers with t the Broker's close and the deletion of the scope's
	// queues. It is called from parallel tests.
	New func(t *testing.T, opts Options) Env
}

// Options are what a test asks of its Broker.
type Options struct {
	TimeScale float64 // Config.TimeScale; 0 means 1
}

// Env is one test's Broker and the hooks into its provider.
type Env struct {
	Broker mq.Broker
	Faults Faults
}

// Faults are the hooks a provider-neutral test needs to cause what no call on the port can: each
// acts on the Env's own Broker only. A provider implements them on its own connections (test
// hooks of its package); they must not be approximations that skip: a provider that cannot cut a
// connection cannot show it survives one.
type Faults interface {
	// Depth is the number of messages ready in a queue (a scoped name, e.g. the route's
	// QueueName or QueueName+".dlq"), seen from outside the port, as an operator sees it.
	Depth(t *testing.T, queue string) int
	// CutConsuming severs the consuming connection now, as a network fault would (no word from
	// the broker). Deliveries in flight on it are redelivered by the broker.
	CutConsuming(t *testing.T)
	// WithholdCopyConfirm arms the next retry, defer or dead-letter copy: it is written, its
	// confirm (receipt) never reaches the port, and its publishing connection dies after the write.
	WithholdCopyConfirm(t *testing.T)
	// WithholdPublishConfirms makes the publishing connection withhold every confirm (receipt)
	// from now on; cut severs it, after which the port must connect again by itself.
	WithholdPublishConfirms(t *testing.T) (cut func())
	// TearDownOnNextSettle makes the next handler settlement (ack or requeue) fail to be written
	// because its connection is being torn down (a broken pipe), and that connection close.
	TearDownOnNextSettle(t *testing.T)
	// RefuseNextSettle makes the broker refuse the next handler settlement on a live connection,
	// as it refuses a settlement of a delivery it no longer holds (the port's own fault): the
	// delivery is settled behind the port's back just before.
	RefuseNextSettle(t *testing.T)
}

// Run runs the contract suite against p; every test runs in parallel with a Broker of its own.
func Run(t *testing.T, p Provider) {
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Ack", testAck},
		{"ZeroResultAndPanicRedeliver", testZeroResultAndPanicRedeliver},
		{"CancelledHandlerRedelivers", testCancelledHandlerRedelivers},
		{"RetryThenSuccess", testRetryThenSuccess},
		{"RetryExhaustedDeadLetters", testRetryExhaustedDeadLetters},
		{"RejectDeadLetters", testRejectDeadLetters},
		{"UnconfirmedCopyLeavesOriginal", testUnconfirmedCopyLeavesOriginal},
		{"WithheldPublishConfirmIsAnError", testWithheldPublishConfirmIsAnError},
		{"DeadLettersListAndRedrive", testDeadLettersListAndRedrive},
		{"ConnectionClosedMidFlight", testConnectionClosedMidFlight},
		{"SettleOnATornDownConnectionIsSuperseded", testSettleOnATornDownConnectionIsSuperseded},
		{"RefusedSettleIsLost", testRefusedSettleIsLost},
		{"DeferSpendsNoAttempt", testDeferSpendsNoAttempt},
		{"DeferBelowTheSmallestLevelHoldsTheDelivery", testDeferBelowTheSmallestLevelHoldsTheDelivery},
		{"DeferWithoutLevelsDeadLetters", testDeferWithoutLevelsDeadLetters},
	} {
		t.Run(p.Name+"/"+tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 4*WaitFor)
			t.Cleanup(cancel)
			e := p.New(t, Options{TimeScale: 1})
			tc.run(t, &env{Env: e, b: e.Broker, ctx: ctx})
		})
	}
}

// env is a test's bundle: the Broker, its faults, a context bounding the test.
type env struct {
	Env
	b   mq.Broker
	ctx context.Context
}

// consume runs Consume in the background; the returned stop cancels it and checks it returned nil
// promptly. stop is also registered as a cleanup, and is idempotent.
func (e *env) consume(t *testing.T, route string, concurrency int, h mq.Handler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- e.b.Consume(ctx, route, concurrency, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(t, err, "Consume")
			case <-time.After(WaitFor):
				t.Error("Consume did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// counted waits until the route's counters satisfy ok.
func (e *env) counted(t *testing.T, route string, ok func(mq.Counters) bool, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, func() bool { return ok(e.b.Counters(route)) }, WaitFor, 10*time.Millisecond, msgAndArgs...)
}

// The port's headers, as the suite reads them (any provider decodes its own into these values).
const (
	hdrAttempt      = "x-delivery-attempt"
	hdrLastError    = "x-last-error"
	hdrFirstFailure = "x-first-failure-at"
	hdrLastFailure  = "x-last-failure-at"
	hdrDeadReason   = "x-dead-reason"
	hdrSourceQueue  = "x-source-queue"
	hdrDeadAt       = "x-dead-at"
	hdrRedriven     = "x-redriven"
)

// seen records what a handler observed, for assertions after the fact.
type seen struct {
	Attempt     int
	At          time.Time
	Redelivered bool
	Headers     map[string]any
	ID          string
	Body        []byte
}

func see(m *mq.Message) seen {
	return seen{Attempt: m.Attempt, At: time.Now(), Redelivered: m.Redelivered, Headers: m.Headers, ID: m.ID, Body: m.Body}
}

// receive waits for one value from ch.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(WaitFor):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func ids(dls []mq.DeadLetter) []string {
	out := make([]string, len(dls))
	for i, d := range dls {
		out[i] = d.ID
	}
	return out
}

// testAck: a handler's Ack acknowledges the delivery: the queue is empty once the consumer stops
// (anything unacked would be back), and the account is one publish, one confirm, one ack.
func testAck(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "work"}))
	got := make(chan seen, 1)
	stop := e.consume(t, "work", 1, func(_ context.Context, m *mq.Message) mq.Result {
		got <- see(m)
		return mq.Ack()
	})
	require.NoError(t, e.b.Publish(e.ctx, "work", mq.Outgoing{ID: "m-1", Body: []byte("hello"), Headers: map[string]any{"k": "v"}}))

	s := receive(t, got, "delivery")
	assert.Equal(t, "m-1", s.ID)
	assert.Equal(t, []byte("hello"), s.Body)
	assert.Equal(t, 1, s.Attempt)
	assert.Equal(t, "v", s.Headers["k"])
	assert.NotContains(t, s.Headers, "x-mq-publish-tag", "the port's internal headers are not the handler's")
	e.counted(t, "work", func(c mq.Counters) bool { return c.Acknowledged == 1 })
	stop()
	assert.Equal(t, 0, e.Faults.Depth(t, e.b.QueueName("work")))
	assert.Equal(t, mq.Counters{Published: 1, Confirmed: 1, Acknowledged: 1}, e.b.Counters("work"))
}

// testZeroResultAndPanicRedeliver: the zero Result never acks and a panic is recovered; both
// return the delivery to the broker, which redelivers it at the same attempt (a requeue is not a
// retry).
func testZeroResultAndPanicRedeliver(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "shaky"}))
	got := make(chan seen, 3)
	var calls atomic.Int32
	e.consume(t, "shaky", 1, func(_ context.Context, m *mq.Message) mq.Result {
		got <- see(m)
		switch calls.Add(1) {
		case 1:
			return mq.Result{} // forgot to decide
		case 2:
			panic("handler bug")
		default:
			return mq.Ack()
		}
	})
	require.NoError(t, e.b.Publish(e.ctx, "shaky", mq.Outgoing{ID: "m-shaky"}))

	first := receive(t, got, "first delivery")
	second := receive(t, got, "redelivery after zero Result")
	third := receive(t, got, "redelivery after panic")
	assert.False(t, first.Redelivered)
	for _, s := range []seen{second, third} {
		assert.Equal(t, "m-shaky", s.ID)
		assert.True(t, s.Redelivered)
		assert.Equal(t, 1, s.Attempt, "a requeue is not a retry")
	}
	e.counted(t, "shaky", func(c mq.Counters) bool { return c.Acknowledged == 1 })
	c := e.b.Counters("shaky")
	assert.EqualValues(t, 2, c.Requeued)
	assert.EqualValues(t, 1, c.Panicked)
	assert.Zero(t, c.Lost+c.Retried+c.DeadLettered)
}

// testCancelledHandlerRedelivers: a handler cut off by its consumer's cancellation returns Fail;
// that is not a retry: the delivery goes back to the broker and the next consumer gets it at the
// same attempt.
func testCancelledHandlerRedelivers(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "slow", Retry: mq.RetryPolicy{Delays: []time.Duration{time.Second}}}))
	started := make(chan struct{})
	stop1 := e.consume(t, "slow", 1, func(ctx context.Context, m *mq.Message) mq.Result {
		close(started)
		<-ctx.Done()
		return mq.Fail(ctx.Err()) // a cut-off handler's Fail is not a retry
	})
	require.NoError(t, e.b.Publish(e.ctx, "slow", mq.Outgoing{ID: "m-slow"}))
	receive(t, started, "handler start")
	stop1() // asserts Consume returned nil promptly

	got := make(chan seen, 1)
	e.consume(t, "slow", 1, func(_ context.Context, m *mq.Message) mq.Result {
		got <- see(m)
		return mq.Ack()
	})
	s := receive(t, got, "redelivery to the second consumer")
	assert.Equal(t, "m-slow", s.ID)
	assert.Equal(t, 1, s.Attempt)
	assert.True(t, s.Redelivered)
	e.counted(t, "slow", func(c mq.Counters) bool { return c.Acknowledged == 1 })
	c := e.b.Counters("slow")
	assert.EqualValues(t, 1, c.Requeued)
	assert.Zero(t, c.Retried+c.DeadLettered+c.Lost)
}

// testRetryThenSuccess: Fail retries with x-delivery-attempt incremented, the error and the
// failure times in headers, each attempt no earlier than the policy's delay for it.
func testRetryThenSuccess(t *testing.T, e *env) {
	delays := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "flaky", Retry: mq.RetryPolicy{Delays: delays}}))
	got := make(chan seen, 3)
	failAt := make(chan time.Time, 3)
	e.consume(t, "flaky", 2, func(_ context.Context, m *mq.Message) mq.Result {
		got <- see(m)
		if m.Attempt < 3 {
			failAt <- time.Now()
			return mq.Fail(fmt.Errorf("attempt %d: database unreachable", m.Attempt))
		}
		return mq.Ack()
	})
	require.NoError(t, e.b.Publish(e.ctx, "flaky", mq.Outgoing{ID: "m-retry"}))

	var attempts []seen
	for i := range 3 {
		attempts = append(attempts, receive(t, got, fmt.Sprintf("attempt %d", i+1)))
	}
	for i, s := range attempts {
		assert.Equal(t, i+1, s.Attempt)
		assert.Equal(t, "m-retry", s.ID)
	}
	assert.NotContains(t, attempts[0].Headers, hdrAttempt)
	assert.EqualValues(t, 2, attempts[1].Headers[hdrAttempt])
	assert.EqualValues(t, 3, attempts[2].Headers[hdrAttempt])
	assert.Equal(t, "attempt 2: database unreachable", attempts[2].Headers[hdrLastError])
	assert.Contains(t, attempts[2].Headers, hdrFirstFailure)
	assert.Contains(t, attempts[2].Headers, hdrLastFailure)
	// Lower bounds only: the policy's delay is the least a retry waits. Brokers stamp and expire
	// messages in whole milliseconds, so allow that much against our clock.
	const brokerClockGrain = 2 * time.Millisecond
	fail1, fail2 := <-failAt, <-failAt
	gap1, gap2 := attempts[1].At.Sub(fail1), attempts[2].At.Sub(fail2)
	t.Logf("retry gaps: %v (delay %v), %v (delay %v)", gap1, delays[0], gap2, delays[1])
	assert.GreaterOrEqual(t, gap1, delays[0]-brokerClockGrain, "gap before attempt 2")
	assert.GreaterOrEqual(t, gap2, delays[1]-brokerClockGrain, "gap before attempt 3")

	e.counted(t, "flaky", func(c mq.Counters) bool { return c.Acknowledged == 1 })
	c := e.b.Counters("flaky")
	assert.EqualValues(t, 2, c.Retried)
	assert.Zero(t, c.DeadLettered+c.Lost+c.Superseded+c.Requeued)
}

// testRetryExhaustedDeadLetters: past MaxAttempts (the last delay repeating) the message is
// dead-lettered with reason retry_exhausted, the last error, the attempts, its source queue and
// the times; the copy carries the port's headers, not the broker's.
func testRetryExhaustedDeadLetters(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "doomed", Retry: mq.RetryPolicy{
		Delays: []time.Duration{50 * time.Millisecond}, MaxAttempts: 3, // the last delay repeats
	}}))
	var calls atomic.Int32
	e.consume(t, "doomed", 1, func(_ context.Context, m *mq.Message) mq.Result {
		calls.Add(1)
		return mq.Fail(errors.New("still broken"))
	})
	require.NoError(t, e.b.Publish(e.ctx, "doomed", mq.Outgoing{ID: "m-doomed", Body: []byte("payload")}))

	e.counted(t, "doomed", func(c mq.Counters) bool { return c.DeadLettered == 1 })
	dls, err := e.b.DeadLetters(e.ctx, "doomed", 10)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	dl := dls[0]
	assert.Equal(t, "m-doomed", dl.ID)
	assert.Equal(t, []byte("payload"), dl.Body)
	assert.Equal(t, mq.DeadReasonExhausted, dl.Reason)
	assert.Equal(t, mq.DeadReasonExhausted, dl.Headers[hdrDeadReason])
	assert.Equal(t, "still broken", dl.LastError)
	assert.Equal(t, 3, dl.Attempts)
	assert.EqualValues(t, 3, dl.Headers[hdrAttempt])
	assert.Equal(t, e.b.QueueName("doomed"), dl.SourceQueue)
	deadAt, ok := dl.Headers[hdrDeadAt].(string)
	require.True(t, ok, "x-dead-at is a string")
	_, err = time.Parse(time.RFC3339, deadAt)
	assert.NoError(t, err)
	assert.WithinDuration(t, time.Now(), dl.DeadAt, time.Minute)
	assert.False(t, dl.FirstFailureAt.After(dl.LastFailureAt), "first failure before the last")
	assert.NotContains(t, dl.Headers, "x-death", "our copies carry our headers, not the broker's")

	assert.EqualValues(t, 3, calls.Load())
	c := e.b.Counters("doomed")
	assert.EqualValues(t, 2, c.Retried)
	assert.Zero(t, c.Rejected)
}

// testRejectDeadLetters: Reject dead-letters at once, whatever the retry budget, with reason
// rejected; it is counted both DeadLettered and Rejected, and never retried.
func testRejectDeadLetters(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "strict", Retry: mq.RetryPolicy{
		Delays: []time.Duration{time.Second}, MaxAttempts: 5,
	}}))
	var calls atomic.Int32
	stop := e.consume(t, "strict", 1, func(_ context.Context, m *mq.Message) mq.Result {
		calls.Add(1)
		return mq.Reject(errors.New("malformed request"))
	})
	require.NoError(t, e.b.Publish(e.ctx, "strict", mq.Outgoing{ID: "m-bad"}))

	e.counted(t, "strict", func(c mq.Counters) bool { return c.Rejected == 1 })
	stop()
	dls, err := e.b.DeadLetters(e.ctx, "strict", 10)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	assert.Equal(t, "m-bad", dls[0].ID)
	assert.Equal(t, "rejected", dls[0].Reason)
	assert.Equal(t, "malformed request", dls[0].LastError)
	assert.Equal(t, 1, dls[0].Attempts)
	assert.EqualValues(t, 1, dls[0].Headers[hdrAttempt])
	assert.Equal(t, e.b.QueueName("strict"), dls[0].Headers[hdrSourceQueue])
	assert.EqualValues(t, 1, calls.Load())
	c := e.b.Counters("strict")
	assert.EqualValues(t, 1, c.DeadLettered)
	assert.Zero(t, c.Retried)
	assert.Equal(t, 0, e.Faults.Depth(t, e.b.QueueName("strict")))
}

// testUnconfirmedCopyLeavesOriginal: the publishing connection dies after a retry copy was
// written and before its confirm arrived. The original is not acked: it is returned to the broker
// and delivered again (at the same attempt), never lost. A duplicate of it may also come back
// from the retry, if the broker took the copy: that is the documented price.
func testUnconfirmedCopyLeavesOriginal(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "unconfirmed", Retry: mq.RetryPolicy{Delays: []time.Duration{50 * time.Millisecond}}}))
	got := make(chan seen, 8)
	var calls atomic.Int32
	published := make(chan struct{})
	e.consume(t, "unconfirmed", 1, func(ctx context.Context, m *mq.Message) mq.Result {
		got <- see(m)
		if calls.Add(1) == 1 {
			// The withheld confirm withholds every confirm on the publishing connection: let the
			// test's own publish be confirmed first.
			select {
			case <-published:
			case <-ctx.Done():
				return mq.Result{}
			}
			e.Faults.WithholdCopyConfirm(t)
			return mq.Fail(errors.New("transient"))
		}
		return mq.Ack()
	})
	require.NoError(t, e.b.Publish(e.ctx, "unconfirmed", mq.Outgoing{ID: "m-orig"}))
	close(published)

	first := receive(t, got, "first delivery")
	assert.False(t, first.Redelivered)
	for {
		s := receive(t, got, "the original, delivered again")
		assert.Equal(t, "m-orig", s.ID)
		if s.Attempt == 1 && s.Redelivered {
			break
		}
		t.Logf("the unconfirmed copy came back first (attempt %d): a duplicate, as documented", s.Attempt)
	}
	e.counted(t, "unconfirmed", func(c mq.Counters) bool { return c.Requeued == 1 })
	c := e.b.Counters("unconfirmed")
	assert.Zero(t, c.Retried, "the retry was never confirmed, so it is not counted")
	assert.Zero(t, c.Lost+c.Superseded+c.DeadLettered)

	// The port connects again by itself.
	require.NoError(t, e.b.Publish(e.ctx, "unconfirmed", mq.Outgoing{ID: "m-after"}))
	for s := receive(t, got, "delivery after the publisher reconnected"); s.ID != "m-after"; s = receive(t, got, "m-after") {
		t.Logf("duplicate of %s at attempt %d", s.ID, s.Attempt)
	}
}

// testWithheldPublishConfirmIsAnError: a publish the broker never confirms is an error — not
// counted confirmed — within the caller's deadline; once the connection is cut the port connects
// again and publishes, and the withheld message, if the broker took it, arrives as a duplicate at
// most.
func testWithheldPublishConfirmIsAnError(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "withheld"}))
	cut := e.Faults.WithholdPublishConfirms(t)
	ctx, cancel := context.WithTimeout(e.ctx, 500*time.Millisecond)
	err := e.b.Publish(ctx, "withheld", mq.Outgoing{ID: "m-withheld"})
	cancel()
	require.Error(t, err, "a publish without its confirm is not a success")
	cut()
	c := e.b.Counters("withheld")
	assert.EqualValues(t, 1, c.Published)
	assert.Zero(t, c.Confirmed)

	// A publish racing the port's discovery of the cut may fail too (it is written into the dead
	// connection): the caller's retry is what the port promises to make succeed.
	require.Eventually(t, func() bool {
		return e.b.Publish(e.ctx, "withheld", mq.Outgoing{ID: "m-after"}) == nil
	}, WaitFor, 10*time.Millisecond, "the port connects again")
	got := make(chan string, 8)
	e.consume(t, "withheld", 1, func(_ context.Context, m *mq.Message) mq.Result {
		got <- m.ID
		return mq.Ack()
	})
	for id := receive(t, got, "m-after"); id != "m-after"; id = receive(t, got, "m-after") {
		assert.Equal(t, "m-withheld", id, "only the withheld message may arrive besides")
	}
	assert.EqualValues(t, 1, e.b.Counters("withheld").Confirmed)
}

// testDeadLettersListAndRedrive: listing the same DLQ 25 times (the head of it, and all of it)
// neither loses nor reorders a message; Redrive moves exactly the selected ones, with a fresh
// budget, and leaves the rest in place and in order; Redrive of all empties the DLQ.
func testDeadLettersListAndRedrive(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "dead"}))
	const n = 30
	msgs := make([]mq.Outgoing, n)
	want := make([]string, n)
	for i := range msgs {
		want[i] = fmt.Sprintf("dl-%02d", i)
		msgs[i] = mq.Outgoing{ID: want[i], Body: []byte(want[i]), Headers: map[string]any{"tenant": "acme"}}
	}
	// One handler, so the DLQ fills in publish order.
	stop := e.consume(t, "dead", 1, func(_ context.Context, m *mq.Message) mq.Result {
		return mq.Reject(fmt.Errorf("bad %s", m.ID))
	})
	for i, err := range e.b.PublishAll(e.ctx, "dead", msgs) {
		require.NoError(t, err, "message %d", i)
	}
	e.counted(t, "dead", func(c mq.Counters) bool { return c.DeadLettered == n })
	stop()
	dlq := e.b.QueueName("dead") + ".dlq"

	for i := range 25 {
		limit := 10
		if i%5 == 4 {
			limit = 100 // the whole DLQ now and then
		}
		dls, err := e.b.DeadLetters(e.ctx, "dead", limit)
		require.NoError(t, err)
		require.Equal(t, want[:min(limit, n)], ids(dls), "listing %d", i+1)
	}
	// The listings above already saw all n, in order. The depth is eventual: a broker may answer
	// a count before it has taken back what a listing returned.
	require.Eventually(t, func() bool { return e.Faults.Depth(t, dlq) == n }, WaitFor, 5*time.Millisecond, "nothing lost by listing")

	dls, err := e.b.DeadLetters(e.ctx, "dead", 1)
	require.NoError(t, err)
	dl := dls[0]
	assert.Equal(t, []byte("dl-00"), dl.Body)
	assert.Equal(t, "rejected", dl.Reason)
	assert.Equal(t, "bad dl-00", dl.LastError)
	assert.Equal(t, 1, dl.Attempts)
	assert.Equal(t, e.b.QueueName("dead"), dl.SourceQueue)
	assert.WithinDuration(t, time.Now(), dl.DeadAt, time.Minute)
	assert.Equal(t, dl.DeadAt, dl.FirstFailureAt, "rejected on its first delivery")
	assert.Equal(t, dl.DeadAt, dl.LastFailureAt)
	assert.Equal(t, "acme", dl.Headers["tenant"])
	assert.NotContains(t, dl.Headers, "x-mq-publish-tag")
	_, err = e.b.DeadLetters(e.ctx, "dead", 0)
	assert.Error(t, err)

	// Redrive three of them (and one id that is not there).
	moved, err := e.b.Redrive(e.ctx, "dead", []string{"dl-03", "dl-17", "dl-29", "no-such-id"})
	require.NoError(t, err)
	assert.Equal(t, 3, moved)
	rest := make([]string, 0, n-3)
	for _, id := range want {
		if id != "dl-03" && id != "dl-17" && id != "dl-29" {
			rest = append(rest, id)
		}
	}
	dls, err = e.b.DeadLetters(e.ctx, "dead", 100)
	require.NoError(t, err)
	assert.Equal(t, rest, ids(dls), "the others stay, in order")
	assert.EqualValues(t, 3, e.b.Counters("dead").Redriven)
	require.Eventually(t, func() bool { return e.Faults.Depth(t, e.b.QueueName("dead")) == 3 }, WaitFor, 5*time.Millisecond)

	got := make(chan seen, n)
	stop = e.consume(t, "dead", 1, func(_ context.Context, m *mq.Message) mq.Result {
		got <- see(m)
		return mq.Ack()
	})
	for _, id := range []string{"dl-03", "dl-17", "dl-29"} {
		s := receive(t, got, id)
		assert.Equal(t, id, s.ID)
		assert.Equal(t, []byte(id), s.Body)
		assert.Equal(t, "acme", s.Headers["tenant"], "application headers survive")
		for _, k := range []string{hdrAttempt, hdrLastError, hdrFirstFailure, hdrLastFailure, hdrDeadReason, hdrSourceQueue, hdrDeadAt} {
			assert.NotContains(t, s.Headers, k, "a fresh budget: %s stripped", k)
		}
		assert.Equal(t, 1, s.Attempt)
		assert.EqualValues(t, 1, s.Headers[hdrRedriven], "the redrive is counted")
	}
	stop()

	moved, err = e.b.Redrive(e.ctx, "dead", nil)
	require.NoError(t, err)
	assert.Equal(t, n-3, moved)
	assert.Equal(t, 0, e.Faults.Depth(t, dlq))
	require.Eventually(t, func() bool { return e.Faults.Depth(t, e.b.QueueName("dead")) == n-3 }, WaitFor, 5*time.Millisecond)

	_, err = e.b.DeadLetters(e.ctx, "never-declared", 10)
	assert.Error(t, err, "the DLQ of a route never declared")
}

// testConnectionClosedMidFlight: the consuming connection is cut while eight handlers are
// mid-flight and more deliveries wait in the port. The port connects and subscribes again by
// itself; the results of the dead connection's deliveries are superseded, never settled on the new
// connection; the broker redelivers everything; every message is acked once and the queue ends
// empty.
func testConnectionClosedMidFlight(t *testing.T, e *env) {
	const (
		n           = 40
		concurrency = 8
		prefetch    = 16
	)
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "cut", Prefetch: prefetch}))
	msgs := make([]mq.Outgoing, n)
	for i := range msgs {
		msgs[i] = mq.Outgoing{ID: fmt.Sprintf("k-%02d", i)}
	}
	for i, err := range e.b.PublishAll(e.ctx, "cut", msgs) {
		require.NoError(t, err, "message %d", i)
	}
	var mu sync.Mutex
	completions := map[string]int{}
	started := make(chan struct{}, 4*n)
	release := make(chan struct{})
	stop := e.consume(t, "cut", concurrency, func(ctx context.Context, m *mq.Message) mq.Result {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return mq.Result{}
		}
		mu.Lock()
		completions[m.ID]++
		mu.Unlock()
		return mq.Ack()
	})
	for i := range concurrency {
		receive(t, started, fmt.Sprintf("handler %d mid-flight", i+1))
	}
	e.Faults.CutConsuming(t)
	close(release) // the mid-flight handlers now return Ack for deliveries of the dead connection

	e.counted(t, "cut", func(c mq.Counters) bool { return c.Acknowledged == n }, "every message acked")
	stop()
	assert.Equal(t, 0, e.Faults.Depth(t, e.b.QueueName("cut")), "nothing left unacked")
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, completions, n)
	total := 0
	for _, c := range completions {
		total += c
	}
	// Once more for each mid-flight handler; and, since the cut is not announced, once more for
	// each delivery the port handed to a freed worker before it noticed (at most a prefetch).
	assert.GreaterOrEqual(t, total, n+concurrency, "every message handled once more for each mid-flight handler")
	assert.LessOrEqual(t, total, n+prefetch, "at most a prefetch worth of deliveries was handled on the dead connection")
	c := e.b.Counters("cut")
	assert.EqualValues(t, n, c.Acknowledged, "acked once each")
	assert.GreaterOrEqual(t, c.Superseded, uint64(concurrency), "the mid-flight results")
	assert.LessOrEqual(t, c.Superseded, uint64(prefetch), "at most a prefetch worth of deliveries was on the dead connection")
	assert.Zero(t, c.Lost+c.Requeued+c.Retried+c.DeadLettered, "counters: %+v", c)
}

// testSettleOnATornDownConnectionIsSuperseded: the consuming connection dies while a handler's
// Ack is written. That settlement is counted superseded, not lost; the broker redelivers the
// message on the next subscription and it is acked there.
func testSettleOnATornDownConnectionIsSuperseded(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "torn"}))
	require.NoError(t, e.b.Publish(e.ctx, "torn", mq.Outgoing{ID: "m-torn"}))
	var calls atomic.Int32
	e.consume(t, "torn", 1, func(_ context.Context, m *mq.Message) mq.Result {
		if calls.Add(1) == 1 {
			e.Faults.TearDownOnNextSettle(t)
		}
		return mq.Ack()
	})
	e.counted(t, "torn", func(c mq.Counters) bool { return c.Acknowledged == 1 }, "redelivered on the next subscription and acked there")
	c := e.b.Counters("torn")
	assert.EqualValues(t, 1, c.Superseded, "the ack on the dying connection")
	assert.Zero(t, c.Lost, "no loss happened")
	assert.EqualValues(t, 2, calls.Load())
}

// testRefusedSettleIsLost: a settlement the broker refuses on a live connection — a delivery it
// no longer holds, which only a fault of the port's own can cause — is counted lost, not hidden
// as superseded: the account shows the bug. The port subscribes again and goes on.
func testRefusedSettleIsLost(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "refused"}))
	got := make(chan string, 4)
	var calls atomic.Int32
	e.consume(t, "refused", 1, func(_ context.Context, m *mq.Message) mq.Result {
		if calls.Add(1) == 1 {
			e.Faults.RefuseNextSettle(t)
		}
		got <- m.ID
		return mq.Ack()
	})
	require.NoError(t, e.b.Publish(e.ctx, "refused", mq.Outgoing{ID: "m-refused"}))
	assert.Equal(t, "m-refused", receive(t, got, "m-refused"))
	e.counted(t, "refused", func(c mq.Counters) bool { return c.Lost == 1 }, "the refused settlement")
	assert.Zero(t, e.b.Counters("refused").Superseded)
	// Whether the refused settlement also counts Acknowledged is the provider's: RabbitMQ's acks
	// are not answered, so it was counted when written; a STOMP ACK waits for its RECEIPT.
	acked := e.b.Counters("refused").Acknowledged
	assert.LessOrEqual(t, acked, uint64(1))

	require.NoError(t, e.b.Publish(e.ctx, "refused", mq.Outgoing{ID: "m-next"}))
	assert.Equal(t, "m-next", receive(t, got, "m-next after the refusal"))
	e.counted(t, "refused", func(c mq.Counters) bool { return c.Acknowledged == acked+1 }, "m-next acked")
	assert.EqualValues(t, 1, e.b.Counters("refused").Lost)
}

// dueHeader carries a message's due time (Unix nanoseconds) for the Defer tests.
const dueHeader = "due"

// arrival is when a message reached its handler on time.
type arrival struct {
	id      string
	attempt int
	at      time.Time
}

// deferUntilDue is a handler that defers a message until its due time, then acks it; failFirst
// fails every first attempt once.
func deferUntilDue(got chan<- arrival, calls *atomic.Int32, failFirst bool) mq.Handler {
	return func(_ context.Context, m *mq.Message) mq.Result {
		calls.Add(1)
		if failFirst && m.Attempt == 1 {
			return mq.Fail(errors.New("database unreachable"))
		}
		ns, _ := strconv.ParseInt(fmt.Sprint(m.Headers[dueHeader]), 10, 64)
		if early := time.Until(time.Unix(0, ns)); early > 0 {
			return mq.Defer(early)
		}
		got <- arrival{id: m.ID, attempt: m.Attempt, at: time.Now()}
		return mq.Ack()
	}
}

// testDeferSpendsNoAttempt: a message that failed once (attempt 2) and then arrives 900 ms early
// is deferred through the 500 ms and 100 ms levels, then waited out in the worker for the rest:
// it is handled no earlier than its due time, still at attempt 2, never retried again.
func testDeferSpendsNoAttempt(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "early",
		Retry:       mq.RetryPolicy{Delays: []time.Duration{10 * time.Millisecond}, MaxAttempts: 2},
		DelayLevels: []time.Duration{100 * time.Millisecond, 500 * time.Millisecond}}))
	got := make(chan arrival, 1)
	var calls atomic.Int32
	e.consume(t, "early", 2, deferUntilDue(got, &calls, true))

	due := time.Now().Add(900 * time.Millisecond)
	require.NoError(t, e.b.Publish(e.ctx, "early", mq.Outgoing{ID: "m-early",
		Headers: map[string]any{dueHeader: strconv.FormatInt(due.UnixNano(), 10)}}))
	a := receive(t, got, "the message at its due time")
	t.Logf("handled %v after its due time, after %d handler calls", a.at.Sub(due), calls.Load())
	assert.False(t, a.at.Before(due), "handled %v before its due time", due.Sub(a.at))
	assert.Equal(t, 2, a.attempt, "deferrals spend no attempt (MaxAttempts 2 would have dead-lettered)")
	require.Eventually(t, func() bool { return e.b.Counters("early").Acknowledged == 1 }, WaitFor, 10*time.Millisecond)
	c := e.b.Counters("early")
	assert.EqualValues(t, 1, c.Retried)
	// 900 ms early, less the 10 ms retry: one 500 ms level, then 100 ms ones until under 100 ms.
	assert.GreaterOrEqual(t, c.Deferred, uint64(2))
	assert.LessOrEqual(t, c.Deferred, uint64(5))
	assert.Zero(t, c.DeadLettered+c.Requeued+c.Lost+c.Superseded)
	assert.Zero(t, e.Faults.Depth(t, e.b.QueueName("early")+".dlq"))
}

// testDeferBelowTheSmallestLevelHoldsTheDelivery: 400 ms early on a route whose smallest level is
// 1 s: no copy, the worker waits out the rest and asks the handler again. (400 ms, not less: the
// message must still be early when it is delivered, on a loaded machine under -race — at 40 ms
// a slow delivery arrived after its due time and was handled at once.) Shutdown during such a wait
// returns the delivery to the broker.
func testDeferBelowTheSmallestLevelHoldsTheDelivery(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "early", DelayLevels: []time.Duration{time.Second}}))
	got := make(chan arrival, 1)
	var calls atomic.Int32
	stop := e.consume(t, "early", 1, deferUntilDue(got, &calls, false))

	due := time.Now().Add(400 * time.Millisecond)
	require.NoError(t, e.b.Publish(e.ctx, "early", mq.Outgoing{ID: "m-soon",
		Headers: map[string]any{dueHeader: strconv.FormatInt(due.UnixNano(), 10)}}))
	a := receive(t, got, "the message at its due time")
	assert.False(t, a.at.Before(due), "handled %v before its due time", due.Sub(a.at))
	require.Eventually(t, func() bool { return e.b.Counters("early").Acknowledged == 1 }, WaitFor, 10*time.Millisecond)
	assert.EqualValues(t, 2, calls.Load(), "deferred once, in the worker, then handled")
	assert.Zero(t, e.b.Counters("early").Deferred, "no copy went to a delay level")

	// 900 ms early, under the 1 s level: held; shutdown hands it back to the broker.
	due = time.Now().Add(900 * time.Millisecond)
	require.NoError(t, e.b.Publish(e.ctx, "early", mq.Outgoing{ID: "m-held",
		Headers: map[string]any{dueHeader: strconv.FormatInt(due.UnixNano(), 10)}}))
	require.Eventually(t, func() bool { return calls.Load() == 3 }, WaitFor, 5*time.Millisecond)
	stop()
	assert.EqualValues(t, 1, e.b.Counters("early").Requeued)
	require.Eventually(t, func() bool { return e.Faults.Depth(t, e.b.QueueName("early")) == 1 }, WaitFor, 10*time.Millisecond,
		"the held message is back in the work queue")
}

// testDeferWithoutLevelsDeadLetters: Defer on a route that has no delay levels is a programming
// error; a requeue would loop hot until the delivery limit, so the message is dead-lettered,
// saying why, after one delivery.
func testDeferWithoutLevelsDeadLetters(t *testing.T, e *env) {
	require.NoError(t, e.b.Declare(e.ctx, mq.Route{Name: "plain"}))
	var calls atomic.Int32
	e.consume(t, "plain", 1, func(_ context.Context, m *mq.Message) mq.Result {
		calls.Add(1)
		return mq.Defer(time.Minute)
	})
	require.NoError(t, e.b.Publish(e.ctx, "plain", mq.Outgoing{ID: "m"}))
	require.Eventually(t, func() bool { return e.b.Counters("plain").DeadLettered == 1 }, WaitFor, 10*time.Millisecond)
	dead, err := e.b.DeadLetters(e.ctx, "plain", 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	assert.Equal(t, "m", dead[0].ID)
	assert.Contains(t, dead[0].LastError, "without delay levels")
	assert.EqualValues(t, 1, calls.Load(), "no hot loop")
	assert.Zero(t, e.b.Counters("plain").Requeued)
}
