package mq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Broker is the message port: what the services, the gateway's system endpoints, the benchmarks
// and the e2e stacks use, whatever the broker behind it. [Dial] picks the provider from the
// configuration. Every provider keeps the same contract — handler-return settlement, a copy
// confirmed before its original is acknowledged, the retry budget counted on x-delivery-attempt,
// dead letters with their reasons, redrive with a fresh budget, superseded settlements told apart
// from lost ones — and proves it by running the one contract suite, pkg/mq/mqtest. A Broker is
// safe for concurrent use.
type Broker interface {
	// Declare declares each route's queues (work queue, delay and retry holding, DLQ) and
	// remembers them, so that a reconnect declares them again.
	Declare(ctx context.Context, routes ...Route) error
	// Consume runs handlers for a declared route until ctx ends (nil) or the Broker closes
	// (ErrClosed); see [Drain] for the shutdown.
	Consume(ctx context.Context, route string, concurrency int, h Handler, opts ...ConsumeOption) error
	// Publish publishes one message and returns once the broker has confirmed it.
	Publish(ctx context.Context, route string, msg Outgoing) error
	// PublishAll publishes msgs, pipelined, one error per message (nil: confirmed).
	PublishAll(ctx context.Context, route string, msgs []Outgoing) []error
	// PublishAfter is PublishAll for messages due after delays[i], through the route's
	// DelayLevels.
	PublishAfter(ctx context.Context, route string, msgs []Outgoing, delays []time.Duration) []error
	// QueueName is the scoped name of a route's work queue.
	QueueName(route string) string
	// DelayLevels are a declared route's delay levels as applied (time-scaled), ascending.
	DelayLevels(route string) []time.Duration
	// DelayTolerance is how early an arrival a handler may take as on time; a delay level
	// delivers up to its slack late (a tenth of the level up to a second, or a hundredth if
	// more, at least this) rather than a level early.
	DelayTolerance(route string) time.Duration
	// Counters is a snapshot of a route's durability counters in this process.
	Counters(route string) Counters
	// DeadLetters lists up to limit dead letters of a route, oldest first, without taking them.
	DeadLetters(ctx context.Context, route string, limit int) ([]DeadLetter, error)
	// Redrive moves dead letters (all when ids is empty) back with a fresh attempt budget.
	Redrive(ctx context.Context, route string, ids []string) (int, error)
	// Discard removes the named dead letters; an empty ids removes nothing.
	Discard(ctx context.Context, route string, ids []string) (int, error)
	// Diagnose checks each route's queues and runs a probe round trip through its work queue.
	Diagnose(ctx context.Context, routes []Route, timeout time.Duration) []Diagnosis
	// DeleteRoutes deletes every queue of the routes in this scope, with their messages.
	DeleteRoutes(ctx context.Context, routes ...Route) error
	// Close closes the connections; running Consume calls return ErrClosed.
	Close() error
	// CloseContext is Close bounded by ctx.
	CloseContext(ctx context.Context) error
}

// ErrClosed is returned by a Broker's methods after Close, and by Consume when the Broker is
// closed under it.
var ErrClosed = errors.New("mq: broker closed")

// ErrUnknownRoute is returned by Consume for a route that was not declared with Declare.
var ErrUnknownRoute = errors.New("mq: route not declared")

const (
	// dialTimeout bounds TCP connect plus a protocol handshake.
	dialTimeout = 10 * time.Second
	// heartbeat lets both sides notice a dead TCP connection within ~2 intervals.
	heartbeat = 10 * time.Second
	// publishTimeout bounds one Publish/PublishAll call, including the wait for confirms, so a
	// blocked connection (a memory or disk alarm) turns into an error instead of a hang.
	publishTimeout = 10 * time.Second
)

// Config configures a Broker.
type Config struct {
	// Provider is the broker kind, ProviderRabbitMQ or ProviderSTOMP; empty: the one URL's scheme
	// names. Dial refuses a Provider the URL's scheme contradicts.
	Provider   string
	URL        string                // amqp://user:pass@host:port/vhost, or amqps:// for TLS (see amqpTLS); stomp:// or stomp+ssl:// for STOMP
	Scope      string                // prefix of every queue name, e.g. "integrations" or a per-test-run prefix
	TimeScale  float64               // multiplies every delay (holding-queue TTL); 0 means 1
	Logger     *zap.Logger           // nil → zap.NewNop()
	Registerer prometheus.Registerer // nil → no metrics registration (tests); counters still counted

	hooks *testHooks // tests of this package only
}

// The providers Config.Provider names.
const (
	ProviderRabbitMQ = "rabbitmq" // AMQP 0-9-1; URL amqp:// or amqps://
	ProviderSTOMP    = "stomp"    // STOMP 1.2 (ActiveMQ); URL stomp:// or stomp+ssl://
)

// Dial connects to the broker Config names and returns the port over it. The provider is
// Config.Provider, or, when that is empty, the one the URL's scheme says; a Provider and a scheme
// that disagree, an unknown provider or an unknown scheme is an error naming the setting (never
// the URL, which carries a password).
func Dial(ctx context.Context, cfg Config) (Broker, error) {
	provider, err := ProviderOf(cfg.Provider, cfg.URL)
	if err != nil {
		return nil, err
	}
	return dial(ctx, cfg, provider)
}

// dial builds the port over the provider's driver.
func dial(ctx context.Context, cfg Config, provider string) (*port, error) {
	p, err := newPort(cfg, provider)
	if err != nil {
		return nil, err
	}
	switch provider {
	case ProviderSTOMP:
		p.drv, err = dialSTOMP(ctx, p)
	default:
		p.drv, err = dialRabbitMQ(ctx, p)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// schemes are the URL schemes each provider takes.
var schemes = map[string]string{
	"amqp": ProviderRabbitMQ, "amqps": ProviderRabbitMQ,
	"stomp": ProviderSTOMP, "stomp+ssl": ProviderSTOMP,
}

// ProviderOf resolves the provider of a configuration: provider ("" → what rawURL's scheme
// says) checked against rawURL's scheme. Configuration loaders call it to fail fast; Dial calls
// it again. Errors name Config.Provider or Config.URL's scheme, never the URL.
func ProviderOf(provider, rawURL string) (string, error) {
	switch provider {
	case "", ProviderRabbitMQ, ProviderSTOMP:
	default:
		return "", fmt.Errorf("mq: Config.Provider %q is not one of %q, %q", provider, ProviderRabbitMQ, ProviderSTOMP)
	}
	if rawURL == "" {
		return "", errors.New("mq: Config.URL is empty")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse's error quotes the URL: say only that it is not one.
		return "", errors.New("mq: Config.URL is not a valid URL")
	}
	byScheme, ok := schemes[u.Scheme]
	if !ok {
		return "", fmt.Errorf("mq: Config.URL's scheme %q is not one of amqp, amqps (%s), stomp, stomp+ssl (%s)",
			u.Scheme, ProviderRabbitMQ, ProviderSTOMP)
	}
	if provider != "" && provider != byScheme {
		return "", fmt.Errorf("mq: Config.Provider %q does not take Config.URL's scheme %q (a %s URL)", provider, u.Scheme, byScheme)
	}
	return byScheme, nil
}

// port is the Broker: what every provider shares — the routes declared and their plans, the
// counters, the checks of names and arguments, the publish bookkeeping, the diagnosis, the close —
// over a driver, which does what its broker does its own way (driver.go).
type port struct {
	cfg            Config
	log            *zap.Logger
	metric         *prometheus.CounterVec   // integrations_mq_messages_total
	handlerSeconds *prometheus.HistogramVec // integrations_mq_handler_seconds
	drv            driver

	closed    chan struct{}
	closeOnce sync.Once

	mu        sync.RWMutex
	routes    map[string]*topology   // declared routes (a driver may declare them again on a reconnect)
	stats     map[string]*routeStats // per route, created on first use
	consumers sync.WaitGroup         // running Consume calls, waited for by Close
}

// newPort checks the configuration every provider shares and builds the port, without its driver.
func newPort(cfg Config, provider string) (*port, error) {
	if err := ValidateName(cfg.Scope); err != nil {
		return nil, fmt.Errorf("mq: Config.Scope: %w", err)
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("mq: Config.TimeScale %v is negative", cfg.TimeScale)
	}
	cfg.TimeScale = cmp.Or(cfg.TimeScale, 1)
	cfg.Logger = cmp.Or(cfg.Logger, zap.NewNop())
	metric, err := newMetric(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	handlerSeconds, err := newHandlerSeconds(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &port{
		cfg:            cfg,
		log:            cfg.Logger.With(zap.String("scope", cfg.Scope), zap.String("provider", provider)),
		metric:         metric,
		handlerSeconds: handlerSeconds,
		closed:         make(chan struct{}),
		routes:         map[string]*topology{},
		stats:          map[string]*routeStats{},
	}, nil
}

// QueueName is the scoped queue name of a route: "<scope>.<route>".
func (p *port) QueueName(route string) string { return p.cfg.Scope + "." + route }

// Declare declares, for each route, its queues (see the driver's declare), and remembers the
// routes so that reconnects declare them again. Every route is planned (and refused) before the
// broker is asked. Declaring a route again with a different policy replaces the remembered one;
// RabbitMQ refuses (406) if that changes an existing queue's arguments.
func (p *port) Declare(ctx context.Context, routes ...Route) error {
	tops := make([]*topology, 0, len(routes))
	for _, r := range routes {
		t, err := plan(p.cfg.Scope, p.cfg.TimeScale, r)
		if err != nil {
			return err
		}
		tops = append(tops, t)
	}
	if err := p.drv.declare(ctx, tops); err != nil {
		return err
	}
	p.mu.Lock()
	for _, t := range tops {
		p.routes[t.route] = t
	}
	p.mu.Unlock()
	return nil
}

// DelayLevels are a declared route's delay levels as applied: scaled by Config.TimeScale, in whole
// milliseconds, ascending, without duplicates. Nil for a route without levels or not declared on
// this Broker. The largest is how far ahead a publisher can schedule through the broker; work due
// later belongs in the publisher's own store until it is that close. On RabbitMQ each level is a
// holding queue; on STOMP a message waits for its level in the broker's scheduler, and the levels
// keep RabbitMQ's meaning so that the services plan alike on both.
func (p *port) DelayLevels(route string) []time.Duration {
	t, ok := p.topology(route)
	if !ok {
		return nil
	}
	return slices.Clone(t.delayTTLs)
}

// DelayTolerance is the route's DelayTolerance as its levels apply it (scaled by
// Config.TimeScale, at least 5 ms): [Broker.PublishAfter] and [Defer] put a delay that falls
// short of a level by less than this into that level, so a message can arrive this much late
// rather than a level early. A handler may take a message that arrives early by less than
// DelayTolerance, time-scaled, as on time (start it rather than defer it), since the wait left
// would cost a holding-queue hop — or a worker held that long — for a few milliseconds; it should
// not use this floored value for that, which in a time-scaled run is a large part of a scaled
// delay. 0 for a route without levels or not declared on this Broker.
func (p *port) DelayTolerance(route string) time.Duration {
	t, ok := p.topology(route)
	if !ok {
		return 0
	}
	return t.delayTolerance
}

// Counters is a snapshot of a route's durability counters (zero for a route never used).
func (p *port) Counters(route string) Counters {
	p.mu.RLock()
	s := p.stats[route]
	p.mu.RUnlock()
	if s == nil {
		return Counters{}
	}
	return s.snapshot()
}

// Publish publishes one message to a route's queue and returns once the broker has confirmed it
// (a publisher confirm, a RECEIPT). An unroutable, refused or unconfirmed publish is an error. It
// gives up after ctx or a 10 s publish timeout, whichever ends first.
func (p *port) Publish(ctx context.Context, route string, msg Outgoing) error {
	return p.PublishAll(ctx, route, []Outgoing{msg})[0]
}

// PublishAll publishes msgs to a route's queue, pipelined: all are written, then all confirms
// awaited. It returns one error per message, nil when confirmed. The whole call is bounded by ctx
// and a 10 s publish timeout. The route need not be declared by this Broker.
func (p *port) PublishAll(ctx context.Context, route string, msgs []Outgoing) []error {
	if err := validateRoute(route); err != nil {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, err))
	}
	queue := p.QueueName(route)
	if err := ValidateName(queue); err != nil {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, err))
	}
	return p.publish(ctx, route, queue, msgs, func(int) time.Duration { return 0 })
}

// PublishAfter is PublishAll for messages that must not be delivered (much) before their delay:
// msgs[i] waits in the route's largest [Route.DelayLevels] level not longer than delays[i] plus
// the route's [Broker.DelayTolerance] (a holding queue whose TTL dead-letters it into the work
// queue on RabbitMQ, the broker's scheduler on STOMP); a delay shorter than the smallest level by
// more than the tolerance (zero or negative included) goes straight to the work queue. So a
// message never arrives before its level, arrives at most the tolerance after its delay, and early
// by up to its delay minus that level: the consumer compares with the time the message carries,
// takes one early by less than the tolerance as on time and returns [Defer] for more. A delay
// computed a few milliseconds short of a level (a due time minus the time passed since) thus
// costs one hop, not a walk down the shorter levels. A long delay never holds back a short one.
//
// The route must have been declared with Declare on this Broker (that is where its levels come
// from); otherwise every message fails with ErrUnknownRoute. Confirms, errors and the timeout are
// PublishAll's.
func (p *port) PublishAfter(ctx context.Context, route string, msgs []Outgoing, delays []time.Duration) []error {
	if len(delays) != len(msgs) {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %d messages but %d delays", route, len(msgs), len(delays)))
	}
	t, ok := p.topology(route)
	if !ok {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, ErrUnknownRoute))
	}
	return p.publish(ctx, route, t.queue, msgs, func(i int) time.Duration {
		_, ttl, _ := t.delayQueue(delays[i])
		return ttl
	})
}

func failAll(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// publish hands application messages to the driver, each to wait in the delay level level(i) (0:
// none), and counts them: published once written, confirmed once the broker has them, returned
// when the broker could route them nowhere.
func (p *port) publish(ctx context.Context, route, queue string, msgs []Outgoing, level func(i int) time.Duration) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	envs := make([]envelope, len(msgs))
	for i, m := range msgs {
		envs[i] = envelope{id: m.ID, contentType: m.ContentType, headers: applicationHeaders(ctx, m), body: m.Body, delay: level(i)}
		if envs[i].id == "" {
			envs[i].id = uuid.NewString()
		}
		if envs[i].contentType == "" {
			envs[i].contentType = defaultContentType
		}
	}
	sent, err := p.drv.publish(ctx, queue, envs)
	if err != nil {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, err))
	}
	st := p.routeStats(route)
	for i, s := range sent {
		if s.written {
			st.inc(evPublished)
		}
		switch {
		case s.err == nil:
			st.inc(evConfirmed)
		case errors.Is(s.err, ErrUnroutable):
			st.inc(evReturned)
		}
		if s.err != nil {
			errs[i] = fmt.Errorf("mq: publish %q to %q: %w", envs[i].id, route, s.err)
		}
	}
	return errs
}

// DeadLetters lists up to limit messages at the head of a route's DLQ ("<scope>.<route>.dlq"),
// oldest first, without taking them out (see the drivers' deadLetters for how). The route need not
// be declared by this Broker, but in its scope.
func (p *port) DeadLetters(ctx context.Context, route string, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("mq: dead letters of %q: limit %d must be positive", route, limit)
	}
	q, err := p.dlqOf(route)
	if err != nil {
		return nil, err
	}
	dls, err := p.drv.deadLetters(ctx, q, limit)
	if err != nil {
		return dls, fmt.Errorf("mq: dead letters of %q: %w", route, err)
	}
	return dls, nil
}

// Redrive moves the dead letters of a route whose message ids are in ids (all of them when ids is
// empty) back to the route's work queue, with a fresh attempt budget: the port's bookkeeping
// headers (x-delivery-attempt, x-dead-reason, x-last-error, the failure times) and the broker's
// own are stripped, the id, body and properties kept, and x-redriven counts one more redrive
// (DeadLetter.Redriven), so that a recovery can cap its redrives of a message that keeps failing.
// Each copy is confirmed by the broker before its dead letter is acknowledged; messages not
// selected, and any whose copy was not confirmed, stay in the DLQ in their positions. It returns
// how many were moved, and an error if any selected message could not be (a moved message is then
// possibly a duplicate, never lost). It looks at most at the messages the DLQ held when it
// started, so a message that fails again while Redrive runs is not redriven twice.
func (p *port) Redrive(ctx context.Context, route string, ids []string) (int, error) {
	q, err := p.dlqOf(route)
	if err != nil {
		return 0, err
	}
	moved, err := p.drv.redrive(ctx, q, ids)
	p.routeStats(route).add(evRedriven, moved)
	if err != nil {
		return moved, fmt.Errorf("mq: redrive %q: %w", route, err)
	}
	return moved, nil
}

// Discard removes from a route's DLQ the dead letters whose message ids are in ids (every copy of
// each), and reports how many it removed. It is for dead letters a caller has shown to be
// explained — the work they carried was done since, or was decided otherwise — so that the DLQ
// keeps only what still needs an operator; it never chooses by itself, and an empty ids removes
// nothing. Dead letters not selected stay in their positions. Like Redrive it looks at most at the
// messages the DLQ held when it started.
func (p *port) Discard(ctx context.Context, route string, ids []string) (int, error) {
	q, err := p.dlqOf(route)
	if err != nil {
		return 0, err
	}
	removed, err := p.drv.discard(ctx, q, ids)
	if err != nil {
		return removed, fmt.Errorf("mq: discard from %q: %w", route, err)
	}
	return removed, nil
}

// dlqOf is a route's queues for the dead-letter operations, its names checked.
func (p *port) dlqOf(route string) (dlqRef, error) {
	if err := validateRoute(route); err != nil {
		return dlqRef{}, err
	}
	q := dlqRef{route: route, queue: p.QueueName(route)}
	q.dlq = q.queue + ".dlq"
	if err := ValidateName(q.dlq); err != nil {
		return dlqRef{}, err
	}
	return q, nil
}

// dlqRef names a route's work queue and DLQ in this scope, for the dead-letter operations.
type dlqRef struct{ route, queue, dlq string }

// defaultDiagnoseTimeout is how long Diagnose waits for a consumer's answer when given no timeout.
const defaultDiagnoseTimeout = 2 * time.Second

// Diagnose checks each route, concurrently, and answers one Diagnosis per route, in order: what
// its driver can tell of the route's queues, then a round trip through the route's real work
// queue — a probe (confirmed) that whatever process consumes the route answers in Consume itself,
// before and without any handler, acknowledging it without counting it, and whose answer carries
// that process's counters. The wait for the answer is timeout (default 2 s). With no consumer the
// probe stays in the work queue until one comes, which then answers into the void.
func (p *port) Diagnose(ctx context.Context, routes []Route, timeout time.Duration) []Diagnosis {
	if timeout <= 0 {
		timeout = defaultDiagnoseTimeout
	}
	out := make([]Diagnosis, len(routes))
	var wg sync.WaitGroup
	for i, r := range routes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = p.diagnose(ctx, r, timeout)
		}()
	}
	wg.Wait()
	return out
}

func (p *port) diagnose(ctx context.Context, r Route, timeout time.Duration) (d Diagnosis) {
	d.Route = r.Name
	defer func() {
		if d.AnsweredBy == "" {
			d.Counters = p.Counters(r.Name)
		}
		d.OK = len(d.Problems) == 0
	}()
	top, err := plan(p.cfg.Scope, p.cfg.TimeScale, r)
	if err != nil {
		d.problem("invalid route: %v", err)
		return d
	}
	p.drv.diagnose(ctx, top, timeout, &d)
	return d
}

// DeleteRoutes deletes every queue of the given routes in this Broker's scope, with whatever
// messages they hold, and forgets the routes (see the drivers' deleteRoute for what a broker can
// delete). It is for tearing down a scope (tests, a retired deployment prefix); services never
// call it. Never call it within moments of declaring the routes: on RabbitMQ 3.10 that can
// disable at-least-once dead-lettering for the whole broker (see deadLetterVia).
func (p *port) DeleteRoutes(ctx context.Context, routes ...Route) error {
	for _, r := range routes {
		t, err := plan(p.cfg.Scope, p.cfg.TimeScale, r)
		if err != nil {
			return err
		}
		if err := p.drv.deleteRoute(ctx, t); err != nil {
			return fmt.Errorf("mq: delete routes: %w", err)
		}
		p.mu.Lock()
		delete(p.routes, r.Name)
		p.mu.Unlock()
	}
	return nil
}

// Close closes the connections. Running Consume calls return ErrClosed; the broker redelivers
// whatever they had not settled. Close waits for them and for the port's own goroutines.
func (p *port) Close() error { return p.CloseContext(context.Background()) }

// CloseContext is Close bounded by ctx: a broker that does not answer the close, or a Consume
// whose handlers ignore their cancelled context, is not waited for past ctx's end (ctx.Err() is
// then returned). The connections are closed either way: the broker requeues what was unacked.
func (p *port) CloseContext(ctx context.Context) error {
	var errs []error
	p.closeOnce.Do(func() {
		p.mu.Lock() // orders close(p.closed) against Consume's p.consumers.Add
		close(p.closed)
		p.mu.Unlock()
		if err := p.drv.close(ctx); err != nil {
			errs = append(errs, err)
		}
		done := make(chan struct{})
		go func() {
			p.consumers.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("consumers still stopping: %w", ctx.Err()))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("mq: close: %w", err)
	}
	return nil
}

// startConsumer registers a Consume call with Close, unless the broker is already closed.
func (p *port) startConsumer() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isClosed() {
		return ErrClosed
	}
	p.consumers.Add(1)
	return nil
}

func (p *port) isClosed() bool { return isDone(p.closed) }

// topology returns a declared route.
func (p *port) topology(route string) (*topology, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	t, ok := p.routes[route]
	return t, ok
}

// declared is every route declared on this Broker.
func (p *port) declared() []*topology {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]*topology, 0, len(p.routes))
	for _, t := range p.routes {
		out = append(out, t)
	}
	return out
}

// routeStats returns a route's counters, created on first use.
func (p *port) routeStats(route string) *routeStats {
	p.mu.RLock()
	s := p.stats[route]
	p.mu.RUnlock()
	if s != nil {
		return s
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s = p.stats[route]; s == nil {
		s = newRouteStats(p.metric, route)
		p.stats[route] = s
	}
	return s
}

// isDone reports whether ch is closed; a nil ch is not.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
