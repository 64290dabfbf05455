package mq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// rabbitDriver is the port's RabbitMQ driver (AMQP 0-9-1, amqp091-go): one connection for
// publishing, one for consuming (a memory alarm blocks publishing connections, and must not block
// the acks of consumers with them). Every route is a quorum work queue with holding queues for its
// retry delays and delay levels, and a classic DLQ (names.go, declare).
type rabbitDriver struct {
	p        *port
	tls      *amqpTLS       // nil for amqp://
	log      *zap.Logger    // the port's
	watchers sync.WaitGroup // goroutines draining connection and channel notifications

	// pubSem guards pub: acquiring it (a channel, so waiting respects ctx) is the right to replace
	// a dead publishing session.
	pubSem chan struct{}
	pub    *publisher

	conSem chan struct{}
	con    *amqp.Connection

	tagSeq uint64 // publish tags (see hdrPublishTag); guarded by tagMu
	tagMu  sync.Mutex
}

// dialRabbitMQ connects the RabbitMQ driver with a publishing and a consuming connection. It
// fails with a wrapped error if the broker is unreachable or the URL is invalid.
func dialRabbitMQ(ctx context.Context, p *port) (*rabbitDriver, error) {
	if p.cfg.URL == "" {
		return nil, errors.New("mq: Config.URL is empty")
	}
	tlsCfg, err := newAMQPTLS(p.cfg.URL)
	if err != nil {
		return nil, err
	}
	b := &rabbitDriver{
		p:      p,
		tls:    tlsCfg,
		log:    p.log,
		pubSem: make(chan struct{}, 1),
		conSem: make(chan struct{}, 1),
	}
	if _, err := b.publisher(ctx); err != nil {
		b.close(ctx) //nolint:errcheck // already failing
		return nil, fmt.Errorf("mq: connect: %w", err)
	}
	if _, err := b.consumeConn(ctx); err != nil {
		b.close(ctx) //nolint:errcheck // already failing
		return nil, fmt.Errorf("mq: connect: %w", err)
	}
	return b, nil
}

// declare declares, for each route, its DLQ, work queue and holding queues (topology.declare).
func (b *rabbitDriver) declare(ctx context.Context, tops []*topology) error {
	p, err := b.publisher(ctx)
	if err != nil {
		return fmt.Errorf("mq: declare: %w", err)
	}
	if err := declareAll(p.conn, tops); err != nil {
		return fmt.Errorf("mq: declare: %w", err)
	}
	b.noteDeclared()
	return nil
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

// close closes both connections (the broker requeues what was unacked) and waits for the
// notification watchers, bounded by ctx.
func (b *rabbitDriver) close(ctx context.Context) error {
	var errs []error
	deadline := time.Now().Add(dialTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	// A slot is held only while a connection is dialed, which ends by dialTimeout.
	if acquireUntil(ctx, b.pubSem) {
		if b.pub != nil && !b.pub.conn.IsClosed() {
			errs = append(errs, b.pub.conn.CloseDeadline(deadline))
		}
		<-b.pubSem
	}
	if acquireUntil(ctx, b.conSem) {
		if b.con != nil && !b.con.IsClosed() {
			errs = append(errs, b.con.CloseDeadline(deadline))
		}
		<-b.conSem
	}
	done := make(chan struct{})
	go func() {
		b.watchers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("connection watchers still stopping: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// acquireUntil takes a one-slot semaphore unless ctx ends first.
func acquireUntil(ctx context.Context, sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// quorumArgs are the arguments of every quorum queue we declare, plus extra.
func quorumArgs(extra amqp.Table) amqp.Table {
	args := amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(deliveryLimit)}
	for k, v := range extra {
		args[k] = v
	}
	return args
}

// dlqArgs are the arguments of every DLQ. A DLQ is the one queue that must be classic, because
// listing it means fetching messages and handing them back (basic.get, then nack requeue=true),
// and on RabbitMQ 3.10.8 a quorum queue does that badly on all three counts we measured:
//   - every requeue counts against x-delivery-limit, so listing a quorum DLQ that has one would
//     eventually drop (or dead-letter) the very messages it is meant to keep;
//   - a quorum queue serves requeued messages first, in the order they were requeued, so once a
//     listing has fetched and requeued the whole DLQ, listing its head rotates it (measured: ids
//     0..9, list all, list 5, list again → 5..9, 0..4);
//   - basic.get on a quorum queue costs ~4 ms a message, against ~0.4 ms on a classic one.
//
// A classic queue puts a requeued message back in its original position and has no delivery
// limit, so a listing can neither lose nor reorder dead letters. The price: on a cluster a classic
// DLQ lives on one node (durable, on disk, but not replicated).
func dlqArgs() amqp.Table { return amqp.Table{"x-queue-type": "classic"} }

// deadLetterVia is what a quorum queue needs to dead-letter into exchange/key. At-least-once
// dead-lettering (RabbitMQ >= 3.10, quorum queues) keeps a message in its source queue until the
// target confirmed it; the broker requires x-overflow=reject-publish with it, and silently falls
// back to at-most-once without. Measured on 3.10.8: accepted, and an expired message arrives in
// the target queue.
//
// Hazard, measured on 3.10.8 (rabbitmq-server#16652): each such queue gets a DLX worker process
// under the broker-wide rabbit_fifo_dlx_sup. Deleting the queue within moments of creating it,
// while the worker is still checking out, crashes the worker twice, which shuts down
// rabbit_fifo_dlx_sup for the whole node: every at-least-once queue stops dead-lettering (retries
// stay in their holding queues) and new ones fail to declare with 541 INTERNAL_ERROR, until
// `rabbitmqctl eval 'supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup).'` or a node
// restart. So never delete a queue of the port right after declaring it (tests wait, see
// dlxWorkerGrace in the tests).
func deadLetterVia(exchange, key string) amqp.Table {
	return amqp.Table{
		"x-dead-letter-exchange":    exchange,
		"x-dead-letter-routing-key": key,
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	}
}

func declareQueue(ch *amqp.Channel, name string, args amqp.Table) error {
	_, err := ch.QueueDeclare(name, true, false, false, false, args)
	var ae *amqp.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed:
		// Typically a queue declared by an older version of the port with other arguments (DLQs
		// were quorum queues before they became classic). The broker cannot change a queue's
		// arguments: drain and delete it, or move to a new scope.
		return fmt.Errorf("declare queue %q: it exists with other arguments than %v: %w", name, args, err)
	default:
		return fmt.Errorf("declare queue %q: %w", name, err)
	}
}

// declare creates (or checks) the route's queues on ch. Dead-letter targets are
// declared before the queues that dead-letter into them. A mismatch with an existing queue's
// arguments closes ch with 406 PRECONDITION_FAILED, so callers use a channel they can throw away.
func (t *topology) declare(ch *amqp.Channel) error {
	if err := declareQueue(ch, t.dlq, dlqArgs()); err != nil {
		return err
	}
	// The work queue dead-letters only what the broker gives up on (x-delivery-limit), so even a
	// message that crashes every consumer ends up inspectable in the DLQ, with x-death saying why.
	if err := declareQueue(ch, t.queue, quorumArgs(deadLetterVia("", t.dlq))); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, name := range t.retryQueues {
		if seen[name] {
			continue
		}
		seen[name] = true
		if err := declareHolding(ch, name, t.retryTTLs[i], t.queue); err != nil {
			return err
		}
	}
	for i, name := range t.delayQueues {
		if err := declareHolding(ch, name, t.delayTTLs[i], t.queue); err != nil {
			return err
		}
	}
	return nil
}

// declareHolding declares a holding queue: quorum, a per-queue TTL, and at-least-once
// dead-lettering of every expired message back to the work queue. Retry and delay levels are both
// holding queues; they differ only in name and in who publishes into them.
func declareHolding(ch *amqp.Channel, name string, ttl time.Duration, workQueue string) error {
	// Never x-expires here: a holding queue has no consumer, publishing does not renew it, and an
	// expired queue is deleted with its messages, nothing dead-lettered.
	args := deadLetterVia("", workQueue)
	args["x-message-ttl"] = ttl.Milliseconds()
	return declareQueue(ch, name, quorumArgs(args))
}

func (b *rabbitDriver) isClosed() bool { return b.p.isClosed() }

func (b *rabbitDriver) hooks() *testHooks { return b.p.hooks() }

func (b *rabbitDriver) noteDeclared() { b.p.noteDeclared() }

func (b *rabbitDriver) nextPublishTag() uint64 {
	b.tagMu.Lock()
	defer b.tagMu.Unlock()
	b.tagSeq++
	return b.tagSeq
}

// acquire takes a one-slot semaphore unless ctx ends or the broker closes first.
func (b *rabbitDriver) acquire(ctx context.Context, sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		if b.isClosed() {
			<-sem
			return ErrClosed
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.p.closed:
		return ErrClosed
	}
}

// dial opens one AMQP connection. The error never contains the URL: it carries the password.
// onBlocked, if not nil, hears connection.blocked (true) and connection.unblocked or close (false).
func (b *rabbitDriver) dial(ctx context.Context, purpose string, onBlocked func(bool)) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(b.p.cfg.Scope + "/" + purpose)
	var tlsCfg *tls.Config
	if b.tls != nil {
		tlsCfg = b.tls.config()
	}
	conn, err := amqp.DialConfig(b.p.cfg.URL, amqp.Config{
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
func (b *rabbitDriver) watchConn(conn *amqp.Connection, purpose string, onBlocked func(bool)) {
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
func (b *rabbitDriver) consumeConn(ctx context.Context) (*amqp.Connection, error) {
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
