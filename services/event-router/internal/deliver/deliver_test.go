package deliver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/event-router/internal/relay"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

func amqpURL() string {
	if u := os.Getenv("INTEGRATIONS_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// appB is a second application, beside dbtest.TestApp.
const appB = "app-b"

// options are a test's delivery settings; zero fields take short defaults.
type options struct {
	delays    []time.Duration
	timeout   time.Duration
	perApp    int
	timeScale float64
	// route replaces the test's short events route (e.g. with routes.Events itself), and
	// brokerScale is the broker's time scale (default 1).
	route       *mq.Route
	brokerScale float64
	// deliverURL, when set, is the database URL of the deliverer's own pool (e.g. through a
	// proxy that can cut it); the relay and the test keep the schema's pool.
	deliverURL string
	// relay replaces the relay's options; DeadLetters is set to the test's broker when
	// deadLetters is.
	relay       *relay.Options
	deadLetters bool
	// schema is the test's schema when it needs it before setup (default: a fresh one).
	schema *dbtest.Schema
	// strict refuses private consumer addresses (AllowPrivate false), and resolver resolves
	// consumer names (default: the system's).
	strict   bool
	resolver *net.Resolver
	// brokerOnly turns the relay's in-process hand-off off: every event goes through the broker,
	// as a replica whose queue is full would send it (default: on, as in production, with a queue
	// of local events, 32 when zero).
	brokerOnly bool
	local      int
}

// bundle is a running deliverer and relay on a schema and a broker scope of the test's own.
type bundle struct {
	s      *dbtest.Schema
	box    *secret.Box
	broker mq.Broker
	route  mq.Route
	relay  *relay.Relay
	local  *Local
}

// setup starts the relay and the deliverer (16 workers, as in production) against the events
// route on a scope of the test's own, with short delay levels.
func setup(t *testing.T, o options) *bundle {
	t.Helper()
	if o.delays == nil {
		o.delays = []time.Duration{100 * time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond,
			250 * time.Millisecond, 300 * time.Millisecond}
	}
	if o.timeout == 0 {
		o.timeout = 5 * time.Second
	}
	if o.perApp == 0 {
		o.perApp = 4
	}
	ctx := context.Background()
	s := o.schema
	if s == nil {
		s = dbtest.NewSchema(t)
	}
	s.ApplyCatalog(t, dbtest.TestCatalog)
	hash := sha256.Sum256([]byte(appB))
	_, err := s.Pool.Exec(ctx, `INSERT INTO applications (id, name, api_key_hash) VALUES ($1, 'B', $2)`, appB, hash[:])
	require.NoError(t, err)

	key := make([]byte, 32)
	_, _ = rand.Read(key)
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", base64.StdEncoding.EncodeToString(key))
	require.NoError(t, err)

	route := mq.Route{
		Name:        routes.Events.Name, // what the relay publishes to
		Retry:       mq.RetryPolicy{Delays: []time.Duration{50 * time.Millisecond}, MaxAttempts: 3},
		DelayLevels: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond},
	}
	if o.route != nil {
		route = *o.route
	}
	if o.brokerScale == 0 {
		o.brokerScale = 1
	}
	b, err := mq.Dial(ctx, mq.Config{URL: amqpURL(), Scope: "eventroutertest-" + uuid.NewString()[:8], TimeScale: o.brokerScale})
	require.NoError(t, err)
	require.NoError(t, b.Declare(ctx, route))
	declared := time.Now()
	t.Cleanup(func() {
		// Never delete at-least-once queues right after declaring them (see pkg/mq deadLetterVia).
		time.Sleep(time.Until(declared.Add(time.Second)))
		assert.NoError(t, b.DeleteRoutes(context.Background(), route))
		assert.NoError(t, b.Close())
	})

	st := store.New(s.Pool)
	deliverStore := st
	if o.deliverURL != "" {
		pool, err := db.Open(ctx, o.deliverURL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		deliverStore = store.New(pool)
	}
	d := New(deliverStore, box, Config{Delays: o.delays, Timeout: o.timeout, AllowPrivate: !o.strict, PerApp: o.perApp,
		Busy: b.DelayLevels(route.Name)[0], TimeScale: o.timeScale, Resolver: o.resolver}, zap.NewNop())
	relayOpts := relay.Options{Interval: 50 * time.Millisecond, StaleAfter: time.Hour}
	if o.relay != nil {
		relayOpts = *o.relay
	}
	if o.deadLetters {
		relayOpts.DeadLetters = b
	}
	var local *Local
	if !o.brokerOnly {
		if o.local == 0 {
			o.local = 32
		}
		local = d.Local(b, route.Name, o.local)
		relayOpts.Handoff = local
	}
	rel := relay.New(st, b, zap.NewNop(), relayOpts)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if local != nil {
		wg.Go(func() { assert.NoError(t, local.Run(runCtx, runCtx, 16)) })
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		assert.NoError(t, b.Consume(runCtx, route.Name, 16, d.Handle))
	}()
	go func() {
		defer wg.Done()
		assert.NoError(t, rel.Run(runCtx))
	}()
	t.Cleanup(func() {
		stop()
		wg.Wait()
		assert.NoError(t, d.Close())
	})
	return &bundle{s: s, box: box, broker: b, route: route, relay: rel, local: local}
}

// setConsumer registers app's consumer with a fresh signing secret, and returns the secret.
// rotating puts app's consumer in a rotation's overlap for the hour to come: a new previous
// secret, which it answers, signs beside the current one.
func (b *bundle) rotating(t *testing.T, app string) string {
	t.Helper()
	previous, err := webhooks.NewSecret()
	require.NoError(t, err)
	sealed, err := b.box.Seal([]byte(previous))
	require.NoError(t, err)
	_, err = b.s.Pool.Exec(context.Background(), `
		UPDATE applications SET signing_secret_prev_enc = $2, signing_secret_prev_until = now() + interval '1 hour' WHERE id = $1`,
		app, sealed)
	require.NoError(t, err)
	return previous
}

func (b *bundle) setConsumer(t *testing.T, app, kind, endpoint string) string {
	t.Helper()
	signing, err := webhooks.NewSecret()
	require.NoError(t, err)
	sealed, err := b.box.Seal([]byte(signing))
	require.NoError(t, err)
	_, err = b.s.Pool.Exec(context.Background(), `
		UPDATE applications SET consumer_kind = $2, consumer_endpoint = $3, signing_secret_enc = $4 WHERE id = $1`,
		app, kind, endpoint, sealed)
	require.NoError(t, err)
	return signing
}

// newEvent inserts a completion event of a new execution of app, unrelayed, as settlement does;
// the relay's scheduled pass publishes its notice.
func (b *bundle) newEvent(t *testing.T, app string) string {
	t.Helper()
	exec := b.s.InsertExecution(t, dbtest.Execution{Application: app})
	id := uuid.NewString()
	payload, err := json.Marshal(map[string]any{
		"id": id, "type": "execution.completed", "timestamp": time.Now().UTC().Format(time.RFC3339Nano),
		"data": map[string]any{"execution_id": exec, "status": "succeeded", "result": map[string]any{"echo": "hi"}, "sequence": 1},
	})
	require.NoError(t, err)
	_, err = b.s.Pool.Exec(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload) VALUES ($1, $2, $3, 'execution.completed', $4)`,
		id, app, exec, payload)
	require.NoError(t, err)
	return id
}

// notify publishes copies of an event's notice straight to the work queue, as a duplicate relay
// would.
func (b *bundle) notify(t *testing.T, app, id string, copies int) {
	t.Helper()
	body, err := proto.Marshal(&queuev1.EventNotice{EventId: id, ApplicationId: app})
	require.NoError(t, err)
	msgs := make([]mq.Outgoing, copies)
	for i := range msgs {
		msgs[i] = mq.Outgoing{ID: id, Body: body}
	}
	for _, err := range b.broker.PublishAll(context.Background(), b.route.Name, msgs) {
		require.NoError(t, err)
	}
}

// status reads an event's delivery status and attempt count.
func (b *bundle) status(t *testing.T, id string) (string, int) {
	t.Helper()
	var st string
	var n int
	require.NoError(t, b.s.Pool.QueryRow(context.Background(),
		`SELECT delivery_status, attempts FROM integration_events WHERE id = $1`, id).Scan(&st, &n))
	return st, n
}

func (b *bundle) awaitStatus(t *testing.T, id, want string, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { st, _ := b.status(t, id); return st == want },
		within, 10*time.Millisecond, "event %s never became %s", id, want)
}

// deliveryRow is an event_deliveries row.
type deliveryRow struct {
	n      int
	code   *int
	err    *string
	body   *string
	millis int
}

func (b *bundle) deliveries(t *testing.T, id string) []deliveryRow {
	t.Helper()
	rows, err := b.s.Pool.Query(context.Background(), `
		SELECT n, status_code, error, response_body, duration_ms FROM event_deliveries WHERE event_id = $1 ORDER BY n`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []deliveryRow
	for rows.Next() {
		var r deliveryRow
		require.NoError(t, rows.Scan(&r.n, &r.code, &r.err, &r.body, &r.millis))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// request is a webhook request as a receiver saw it.
type request struct {
	at     time.Time
	header http.Header
	body   []byte
}

// receiver is a webhook endpoint that records every request and answers with answer.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []request
	answer func(n int, w http.ResponseWriter, r *http.Request) // n counts from 1
}

func newReceiver(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, request{at: time.Now(), header: r.Header.Clone(), body: body})
		n := len(rc.got)
		rc.mu.Unlock()
		rc.answer(n, w, r)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.got...)
}

// TestFailingConsumerGetsSixAttemptsThenRedeliveryOnce: a receiver answering 500 gets six
// attempts, spaced at least by the schedule, each recorded; the event is then dead. A redelivery
// (the gateway's reset) reaches the recovered receiver once, numbering its attempt after the
// history, and a duplicate notice of the delivered event delivers nothing.
func TestFailingConsumerGetsSixAttemptsThenRedeliveryOnce(t *testing.T) {
	t.Parallel()
	delays := []time.Duration{100 * time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond,
		250 * time.Millisecond, 300 * time.Millisecond}
	b := setup(t, options{delays: delays})
	var healthy atomic.Bool
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if healthy.Load() {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "boom "+strings.Repeat("x", 4<<10))
	})
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	id := b.newEvent(t, dbtest.TestApp)

	b.awaitStatus(t, id, "dead", 10*time.Second)
	got := rc.requests()
	require.Len(t, got, 6, "six attempts, then dead")
	for i := 1; i < len(got); i++ {
		assert.GreaterOrEqual(t, got[i].at.Sub(got[i-1].at), delays[i-1], "gap before attempt %d", i+1)
		assert.Equal(t, id, got[i].header.Get(webhooks.HeaderID), "every attempt carries the event id")
	}
	rows := b.deliveries(t, id)
	require.Len(t, rows, 6)
	for i, r := range rows {
		assert.Equal(t, i+1, r.n)
		require.NotNil(t, r.code)
		assert.Equal(t, 500, *r.code)
		require.NotNil(t, r.err)
		assert.Equal(t, webhook.CategoryHTTPStatus, *r.err, "the tenant sees the category, the status code says which")
		require.NotNil(t, r.body)
		assert.True(t, strings.HasPrefix(*r.body, "boom "))
		assert.LessOrEqual(t, len(*r.body), maxStoredBody, "the stored answer is truncated")
	}
	var deadAt, nextAt *time.Time
	require.NoError(t, b.s.Pool.QueryRow(context.Background(),
		`SELECT dead_at, next_attempt_at FROM integration_events WHERE id = $1`, id).Scan(&deadAt, &nextAt))
	assert.NotNil(t, deadAt)
	assert.Nil(t, nextAt, "a dead event has no next attempt")

	// Redeliver as the gateway does: pending, a fresh budget, unrelayed (the relay publishes again).
	healthy.Store(true)
	_, err := b.s.Pool.Exec(context.Background(), `
		UPDATE integration_events SET delivery_status = 'pending', attempts = 0, next_attempt_at = NULL,
			last_error = NULL, delivered_at = NULL, dead_at = NULL, relayed_at = NULL, relay_claimed_until = NULL
		WHERE id = $1`, id)
	require.NoError(t, err)
	b.awaitStatus(t, id, "delivered", 10*time.Second)
	require.Len(t, rc.requests(), 7, "the redelivery reaches the receiver once")
	rows = b.deliveries(t, id)
	require.Len(t, rows, 7, "the history survives the redelivery")
	assert.Equal(t, 7, rows[6].n)
	require.NotNil(t, rows[6].code)
	assert.Equal(t, http.StatusNoContent, *rows[6].code)
	assert.Nil(t, rows[6].err)

	// A duplicate notice of the delivered event is acked without a delivery.
	acked := b.broker.Counters(b.route.Name).Acknowledged
	b.notify(t, dbtest.TestApp, id, 1)
	require.Eventually(t, func() bool { return b.broker.Counters(b.route.Name).Acknowledged > acked },
		5*time.Second, 10*time.Millisecond)
	assert.Len(t, rc.requests(), 7, "no second delivery of a delivered event")
	assert.Len(t, b.deliveries(t, id), 7)
}

// TestConcurrentDuplicateNoticesDeliverOnce: copies of one notice handled at the same time meet
// the event's claim; one delivers, the others find the event delivered.
func TestConcurrentDuplicateNoticesDeliverOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	id := b.newEvent(t, dbtest.TestApp)
	b.notify(t, dbtest.TestApp, id, 4) // beside the relay's own hand-off in process

	b.awaitStatus(t, id, "delivered", 10*time.Second)
	require.Eventually(t, func() bool { return b.broker.Counters(b.route.Name).Acknowledged >= 4 },
		10*time.Second, 10*time.Millisecond, "every copy is acked in the end")
	assert.Len(t, rc.requests(), 1)
	assert.Len(t, b.deliveries(t, id), 1)
}

// TestRetryAfterIsHonoured: a 429 with Retry-After (time-scaled) pushes the next attempt past the
// schedule's shorter delay.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	// Retry-After: 2 (seconds) at scale 0.4 is 800 ms: longer than the first delay (100 ms), shorter
	// than the level after it (5 s), so the wait is 800 ms.
	b := setup(t, options{delays: []time.Duration{100 * time.Millisecond, 5 * time.Second}, timeScale: 0.4})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	id := b.newEvent(t, dbtest.TestApp)

	b.awaitStatus(t, id, "delivered", 10*time.Second)
	got := rc.requests()
	require.Len(t, got, 2)
	assert.GreaterOrEqual(t, got[1].at.Sub(got[0].at), 800*time.Millisecond, "Retry-After honoured")
	rows := b.deliveries(t, id)
	require.Len(t, rows, 2)
	assert.Equal(t, 429, *rows[0].code)
}

// TestHangingConsumerDoesNotDelayOtherApplications: while application A's receiver hangs on every
// request, B's event is still delivered promptly, and A never has more than its bound in flight.
func TestHangingConsumerDoesNotDelayOtherApplications(t *testing.T) {
	t.Parallel()
	const perApp = 4
	b := setup(t, options{timeout: 30 * time.Second, perApp: perApp})
	release := make(chan struct{})
	var inFlight, most atomic.Int32
	hanging := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // before the receiver closes: cleanups run last first
	healthy := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	b.setConsumer(t, dbtest.TestApp, "webhook", hanging.srv.URL)
	b.setConsumer(t, appB, "webhook", healthy.srv.URL)

	for range 40 {
		b.newEvent(t, dbtest.TestApp)
	}
	require.Eventually(t, func() bool { return inFlight.Load() == perApp }, 10*time.Second, 10*time.Millisecond,
		"A's deliveries hang at its bound")
	start := time.Now()
	id := b.newEvent(t, appB)
	b.awaitStatus(t, id, "delivered", 2*time.Second)
	t.Logf("B delivered %v after its event was written, with %d of A's hanging", time.Since(start), inFlight.Load())
	assert.Len(t, healthy.requests(), 1)
	assert.LessOrEqual(t, most.Load(), int32(perApp), "A never exceeds its bound")
}

// TestRotationSignsWithBothSecrets: during a rotation's overlap each delivery carries two
// signatures, one verifying with each secret (also with the Standard Webhooks reference library);
// after it, one.
func TestRotationSignsWithBothSecrets(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	current := b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	previous := b.rotating(t, dbtest.TestApp)

	id := b.newEvent(t, dbtest.TestApp)
	b.awaitStatus(t, id, "delivered", 10*time.Second)
	got := rc.requests()
	require.Len(t, got, 1)
	require.Len(t, strings.Fields(got[0].header.Get(webhooks.HeaderSignature)), 2)
	for _, s := range []string{current, previous} {
		assert.NoError(t, webhooks.Verify(got[0].header, got[0].body, s))
		wh, err := standardwebhooks.NewWebhook(s)
		require.NoError(t, err)
		assert.NoError(t, wh.Verify(got[0].body, got[0].header), "the reference library verifies")
	}

	// The overlap over, only the current secret signs.
	_, err := b.s.Pool.Exec(context.Background(),
		`UPDATE applications SET signing_secret_prev_until = now() - interval '1 second' WHERE id = $1`, dbtest.TestApp)
	require.NoError(t, err)
	id2 := b.newEvent(t, dbtest.TestApp)
	b.awaitStatus(t, id2, "delivered", 10*time.Second)
	got = rc.requests()
	require.Len(t, got, 2)
	require.Len(t, strings.Fields(got[1].header.Get(webhooks.HeaderSignature)), 1)
	assert.NoError(t, webhooks.Verify(got[1].header, got[1].body, current))
	assert.Error(t, webhooks.Verify(got[1].header, got[1].body, previous))
}

func TestNextDelay(t *testing.T) {
	t.Parallel()
	delays := []time.Duration{time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 6 * time.Hour}
	tests := []struct {
		n          int
		retryAfter time.Duration
		want       time.Duration
	}{
		{1, 0, time.Minute},
		{1, 30 * time.Second, time.Minute},    // shorter than the schedule: the schedule stands
		{1, 3 * time.Minute, 3 * time.Minute}, // between this level and the next
		{1, time.Hour, 5 * time.Minute},       // capped at the next level
		{4, 4 * time.Hour, 4 * time.Hour},
		{4, 24 * time.Hour, 6 * time.Hour},
		{5, 24 * time.Hour, 6 * time.Hour}, // the last gap has no level after it
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, nextDelay(delays, tc.n, tc.retryAfter), "after attempt %d, Retry-After %v", tc.n, tc.retryAfter)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true}, // in the past: now
		{"", 0, false},
		{"-5", 0, false},
		{"soon", 0, false},
	}
	for _, tc := range tests {
		got, ok := parseRetryAfter(tc.in, now)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// TestRetryAfterDateIsReadAgainstTheAnswersDate: a Retry-After date is the receiver's clock; the
// delay it means is its distance from the answer's own Date, not from this host's clock, which may
// be off by any amount.
func TestRetryAfterDateIsReadAgainstTheAnswersDate(t *testing.T) {
	t.Parallel()
	here := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	theirs := here.Add(-time.Hour) // the receiver's clock is an hour behind
	h := http.Header{}
	h.Set("Date", theirs.Format(http.TimeFormat))
	h.Set("Retry-After", theirs.Add(90*time.Second).Format(http.TimeFormat))
	got, ok := parseRetryAfter(h.Get("Retry-After"), responseTime(h, here))
	require.True(t, ok)
	require.Equal(t, 90*time.Second, got)

	h.Set("Date", "yesterday")
	require.Equal(t, here, responseTime(h, here), "no valid Date: this host's clock")
}

func TestLimiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLimiter(2, 0)
	require.True(t, l.acquire(ctx, "a"))
	require.True(t, l.acquire(ctx, "a"))
	require.False(t, l.acquire(ctx, "a"), "a is at its bound")
	require.True(t, l.acquire(ctx, "b"), "b is not held up by a")
	l.release("a")
	require.True(t, l.acquire(ctx, "a"))
	l.release("a")
	l.release("a")
	l.release("b")
	require.Empty(t, l.slots["a"], "no slot of a leaks")
	require.Empty(t, l.slots["b"], "no slot of b leaks")
}

func TestLimiterWaitsItsPatienceForASlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLimiter(1, time.Minute)
	require.True(t, l.acquire(ctx, "a"))
	got := make(chan bool)
	go func() { got <- l.acquire(ctx, "a") }()
	l.release("a") // the waiter takes the freed slot
	require.True(t, <-got, "a waiter within its patience gets the slot a delivery frees")

	short := newLimiter(1, time.Millisecond)
	require.True(t, short.acquire(ctx, "a"))
	require.False(t, short.acquire(ctx, "a"), "past its patience a waiter is told no")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.False(t, l.acquire(cancelled, "a"), "a stopping worker does not wait")
}
