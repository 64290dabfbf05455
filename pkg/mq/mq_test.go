package mq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait on the broker; generous because tests share a 2-CPU machine.
const waitFor = 15 * time.Second

func testURL() string {
	if u := os.Getenv("INTEGRATIONS_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// bundle is what a test needs: a Broker on its own scope, and a plain connection of its own to
// look at queues the way an operator would.
type bundle struct {
	b   *port
	r   *rabbitDriver // b's driver
	ch  *amqp.Channel
	ctx context.Context
	// lastDeclare is when the Broker last declared queues (unix nanoseconds).
	lastDeclare *atomic.Int64
}

// dlxWorkerGrace is how long a test leaves an at-least-once quorum queue alone after declaring it
// before deleting it. RabbitMQ 3.10.8 starts a DLX worker per such queue, and a queue deleted
// while that worker is still checking out crashes it twice and shuts down dead-lettering for the
// whole broker (see deadLetterVia). Nothing the broker tells a client says the worker is ready, so
// this is a wait for a broker-internal event, not for anything of ours; the checkout takes
// milliseconds, this allows for a loaded machine.
const dlxWorkerGrace = time.Second

// dlxGrace waits, if need be, until dlxWorkerGrace has passed since the Broker last declared
// queues. Call it before deleting queues of the port.
func (tb *bundle) dlxGrace() {
	if wait := time.Until(time.Unix(0, tb.lastDeclare.Load()).Add(dlxWorkerGrace)); wait > 0 {
		time.Sleep(wait)
	}
}

// setup dials a Broker on a random scope and deletes every queue the test declared at the end.
func setup(t *testing.T, timeScale float64) *bundle {
	t.Helper()
	return setupWith(t, Config{TimeScale: timeScale})
}

// setupWith is setup with a Config to start from (hooks, logger); URL and Scope are filled in.
func setupWith(t *testing.T, cfg Config) *bundle {
	t.Helper()
	// A bound for the whole test, generous: the fault tests run rabbitmqctl, an Erlang VM started
	// per call, which took over 20 s for two calls on a two-core machine at a load average of 15.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
		if os.Getenv("MQ_TEST_LOG") != "" {
			cfg.Logger = zap.Must(zap.NewDevelopment())
		}
	}
	cfg.URL = testURL()
	cfg.Scope = "mqtest-" + uuid.NewString()[:8]
	lastDeclare := &atomic.Int64{}
	if cfg.hooks == nil {
		cfg.hooks = &testHooks{}
	}
	cfg.hooks.declared = func() { lastDeclare.Store(time.Now().UnixNano()) }
	b, err := dial(ctx, cfg, ProviderRabbitMQ)
	require.NoError(t, err)
	tb := &bundle{b: b, r: b.drv.(*rabbitDriver), ctx: ctx, lastDeclare: lastDeclare}
	conn, err := amqp.Dial(testURL())
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	tb.ch = ch
	// Cleanups run last-registered first: the Broker closes (consumers stop), then its queues go.
	t.Cleanup(func() {
		defer conn.Close()
		tb.dlxGrace()
		for _, top := range b.declared() {
			for _, q := range top.queues() {
				_, err := ch.QueueDelete(q, false, false, false)
				assert.NoError(t, err, "delete queue %s", q)
			}
		}
	})
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	return tb
}

// consume runs Consume in the background until the test ends (or stop).
func (tb *bundle) consume(t *testing.T, route string, concurrency int, h Handler) (stop func()) {
	t.Helper()
	return consumeIn(t, tb.ctx, tb.b, route, concurrency, h)
}

// consumeIn runs b's Consume in the background; the returned stop cancels it and checks it
// returned nil promptly. stop is also registered as a cleanup, and is idempotent.
func consumeIn(t *testing.T, ctx context.Context, b Broker, route string, concurrency int, h Handler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Consume(ctx, route, concurrency, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(t, err, "Consume")
			case <-time.After(waitFor):
				t.Error("Consume did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// depth is the number of ready messages in a queue.
func (tb *bundle) depth(t *testing.T, queue string) int {
	t.Helper()
	q, err := tb.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// seen records what a handler observed, for assertions after the fact.
type seen struct {
	Attempt     int
	At          time.Time
	Redelivered bool
	Headers     map[string]any
	ID          string
}

func see(m *Message) seen {
	return seen{Attempt: m.Attempt, At: time.Now(), Redelivered: m.Redelivered, Headers: m.Headers, ID: m.ID}
}

// receive waits for one value from ch.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// TestShortDelayNotHeldBehindLong: message A waits in the 2 s holding queue when message B enters
// the 200 ms one. With one queue and per-message TTLs, B would wait for A (RabbitMQ only expires
// at the head of a queue); with a holding queue per level B comes back first.
func TestShortDelayNotHeldBehindLong(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "levels", Retry: RetryPolicy{
		Delays: []time.Duration{200 * time.Millisecond, 2 * time.Second},
	}}))
	type obs struct {
		id      string
		attempt int
		at      time.Time
	}
	got := make(chan obs, 8)
	aInLong := make(chan struct{})
	tb.consume(t, "levels", 2, func(_ context.Context, m *Message) Result {
		got <- obs{m.ID, m.Attempt, time.Now()}
		switch {
		case m.ID == "A" && m.Attempt == 2:
			defer close(aInLong) // the test publishes B once A's copy is on its way to the 2 s queue
			return Fail(errors.New("A again"))
		case m.ID == "A" && m.Attempt < 3, m.ID == "B" && m.Attempt < 2:
			return Fail(errors.New("not yet"))
		}
		return Ack()
	})
	require.NoError(t, tb.b.Publish(tb.ctx, "levels", Outgoing{ID: "A"}))
	receive(t, aInLong, "A at attempt 2")
	require.Eventually(t, func() bool { return tb.b.Counters("levels").Retried == 2 }, waitFor, 5*time.Millisecond)
	require.NoError(t, tb.b.Publish(tb.ctx, "levels", Outgoing{ID: "B"}))

	var order []string
	var bDone, aDone time.Time
	for bDone.IsZero() || aDone.IsZero() {
		o := receive(t, got, "attempts")
		order = append(order, fmt.Sprintf("%s%d", o.id, o.attempt))
		switch {
		case o.id == "B" && o.attempt == 2:
			bDone = o.at
		case o.id == "A" && o.attempt == 3:
			aDone = o.at
		}
	}
	assert.True(t, bDone.Before(aDone), "B's short retry came back after A's long one: %v", order)
	assert.Equal(t, []string{"A1", "A2", "B1", "B2", "A3"}, order)
}

func TestPublishAllThousand(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "bulk", Prefetch: 100}))
	const n = 1000
	msgs := make([]Outgoing, n)
	for i := range msgs {
		msgs[i] = Outgoing{ID: fmt.Sprintf("bulk-%04d", i), Body: []byte{byte(i)}}
	}
	var mu sync.Mutex
	count := map[string]int{}
	stop := tb.consume(t, "bulk", 8, func(_ context.Context, m *Message) Result {
		mu.Lock()
		count[m.ID]++
		mu.Unlock()
		return Ack()
	})
	for i, err := range tb.b.PublishAll(tb.ctx, "bulk", msgs) {
		require.NoError(t, err, "message %d", i)
	}
	require.Eventually(t, func() bool { return tb.b.Counters("bulk").Acknowledged == n }, waitFor, 20*time.Millisecond)
	stop()
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, count, n)
	for id, c := range count {
		assert.Equal(t, 1, c, "message %s handled %d times", id, c)
	}
	assert.Equal(t, Counters{Published: n, Confirmed: n, Acknowledged: n}, tb.b.Counters("bulk"))
	assert.Equal(t, 0, tb.depth(t, tb.b.QueueName("bulk")))
}

func TestValidateName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"executions", true},
		{"integrations.executions.retry.60000ms", true},
		{"a-b_c:d.e", true},
		{"bad name!", false},
		{"", false},
		{"slash/not", false},
		{strings.Repeat("a", 256), false},
	} {
		err := ValidateName(tc.name)
		if tc.ok {
			assert.NoError(t, err, tc.name)
			continue
		}
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, ErrInvalidName)
		if tc.name != "" && len(tc.name) < 100 {
			assert.Contains(t, err.Error(), tc.name, "the error names the bad name")
		}
	}
	// Route names are checked before any broker traffic.
	_, err := plan("scope", 1, Route{Name: "bad name!"})
	assert.ErrorContains(t, err, "bad name!")
	_, err = plan("scope", 1, Route{Name: "x.dlq"})
	assert.ErrorIs(t, err, ErrInvalidName)
	_, err = plan("scope", 1, Route{Name: "x", Retry: RetryPolicy{MaxAttempts: 3}})
	assert.Error(t, err, "retries without a delay")
	_, err = Dial(context.Background(), Config{URL: testURL(), Scope: "bad scope"})
	assert.ErrorIs(t, err, ErrInvalidName)
}

func TestPlanNamesAndScale(t *testing.T) {
	t.Parallel()
	top, err := plan("integrations", 0.5, Route{Name: "executions", Retry: RetryPolicy{
		Delays: []time.Duration{time.Second, 2 * time.Minute, time.Second}, MaxAttempts: 6,
	}})
	require.NoError(t, err)
	assert.Equal(t, "integrations.executions", top.queue)
	assert.Equal(t, "integrations.executions.dlq", top.dlq)
	assert.Equal(t, defaultPrefetch, top.prefetch)
	assert.Equal(t, []string{
		"integrations.executions", "integrations.executions.dlq",
		"integrations.executions.retry.500ms", "integrations.executions.retry.60000ms",
	}, top.queues())
	for attempt, want := range map[int]string{1: "retry.500ms", 2: "retry.60000ms", 3: "retry.500ms", 5: "retry.500ms"} {
		assert.True(t, strings.HasSuffix(top.retryQueue(attempt), want), "attempt %d → %s", attempt, top.retryQueue(attempt))
	}
}

// TestReconnect cuts both connections under a running consumer that holds a delivery: the held
// delivery's Ack is superseded (never sent on the new channel), the broker redelivers it on the
// new subscription, and publishing redials by itself.
func TestReconnect(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "flappy"}))
	holding := make(chan struct{})
	release := make(chan struct{})
	got := make(chan seen, 4)
	var calls atomic.Int32
	tb.consume(t, "flappy", 2, func(_ context.Context, m *Message) Result {
		if calls.Add(1) == 1 {
			close(holding)
			<-release // hold the delivery while its channel dies
		}
		got <- see(m)
		return Ack()
	})
	require.NoError(t, tb.b.Publish(tb.ctx, "flappy", Outgoing{ID: "m-held"}))
	receive(t, holding, "handler holding the delivery")

	tb.r.conSem <- struct{}{}
	require.NoError(t, tb.r.con.Close())
	<-tb.r.conSem
	tb.r.pubSem <- struct{}{}
	require.NoError(t, tb.r.pub.conn.Close())
	<-tb.r.pubSem

	redelivered := receive(t, got, "redelivery on the new subscription")
	assert.Equal(t, "m-held", redelivered.ID)
	assert.True(t, redelivered.Redelivered)
	close(release)
	receive(t, got, "the held handler finishing")
	require.Eventually(t, func() bool {
		c := tb.b.Counters("flappy")
		return c.Superseded == 1 && c.Acknowledged == 1
	}, waitFor, 10*time.Millisecond)

	require.NoError(t, tb.b.Publish(tb.ctx, "flappy", Outgoing{ID: "m-after"}))
	s := receive(t, got, "delivery after reconnect")
	assert.Equal(t, "m-after", s.ID)
	require.Eventually(t, func() bool { return tb.b.Counters("flappy").Acknowledged == 2 }, waitFor, 10*time.Millisecond)
	assert.Zero(t, tb.b.Counters("flappy").Lost)
}

func TestPublishUnroutable(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	// Never declared: no queue by that name, so the broker returns the mandatory publish.
	err := tb.b.Publish(tb.ctx, "nowhere", Outgoing{ID: "m-lost"})
	require.ErrorIs(t, err, ErrUnroutable)
	assert.Contains(t, err.Error(), "m-lost")
	assert.Equal(t, Counters{Published: 1, Returned: 1}, tb.b.Counters("nowhere"))

	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "somewhere"}))
	errs := tb.b.PublishAll(tb.ctx, "somewhere", []Outgoing{{ID: "a"}, {ID: "b"}})
	assert.Equal(t, []error{nil, nil}, errs)
	err = tb.b.Consume(tb.ctx, "nowhere", 1, func(context.Context, *Message) Result { return Ack() })
	assert.ErrorIs(t, err, ErrUnknownRoute)
}

func TestDialUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Dial(ctx, Config{URL: "amqp://guest:secret@127.0.0.1:1/", Scope: "x"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mq: connect")
	assert.NotContains(t, err.Error(), "secret", "the URL's password must not leak into errors")
}

// TestQueueDeletedUnderConsumer: the broker cancels a consumer whose queue is deleted; the consumer
// declares the route's topology again and resubscribes.
func TestQueueDeletedUnderConsumer(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "fragile"}))
	got := make(chan seen, 4)
	tb.consume(t, "fragile", 1, func(_ context.Context, m *Message) Result {
		got <- see(m)
		return Ack()
	})
	require.NoError(t, tb.b.Publish(tb.ctx, "fragile", Outgoing{ID: "before"}))
	assert.Equal(t, "before", receive(t, got, "first delivery").ID)

	tb.dlxGrace()
	_, err := tb.ch.QueueDelete(tb.b.QueueName("fragile"), false, false, false)
	require.NoError(t, err)
	// Until the consumer has declared it again, a publish is returned as unroutable.
	require.Eventually(t, func() bool {
		return tb.b.Publish(tb.ctx, "fragile", Outgoing{ID: "after"}) == nil
	}, waitFor, 20*time.Millisecond)
	assert.Equal(t, "after", receive(t, got, "delivery after the queue came back").ID)
}

func TestMetricsShared(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cfg := Config{URL: testURL(), Scope: "mqtest-" + uuid.NewString()[:8], Registerer: reg}
	b1, err := dial(ctx, cfg, ProviderRabbitMQ)
	require.NoError(t, err)
	defer b1.Close()
	// A second Broker in the same process shares the registered counter vec instead of failing.
	b2, err := dial(ctx, cfg, ProviderRabbitMQ)
	require.NoError(t, err)
	defer b2.Close()

	require.ErrorIs(t, b1.Publish(ctx, "nowhere", Outgoing{}), ErrUnroutable)
	require.ErrorIs(t, b2.Publish(ctx, "nowhere", Outgoing{}), ErrUnroutable)
	assert.InDelta(t, 2, testutil.ToFloat64(b1.metric.WithLabelValues("nowhere", "returned")), 0)
	assert.InDelta(t, 2, testutil.ToFloat64(b1.metric.WithLabelValues("nowhere", "published")), 0)
	assert.EqualValues(t, 1, b1.Counters("nowhere").Returned, "Counters are per Broker")
	n, err := testutil.GatherAndCount(reg, "integrations_mq_messages_total")
	require.NoError(t, err)
	assert.Positive(t, n)
}

// TestPublishWaitsWhileBlocked: a publish does not write into a connection the broker blocked; it
// waits for the unblock or gives up with its context.
func TestPublishWaitsWhileBlocked(t *testing.T) {
	t.Parallel()
	p := &publisher{}
	require.NoError(t, p.waitUnblocked(context.Background()))
	p.setBlocked(true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, p.waitUnblocked(ctx), context.DeadlineExceeded)

	done := make(chan error, 1)
	go func() { done <- p.waitUnblocked(context.Background()) }()
	p.setBlocked(false)
	assert.NoError(t, receive(t, done, "unblocked publish"))
}

// TestDeliveryLimitBackstop: a message that is never settled (here: always the zero Result) does
// not loop forever. The work queue's x-delivery-limit makes the broker dead-letter it into the DLQ,
// where x-death, not x-dead-reason, says why.
func TestDeliveryLimitBackstop(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	require.NoError(t, tb.b.Declare(tb.ctx, Route{Name: "poison"}))
	var calls atomic.Int32
	tb.consume(t, "poison", 1, func(context.Context, *Message) Result {
		calls.Add(1)
		return Result{}
	})
	require.NoError(t, tb.b.Publish(tb.ctx, "poison", Outgoing{ID: "m-poison"}))

	var dls []DeadLetter
	require.Eventually(t, func() bool {
		var err error
		dls, err = tb.b.DeadLetters(tb.ctx, "poison", 10)
		require.NoError(t, err)
		return len(dls) == 1
	}, waitFor, 20*time.Millisecond)
	dl := dls[0]
	assert.Equal(t, "m-poison", dl.ID)
	assert.Equal(t, "delivery_limit", dl.Reason, "the broker's x-first-death-reason")
	assert.NotContains(t, dl.Headers, hdrDeadReason)
	assert.Equal(t, tb.b.QueueName("poison"), dl.SourceQueue)
	assert.WithinDuration(t, time.Now(), dl.DeadAt, time.Minute, "from x-death")
	assert.Empty(t, dl.LastError)
	assert.EqualValues(t, deliveryLimit+1, calls.Load(), "first delivery plus %d redeliveries", deliveryLimit)
}

// TestRetryHoldingQueuePerDistinctDelay: the last retry delay repeats through one holding queue
// (the contract suite's RetryExhaustedDeadLetters runs this route on the broker).
func TestRetryHoldingQueuePerDistinctDelay(t *testing.T) {
	t.Parallel()
	top, err := plan("s", 1, Route{Name: "doomed", Retry: RetryPolicy{Delays: []time.Duration{50 * time.Millisecond}, MaxAttempts: 3}})
	require.NoError(t, err)
	assert.Equal(t, []string{"s.doomed.retry.50ms"}, top.queues()[2:])
	assert.Equal(t, "s.doomed.retry.50ms", top.retryQueue(1))
	assert.Equal(t, "s.doomed.retry.50ms", top.retryQueue(2))
}

// TestDeadLettersOfAMissingDLQ: RabbitMQ answers a DLQ that does not exist with 404, which
// DeadLetters passes on (the contract suite asserts only that it is an error).
func TestDeadLettersOfAMissingDLQ(t *testing.T) {
	t.Parallel()
	tb := setup(t, 1)
	_, err := tb.b.DeadLetters(tb.ctx, "never-declared", 10)
	assert.ErrorContains(t, err, "NOT_FOUND")
}
