package mq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// ErrClosed is returned by a Broker's methods after Close, and by Consume when the Broker is
// closed under it.
var ErrClosed = errors.New("mq: broker closed")

// ErrUnknownRoute is returned by Consume for a route that was not declared with Declare.
var ErrUnknownRoute = errors.New("mq: route not declared")

const (
	// dialTimeout bounds TCP connect plus the AMQP handshake.
	dialTimeout = 10 * time.Second
	// heartbeat lets both sides notice a dead TCP connection within ~2 intervals.
	heartbeat = 10 * time.Second
	// publishTimeout bounds one Publish/PublishAll call, including the wait for confirms, so a
	// blocked connection (memory or disk alarm) turns into an error instead of a hang.
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

// RabbitMQ is the port's RabbitMQ provider (AMQP 0-9-1): one connection for publishing, one for consuming (a memory
// alarm blocks publishing connections, and must not block the acks of consumers with them). It is
// safe for concurrent use.
type RabbitMQ struct {
	cfg    Config
	tls    *amqpTLS // nil for amqp://
	log    *zap.Logger
	metric *prometheus.CounterVec

	closed    chan struct{}
	closeOnce sync.Once
	watchers  sync.WaitGroup // goroutines draining connection and channel notifications

	// pubSem guards pub: acquiring it (a channel, so waiting respects ctx) is the right to replace
	// a dead publishing session.
	pubSem chan struct{}
	pub    *publisher

	conSem chan struct{}
	con    *amqp.Connection

	mu     sync.RWMutex
	routes map[string]*topology   // declared routes, re-declared on every new publishing connection
	stats  map[string]*routeStats // per route, created on first use

	tagSeq    uint64 // publish tags (see hdrPublishTag); guarded by tagMu
	tagMu     sync.Mutex
	consumers sync.WaitGroup // running Consume calls, waited for by Close
}

// dialRabbitMQ connects to RabbitMQ with a publishing and a consuming connection. It fails with a
// wrapped error if the broker is unreachable or the config is invalid.
func dialRabbitMQ(ctx context.Context, cfg Config) (*RabbitMQ, error) {
	if cfg.URL == "" {
		return nil, errors.New("mq: Config.URL is empty")
	}
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
	tlsCfg, err := newAMQPTLS(cfg.URL)
	if err != nil {
		return nil, err
	}
	metric, err := newMetric(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	b := &RabbitMQ{
		cfg:    cfg,
		tls:    tlsCfg,
		log:    cfg.Logger.With(zap.String("scope", cfg.Scope)),
		metric: metric,
		closed: make(chan struct{}),
		pubSem: make(chan struct{}, 1),
		conSem: make(chan struct{}, 1),
		routes: map[string]*topology{},
		stats:  map[string]*routeStats{},
	}
	if _, err := b.publisher(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("mq: connect: %w", err)
	}
	if _, err := b.consumeConn(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("mq: connect: %w", err)
	}
	return b, nil
}

// QueueName is the scoped queue name of a route: "<scope>.<route>".
func (b *RabbitMQ) QueueName(route string) string { return b.cfg.Scope + "." + route }

// Declare declares, for each route, its work queue, holding queues and DLQ, and remembers the routes
// so that reconnects declare them again. Declaring a route again with a different policy replaces
// the remembered one; the broker refuses (406) if that changes an existing queue's arguments.
func (b *RabbitMQ) Declare(ctx context.Context, routes ...Route) error {
	tops := make([]*topology, 0, len(routes))
	for _, r := range routes {
		t, err := plan(b.cfg.Scope, b.cfg.TimeScale, r)
		if err != nil {
			return err
		}
		tops = append(tops, t)
	}
	p, err := b.publisher(ctx)
	if err != nil {
		return fmt.Errorf("mq: declare: %w", err)
	}
	if err := declareAll(p.conn, tops); err != nil {
		return fmt.Errorf("mq: declare: %w", err)
	}
	b.noteDeclared()
	b.mu.Lock()
	for _, t := range tops {
		b.routes[t.route] = t
	}
	b.mu.Unlock()
	return nil
}

// DelayLevels are a declared route's delay levels as its holding queues apply them: scaled by
// Config.TimeScale, in whole milliseconds, ascending, without duplicates. Nil for a route without
// levels or not declared on this Broker. The largest is how far ahead a publisher can schedule
// through the broker; work due later belongs in the publisher's own store until it is that close.
func (b *RabbitMQ) DelayLevels(route string) []time.Duration {
	t, ok := b.topology(route)
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
func (b *RabbitMQ) DelayTolerance(route string) time.Duration {
	t, ok := b.topology(route)
	if !ok {
		return 0
	}
	return t.delayTolerance
}

// declareAll declares topologies on a throwaway channel, because a refused declaration closes it.
func declareAll(conn *amqp.Connection, tops []*topology) error {
	if len(tops) == 0 {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close() //nolint:errcheck // a throwaway channel; a close error changes nothing
	for _, t := range tops {
		if err := t.declare(ch); err != nil {
			return fmt.Errorf("route %q: %w", t.route, err)
		}
	}
	return nil
}

// Counters is a snapshot of a route's durability counters (zero for a route never used).
func (b *RabbitMQ) Counters(route string) Counters {
	b.mu.RLock()
	s := b.stats[route]
	b.mu.RUnlock()
	if s == nil {
		return Counters{}
	}
	return s.snapshot()
}

// Close closes both connections. Running Consume calls return ErrClosed; the broker redelivers
// whatever they had not settled. Close waits for them and for the port's own goroutines.
func (b *RabbitMQ) Close() error { return b.CloseContext(context.Background()) }

// CloseContext is Close bounded by ctx: a broker that does not answer the close, or a Consume
// whose handlers ignore their cancelled context, is not waited for past ctx's end (ctx.Err() is
// then returned). The connections are closed either way: the broker requeues what was unacked.
func (b *RabbitMQ) CloseContext(ctx context.Context) error {
	var errs []error
	b.closeOnce.Do(func() {
		b.mu.Lock() // orders close(b.closed) against Consume's b.consumers.Add
		close(b.closed)
		b.mu.Unlock()
		deadline := time.Now().Add(dialTimeout)
		if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
			deadline = dl
		}
		// A slot is held only while a connection is dialed, which ends by dialTimeout.
		if b.acquireUntil(ctx, b.pubSem) {
			if b.pub != nil && !b.pub.conn.IsClosed() {
				errs = append(errs, b.pub.conn.CloseDeadline(deadline))
			}
			<-b.pubSem
		}
		if b.acquireUntil(ctx, b.conSem) {
			if b.con != nil && !b.con.IsClosed() {
				errs = append(errs, b.con.CloseDeadline(deadline))
			}
			<-b.conSem
		}
		done := make(chan struct{})
		go func() {
			b.consumers.Wait()
			b.watchers.Wait()
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

// acquireUntil takes a one-slot semaphore unless ctx ends first.
func (b *RabbitMQ) acquireUntil(ctx context.Context, sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// startConsumer registers a Consume call with Close, unless the broker is already closed.
func (b *RabbitMQ) startConsumer() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.isClosed() {
		return ErrClosed
	}
	b.consumers.Add(1)
	return nil
}

func (b *RabbitMQ) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// topology returns a declared route.
func (b *RabbitMQ) topology(route string) (*topology, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	t, ok := b.routes[route]
	return t, ok
}

func (b *RabbitMQ) declared() []*topology {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]*topology, 0, len(b.routes))
	for _, t := range b.routes {
		out = append(out, t)
	}
	return out
}

func (b *RabbitMQ) routeStats(route string) *routeStats {
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

func (b *RabbitMQ) nextPublishTag() uint64 {
	b.tagMu.Lock()
	defer b.tagMu.Unlock()
	b.tagSeq++
	return b.tagSeq
}

// acquire takes a one-slot semaphore unless ctx ends or the broker closes first.
func (b *RabbitMQ) acquire(ctx context.Context, sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		if b.isClosed() {
			<-sem
			return ErrClosed
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.closed:
		return ErrClosed
	}
}

// dial opens one AMQP connection. The error never contains the URL: it carries the password.
// onBlocked, if not nil, hears connection.blocked (true) and connection.unblocked or close (false).
func (b *RabbitMQ) dial(ctx context.Context, purpose string, onBlocked func(bool)) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(b.cfg.Scope + "/" + purpose)
	var tlsCfg *tls.Config
	if b.tls != nil {
		tlsCfg = b.tls.config()
	}
	conn, err := amqp.DialConfig(b.cfg.URL, amqp.Config{
		Heartbeat:       heartbeat,
		Locale:          "en_US",
		Properties:      props,
		TLSClientConfig: tlsCfg, // the TLS handshake runs on the connection Dial returns, under its deadline
		// Recovery stays nil: amqp091-go's automatic recovery would resume consumers on a new
		// channel behind our back; we reconnect ourselves and track channel generations.
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if wrap := b.hooks().wrapConn; wrap != nil {
				c = wrap(purpose, c)
			}
			// The handshake has no heartbeat yet; amqp091-go clears this deadline once it is done.
			deadline := time.Now().Add(dialTimeout)
			if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
				deadline = dl
			}
			if err := c.SetDeadline(deadline); err != nil {
				c.Close() //nolint:errcheck // already failing
				return nil, err
			}
			return c, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s connection: %w", purpose, err)
	}
	b.watchConn(conn, purpose, onBlocked)
	return conn, nil
}

// watchConn drains the connection's close and blocked notifications: an undrained Notify channel
// stalls the library's reader, and with it the whole connection.
func (b *RabbitMQ) watchConn(conn *amqp.Connection, purpose string, onBlocked func(bool)) {
	if onBlocked == nil {
		onBlocked = func(bool) {}
	}
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	log := b.log.With(zap.String("connection", purpose))
	b.watchers.Add(1)
	go func() {
		defer b.watchers.Done()
		for {
			select {
			case err, ok := <-closes:
				if !ok {
					onBlocked(false) // release waiters: their publishes now fail on the closed channel
					return
				}
				log.Warn("mq connection closed", zap.Error(err))
			case bl, ok := <-blocks:
				if !ok {
					blocks = nil
					continue
				}
				onBlocked(bl.Active)
				if bl.Active {
					log.Warn("mq connection blocked by broker", zap.String("reason", bl.Reason))
				} else {
					log.Info("mq connection unblocked")
				}
			}
		}
	}()
}

// consumeConn returns the consuming connection, dialing a new one if it died.
func (b *RabbitMQ) consumeConn(ctx context.Context) (*amqp.Connection, error) {
	if err := b.acquire(ctx, b.conSem); err != nil {
		return nil, err
	}
	defer func() { <-b.conSem }()
	if b.con != nil && !b.con.IsClosed() {
		return b.con, nil
	}
	conn, err := b.dial(ctx, "consume", nil)
	if err != nil {
		return nil, err
	}
	b.con = conn
	return conn, nil
}
