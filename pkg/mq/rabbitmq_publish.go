package mq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// Publish errors, wrapped with the route and message id. Any publish error means "not known to be
// stored": publish again (a duplicate is possible; consumers dedupe on the message id).
var (
	// ErrUnroutable: the broker returned the message (mandatory): no queue by that name. Declare
	// the route first.
	ErrUnroutable = errors.New("mq: message returned as unroutable")
	// ErrNacked: the broker refused the message (basic.nack), e.g. a full queue with reject-publish.
	ErrNacked = errors.New("mq: message nacked by broker")
	// ErrUnconfirmed: the channel closed before the broker confirmed; the outcome is unknown.
	ErrUnconfirmed = errors.New("mq: channel closed before the broker confirmed")
)

// publisher is one publishing connection with its confirm-mode channel. It is replaced as a whole
// when either dies.
type publisher struct {
	b    *rabbitDriver
	conn *amqp.Connection
	ch   *amqp.Channel
	// lock serialises basic.publish on ch (a channel's frames must not interleave, and confirm
	// sequence numbers follow publish order). It is held only while writing, never while waiting
	// for confirms, so concurrent publishers pipeline.
	lock chan struct{}

	returns chan amqp.Return
	// barrier lets a waiter make sure every basic.return that arrived before its confirm has been
	// recorded: the broker sends the return before the ack, amqp091-go hands both over in order,
	// but the drain goroutine may not have looked at the return yet.
	barrier chan chan struct{}
	drained chan struct{} // closed when the drain goroutine exits (the channel is gone)

	mu      sync.Mutex
	pending map[uint64]bool // publish tag → returned

	blockMu sync.Mutex
	// unblocked is non-nil while the broker blocks the connection (a memory or disk alarm), and
	// closed when it lifts. Publishes wait for it instead of writing into a socket the broker has
	// stopped reading, where no context could reach them.
	unblocked chan struct{}
}

// flight is one publish awaiting its confirm.
type flight struct {
	tag uint64
	dc  *amqp.DeferredConfirmation
	err error
}

// publish publishes messages to queue, or to the holding queue of a message's delay level
// (mandatory: a publish no queue takes comes back), pipelined: all are published, then all
// confirms awaited. A returned (unroutable), nacked or unconfirmed publish is an error.
func (b *rabbitDriver) publish(ctx context.Context, queue string, msgs []envelope) ([]sendResult, error) {
	p, err := b.publisher(ctx)
	if err != nil {
		return nil, err
	}
	flights := make([]flight, len(msgs))
	for i, m := range msgs {
		pub, err := publishing(m)
		if err != nil {
			flights[i].err = err
			continue
		}
		key := queue
		if m.delay > 0 {
			key = delayQueueName(queue, m.delay)
		}
		flights[i] = p.send(ctx, "", key, pub)
	}
	sent := make([]sendResult, len(msgs))
	for i, err := range p.await(ctx, flights) {
		sent[i] = sendResult{written: flights[i].dc != nil, err: err}
	}
	return sent, nil
}

// publishTo publishes one message of the port's own (a retry or dead-letter copy, a redriven dead
// letter, a probe or its reply) to exchange/key, mandatory, and waits for its confirm. It is not
// counted as an application publish.
func (b *rabbitDriver) publishTo(ctx context.Context, exchange, key string, pub amqp.Publishing) error {
	p, err := b.publisher(ctx)
	if err != nil {
		return err
	}
	return p.await(ctx, []flight{p.send(ctx, exchange, key, pub)})[0]
}

// publishCopy is publishTo for the copy that decides whether an original is acked: a retry or a
// dead letter. The test hooks around it let tests lose the confirm.
func (b *rabbitDriver) publishCopy(ctx context.Context, exchange, key string, pub amqp.Publishing) error {
	p, err := b.publisher(ctx)
	if err != nil {
		return err
	}
	f := writeCopy(b.hooks(), key, func() flight { return p.send(ctx, exchange, key, pub) })
	return p.await(ctx, []flight{f})[0]
}

// publishing is an application message as a persistent Publishing.
func publishing(m envelope) (amqp.Publishing, error) {
	h := amqp.Table(m.headers)
	if err := h.Validate(); err != nil {
		return amqp.Publishing{}, fmt.Errorf("headers: %w", err)
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  m.contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.id,
		Timestamp:    time.Now().UTC(),
		Body:         m.body,
	}, nil
}

// publisher returns the live publishing session, replacing a dead one. A new session declares
// every remembered route again before it is used, so a queue deleted while we were cut off exists
// again before the first publish (which would otherwise come back as unroutable).
func (b *rabbitDriver) publisher(ctx context.Context) (*publisher, error) {
	if err := b.acquire(ctx, b.pubSem); err != nil {
		return nil, err
	}
	defer func() { <-b.pubSem }()
	if b.pub != nil && b.pub.alive() {
		return b.pub, nil
	}
	if b.pub != nil {
		b.pub.close() //nolint:errcheck // already dead
		b.pub = nil
		b.log.Info("mq publishing connection reconnecting")
	}
	p := &publisher{
		b:       b,
		lock:    make(chan struct{}, 1),
		returns: make(chan amqp.Return, 256),
		barrier: make(chan chan struct{}),
		drained: make(chan struct{}),
		pending: map[uint64]bool{},
	}
	conn, err := b.dial(ctx, "publish", p.setBlocked)
	if err != nil {
		return nil, err
	}
	if err := declareAll(conn, b.p.declared()); err != nil {
		conn.Close() //nolint:errcheck // already failing
		return nil, fmt.Errorf("re-declare topology: %w", err)
	}
	b.noteDeclared()
	ch, err := conn.Channel()
	if err != nil {
		conn.Close() //nolint:errcheck // already failing
		return nil, fmt.Errorf("open publishing channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close() //nolint:errcheck // already failing
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	p.conn, p.ch = conn, ch
	// Buffered and always drained: amqp091-go gives up on (drops) a notification that is not
	// taken within 5 s, and a dropped return would pass for a confirmed publish.
	ch.NotifyReturn(p.returns)
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	b.watchers.Add(1)
	go p.drain(closes)
	b.pub = p
	return p, nil
}

func (p *publisher) alive() bool { return !p.ch.IsClosed() && !p.conn.IsClosed() }

func (p *publisher) setBlocked(active bool) {
	p.blockMu.Lock()
	defer p.blockMu.Unlock()
	switch {
	case active && p.unblocked == nil:
		p.unblocked = make(chan struct{})
	case !active && p.unblocked != nil:
		close(p.unblocked)
		p.unblocked = nil
	}
}

func (p *publisher) waitUnblocked(ctx context.Context) error {
	p.blockMu.Lock()
	unblocked := p.unblocked
	p.blockMu.Unlock()
	if unblocked == nil {
		return nil
	}
	select {
	case <-unblocked:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("connection blocked by the broker (resource alarm): %w", ctx.Err())
	}
}

func (p *publisher) close() error {
	if p.conn.IsClosed() {
		return nil
	}
	return p.conn.Close()
}

// send writes one publish to exchange with routing key. msg.Headers must be a map the caller owns:
// the publish tag is added.
func (p *publisher) send(ctx context.Context, exchange, key string, msg amqp.Publishing) flight {
	tag := p.b.nextPublishTag()
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	msg.Headers[hdrPublishTag] = int64(tag)
	if err := p.waitUnblocked(ctx); err != nil {
		return flight{err: err}
	}
	p.mu.Lock()
	p.pending[tag] = false
	p.mu.Unlock()
	if err := p.b.acquire(ctx, p.lock); err != nil {
		p.forget(tag)
		return flight{err: fmt.Errorf("publish: %w", err)}
	}
	// mandatory=true: a publish no queue takes comes back as basic.return instead of vanishing.
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	<-p.lock
	if err != nil {
		p.forget(tag)
		return flight{err: fmt.Errorf("publish: %w", err)}
	}
	return flight{tag: tag, dc: dc}
}

// await waits for the confirms of flights, then for any returns, and gives one error per flight.
func (p *publisher) await(ctx context.Context, flights []flight) []error {
	errs := make([]error, len(flights))
	acked := false
	for i := range flights {
		f := &flights[i]
		if f.err != nil {
			errs[i] = f.err
			continue
		}
		select {
		case <-f.dc.Done():
		default:
			select {
			case <-f.dc.Done():
			case <-ctx.Done():
				errs[i] = fmt.Errorf("await confirm: %w", ctx.Err())
				p.forget(f.tag)
				continue
			}
		}
		if f.dc.Acked() {
			acked = true
			continue
		}
		p.forget(f.tag)
		if p.ch.IsClosed() {
			// A closed channel resolves pending confirms as not acked: we cannot tell a nack.
			errs[i] = ErrUnconfirmed
		} else {
			errs[i] = ErrNacked
		}
	}
	if !acked {
		return errs
	}
	// The broker sends basic.return before the confirm; make sure the drain goroutine has seen it.
	syncErr := p.syncReturns(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, f := range flights {
		if errs[i] != nil {
			continue
		}
		returned := p.pending[f.tag]
		delete(p.pending, f.tag)
		switch {
		case returned:
			errs[i] = ErrUnroutable
		case syncErr != nil:
			errs[i] = fmt.Errorf("await return check: %w", syncErr)
		}
	}
	return errs
}

func (p *publisher) forget(tag uint64) {
	p.mu.Lock()
	delete(p.pending, tag)
	p.mu.Unlock()
}

// syncReturns returns once every basic.return received so far has been recorded.
func (p *publisher) syncReturns(ctx context.Context) error {
	reply := make(chan struct{})
	select {
	case p.barrier <- reply:
	case <-p.drained:
		return nil // the drain goroutine recorded everything before it exited
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-reply:
	case <-p.drained:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// drain records returns, answers barriers and logs the channel's close, until the channel is gone.
func (p *publisher) drain(closes chan *amqp.Error) {
	defer p.b.watchers.Done()
	defer close(p.drained)
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return
			}
			p.record(&r)
		case reply := <-p.barrier:
			open := p.drainBuffered()
			close(reply)
			if !open {
				return
			}
		case err, ok := <-closes:
			if !ok {
				closes = nil
				continue
			}
			p.b.log.Warn("mq publishing channel closed", zap.Error(err))
		}
	}
}

// drainBuffered records the returns already buffered; false once the returns channel is closed.
func (p *publisher) drainBuffered() bool {
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return false
			}
			p.record(&r)
		default:
			return true
		}
	}
}

func (p *publisher) record(r *amqp.Return) {
	p.b.log.Warn("mq publish returned by broker",
		zap.String("queue", r.RoutingKey),
		zap.String("message_id", r.MessageId),
		zap.Uint16("reply_code", r.ReplyCode),
		zap.String("reply_text", r.ReplyText))
	tag, ok := r.Headers[hdrPublishTag].(int64)
	if !ok {
		return
	}
	p.mu.Lock()
	if _, waiting := p.pending[uint64(tag)]; waiting {
		p.pending[uint64(tag)] = true
	}
	p.mu.Unlock()
}
