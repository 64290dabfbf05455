package mq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// STOMP is the port's STOMP 1.2 provider (pkg/stomp underneath), proven on ActiveMQ Classic by the
// contract suite. A route is the destination /queue/<scope>.<route>, its dead letters
// /queue/<scope>.<route>.dlq; there are no holding queues: a retry or a deferral is a copy the
// broker schedules (AMQ_SCHEDULED_DELAY on Classic, _AMQ_SCHED_DELIVERY on Artemis) and that
// carries its due time, which the consumer holds to (see stompScheduleLead). One connection
// publishes (and copies, lists and moves dead letters); every Consume call has a connection of its
// own, so a consumer that must be recycled recycles nothing else. It is safe for concurrent use.
type STOMP struct {
	cfg      Config
	url      string   // without the port's own query parameters
	tls      *amqpTLS // nil for stomp://
	schedule string   // stompScheduleClassic or stompScheduleArtemis
	log      *zap.Logger
	metric   *prometheus.CounterVec

	closed    chan struct{}
	closeOnce sync.Once

	// pubSem guards pub: holding it is the right to replace a dead publishing connection.
	pubSem chan struct{}
	pub    *stomp.Conn

	mu        sync.RWMutex
	routes    map[string]*topology
	stats     map[string]*routeStats // per route, created on first use
	consumers sync.WaitGroup         // running Consume calls, waited for by Close
	conns     map[*stomp.Conn]bool
}

// The scheduled-delivery header a STOMP broker honours, chosen by the URL's schedule parameter.
const (
	// stompScheduleClassic: ActiveMQ Classic's AMQ_SCHEDULED_DELAY, milliseconds from now (the
	// broker needs schedulerSupport="true"). Measured: never early, up to ~0.5 s late.
	stompScheduleClassic = "classic"
	// stompScheduleArtemis: ActiveMQ Artemis's _AMQ_SCHED_DELIVERY, an absolute time in epoch
	// milliseconds. Not testable here (no Artemis runs on these machines); Classic ignores it.
	stompScheduleArtemis = "artemis"
)

// stompScheduleLead is how much sooner than a copy's due time the broker is asked to deliver it:
// ActiveMQ Classic's scheduler delivers 0.3 to 0.5 s after the time asked (measured, at every
// delay from 10 ms to 1.5 s), so a copy scheduled for its due time would arrive that much late. The
// copy carries its due time (hdrSTOMPDue) and the consumer holds an early arrival in the worker
// until then, so a copy is never handled early and is late by little more than the broker's
// lateness beyond the lead. A delay shorter than the lead is not scheduled at all: the copy goes
// to the work queue at once and is held until due.
const stompScheduleLead = 300 * time.Millisecond

// The port's own STOMP headers. Their names are identifiers, not hyphenated: ActiveMQ's selectors
// cannot name a header with a hyphen (measured), and Redrive and Discard select on hdrSTOMPID.
const (
	// hdrSTOMPID is the message's id (Message.ID): the broker's message-id is its own, and
	// Artemis mints a new one on redelivery.
	hdrSTOMPID = "mq_id"
	// hdrSTOMPSend identifies one SEND: a broker's redelivery of it keeps it, a copy of the
	// message (retry, requeue, duplicate) gets a new one. It is the identity of the "delivery
	// reissued" check.
	hdrSTOMPSend = "mq_send"
	// hdrSTOMPDue is when a scheduled copy is due, epoch milliseconds: the consumer holds an
	// earlier arrival until then.
	hdrSTOMPDue = "mq_due"
	// hdrSTOMPRequeued marks a copy that returned a delivery to the broker (Message.Redelivered) and
	// counts such returns, for the backstop (deadReasonDeliveryLimit).
	hdrSTOMPRequeued = "mq_requeued"
	// hdrSTOMPTypes names the headers whose values are not strings, and their types
	// ("x-delivery-attempt=i,flag=b"): STOMP headers are text.
	hdrSTOMPTypes = "mq_types"
	// hdrSTOMPProbe marks a diagnostic probe; its value is the probe's id.
	hdrSTOMPProbe = "mq_probe"
	// hdrSTOMPMarker marks a route's declaration marker (see stompMarker).
	hdrSTOMPMarker = "mq_marker"
)

// stompMarkerSuffix names the queue that holds a route's declaration marker: STOMP cannot ask a
// broker whether a queue exists (ActiveMQ creates one on first use), so Declare leaves one
// persistent message in "<scope>.<route>.declared" and the dead-letter operations of a route that
// was never declared in the scope fail, as RabbitMQ's 404 makes them fail.
const stompMarkerSuffix = ".declared"

// stompURLParams are the query parameters of a STOMP URL the port reads (and removes before
// dialing): the schedule header, and the TLS files and name of a stomp+ssl:// URL.
var stompURLParams = []string{"schedule", "cacertfile", "certfile", "keyfile", "server_name_indication"}

// dialSTOMP connects the STOMP provider's publishing connection. The URL may carry the port's own
// query parameters (stompURLParams): schedule=classic|artemis (default classic), and for
// stomp+ssl:// the TLS parameters of an amqps:// URL (see newSTOMPTLS).
func dialSTOMP(ctx context.Context, cfg Config) (*STOMP, error) {
	if err := ValidateName(cfg.Scope); err != nil {
		return nil, fmt.Errorf("mq: Config.Scope: %w", err)
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("mq: Config.TimeScale %v is negative", cfg.TimeScale)
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, errors.New("mq: Config.URL is not a valid URL")
	}
	tlsCfg, err := newSTOMPTLS(u)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	schedule := q.Get("schedule")
	switch schedule {
	case "":
		schedule = stompScheduleClassic
	case stompScheduleClassic, stompScheduleArtemis:
	default:
		return nil, fmt.Errorf("mq: Config.URL's schedule parameter %q is not one of %q, %q", schedule,
			stompScheduleClassic, stompScheduleArtemis)
	}
	for _, k := range stompURLParams {
		q.Del(k)
	}
	if len(q) > 0 {
		return nil, fmt.Errorf("mq: Config.URL has query parameters the STOMP provider does not know: %v", slices.Sorted(maps.Keys(q)))
	}
	u.RawQuery = ""
	metric, err := newMetric(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	b := &STOMP{
		cfg:      cfg,
		url:      u.String(),
		tls:      tlsCfg,
		schedule: schedule,
		log:      cfg.Logger.With(zap.String("scope", cfg.Scope), zap.String("provider", ProviderSTOMP)),
		metric:   metric,
		stats:    map[string]*routeStats{},
		closed:   make(chan struct{}),
		pubSem:   make(chan struct{}, 1),
		routes:   map[string]*topology{},
		conns:    map[*stomp.Conn]bool{},
	}
	if _, err := b.publisher(ctx); err != nil {
		return nil, fmt.Errorf("mq: connect: %w", err)
	}
	return b, nil
}

// dial opens one STOMP connection. Its error never contains the URL (it carries the passcode).
func (b *STOMP) dial(ctx context.Context, purpose string) (*stomp.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	opts := []stomp.Option{stomp.WithHeartBeat(heartbeat, heartbeat)}
	if b.tls != nil {
		opts = append(opts, stomp.WithTLS(b.tls.config()))
	}
	if wrap := b.hooks().wrapConn; wrap != nil {
		opts = append(opts, stomp.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrap(purpose, c), nil
		}))
	}
	c, err := stomp.Dial(ctx, b.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s connection: %w", purpose, err)
	}
	b.mu.Lock()
	if b.isClosed() {
		b.mu.Unlock()
		c.Close(ctx) //nolint:errcheck // closing anyway
		return nil, ErrClosed
	}
	b.conns[c] = true
	b.mu.Unlock()
	return c, nil
}

// release closes a connection of the port (DISCONNECT, bounded) and forgets it.
func (b *STOMP) release(c *stomp.Conn, within time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c.Close(ctx) //nolint:errcheck // the broker returns what the connection held unacknowledged either way
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
}

func (b *STOMP) hooks() *testHooks {
	if b.cfg.hooks == nil {
		return noHooks
	}
	return b.cfg.hooks
}

func (b *STOMP) isClosed() bool { return isDone(b.closed) }

// publisher returns the live publishing connection, dialing a new one if it died.
func (b *STOMP) publisher(ctx context.Context) (*stomp.Conn, error) {
	select {
	case b.pubSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.closed:
		return nil, ErrClosed
	}
	defer func() { <-b.pubSem }()
	if b.isClosed() {
		return nil, ErrClosed
	}
	if b.pub != nil && !isDone(b.pub.Done()) {
		return b.pub, nil
	}
	if b.pub != nil {
		b.log.Info("mq publishing connection reconnecting", zap.Error(b.pub.Err()))
		b.release(b.pub, time.Second)
		b.pub = nil
	}
	c, err := b.dial(ctx, "publish")
	if err != nil {
		return nil, err
	}
	b.pub = c
	return c, nil
}

// dest is the STOMP destination of a scoped queue name.
func dest(queue string) string { return "/queue/" + queue }

// QueueName is the scoped queue name of a route: "<scope>.<route>" (its destination is
// /queue/<scope>.<route>).
func (b *STOMP) QueueName(route string) string { return b.cfg.Scope + "." + route }

// planSTOMP is plan, refusing also the route names whose queue would be another route's marker.
func (b *STOMP) planSTOMP(r Route) (*topology, error) {
	if strings.HasSuffix(r.Name, stompMarkerSuffix) {
		return nil, fmt.Errorf("mq: route name %q would collide with a route's declaration marker: %w", r.Name, ErrInvalidName)
	}
	return plan(b.cfg.Scope, b.cfg.TimeScale, r)
}

// Declare validates each route, remembers it, and leaves its declaration marker in the broker
// (once): ActiveMQ creates the queues themselves on first use, and there are no holding queues to
// declare. The marker is what tells DeadLetters, Redrive and Discard of another process that the
// route exists.
func (b *STOMP) Declare(ctx context.Context, routes ...Route) error {
	tops := make([]*topology, 0, len(routes))
	for _, r := range routes {
		t, err := b.planSTOMP(r)
		if err != nil {
			return err
		}
		tops = append(tops, t)
	}
	for _, t := range tops {
		n, err := b.browseCount(ctx, t.queue+stompMarkerSuffix, 1)
		if err != nil {
			return fmt.Errorf("mq: declare %q: %w", t.route, err)
		}
		if n == 0 {
			if err := b.sendOwn(ctx, dest(t.queue+stompMarkerSuffix), map[string]string{hdrSTOMPMarker: t.route}, nil); err != nil {
				return fmt.Errorf("mq: declare %q: marker: %w", t.route, err)
			}
		}
	}
	b.mu.Lock()
	for _, t := range tops {
		b.routes[t.route] = t
	}
	b.mu.Unlock()
	return nil
}

// topology returns a route declared on this Broker.
func (b *STOMP) topology(route string) (*topology, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	t, ok := b.routes[route]
	return t, ok
}

// DelayLevels are a declared route's delay levels as applied (time-scaled), ascending; nil for a
// route without levels or not declared here. There are no holding queues behind them: a message
// waits for a level in the broker's scheduler. They keep the meaning they have on RabbitMQ, so
// the services plan alike on both: the largest is the horizon a publisher schedules through the
// broker (later work waits in its own store), a deferral goes to the largest level not longer
// than it, and one shorter than the smallest is held in the worker.
func (b *STOMP) DelayLevels(route string) []time.Duration {
	t, ok := b.topology(route)
	if !ok {
		return nil
	}
	return slices.Clone(t.delayTTLs)
}

// DelayTolerance is RabbitMQ's (see [RabbitMQ.DelayTolerance]): how far short of a level a delay
// may fall and still wait in it. A scheduled copy is never early (the consumer holds it to its due
// time) and late by the broker's scheduler beyond stompScheduleLead, which on Classic is within
// this tolerance or a little over it.
func (b *STOMP) DelayTolerance(route string) time.Duration {
	t, ok := b.topology(route)
	if !ok {
		return 0
	}
	return t.delayTolerance
}

// Counters is a snapshot of a route's durability counters (zero for a route never used).
func (b *STOMP) Counters(route string) Counters {
	b.mu.RLock()
	s := b.stats[route]
	b.mu.RUnlock()
	if s == nil {
		return Counters{}
	}
	return s.snapshot()
}

// Close closes every connection of the port. Running Consume calls return ErrClosed; the broker
// redelivers whatever they had not acknowledged. Close waits for them.
func (b *STOMP) Close() error { return b.CloseContext(context.Background()) }

// CloseContext is Close bounded by ctx: consumers whose handlers ignore their cancelled context
// are not waited for past ctx's end (ctx.Err() is then returned). The connections are closed
// either way.
func (b *STOMP) CloseContext(ctx context.Context) error {
	var err error
	b.closeOnce.Do(func() {
		b.mu.Lock()
		close(b.closed)
		conns := make([]*stomp.Conn, 0, len(b.conns))
		for c := range b.conns {
			conns = append(conns, c)
		}
		b.mu.Unlock()
		within := time.Second
		if dl, ok := ctx.Deadline(); ok {
			within = min(within, time.Until(dl))
		}
		for _, c := range conns {
			b.release(c, within)
		}
		done := make(chan struct{})
		go func() {
			b.consumers.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			err = fmt.Errorf("mq: close: consumers still stopping: %w", ctx.Err())
		}
	})
	return err
}

// startConsumer registers a Consume call with Close, unless the broker is already closed.
func (b *STOMP) startConsumer() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.isClosed() {
		return ErrClosed
	}
	b.consumers.Add(1)
	return nil
}

// routeStats returns a route's counters, created on first use.
func (b *STOMP) routeStats(route string) *routeStats {
	b.mu.RLock()
	s := b.stats[route]
	b.mu.RUnlock()
	if s != nil {
		return s
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s = b.stats[route]; s == nil {
		s = newRouteStats(b.metric, route)
		b.stats[route] = s
	}
	return s
}
