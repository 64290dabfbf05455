package mq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

// subscription is one channel with one consumer on it. Its deliveries may only be settled on it:
// once it is dead, results for its deliveries are superseded (RabbitMQ closes a channel that acks
// a tag it does not know, so they are never tried on the next subscription).
type subscription struct {
	ch         *amqp.Channel
	tag        string
	gen        uint64
	deliveries <-chan amqp.Delivery
	closes     chan *amqp.Error
	// down is closed once amqp091-go has shut the channel down (its NotifyClose channels are
	// closed then, whatever the cause): a settle error can be told apart without polling.
	down chan struct{}
	dead atomic.Bool
}

// job is one delivery on its way to a worker.
type job struct {
	c   *consumer
	sub *subscription
	d   amqp.Delivery
	msg *Message
}

// settlement is a worker's verdict on a job, settled by the owner goroutine: actAck is basic.ack,
// actRequeue basic.nack requeue=true, actNone nothing (the job's channel is gone).
type settlement struct {
	verdict
	job   *job
	probe bool // a diagnostic probe: settled, never counted
}

// consumer is one Consume call. Its owner goroutine (the caller of Consume) owns the channel:
// it receives deliveries, hands them to workers, and does every ack and nack, so no two
// goroutines ever write to the channel and acks never use multiple=true.
type consumer struct {
	// rules are the shared handler-return rules; their context, halt and copying are also the
	// shutdown's.
	*rules
	b     *rabbitDriver
	top   *topology
	stop  context.CancelFunc
	grace time.Duration // how long handlers get to return once their context is cancelled
	jobs  chan *job
	res   chan settlement
	gone  chan struct{} // closed when the owner stops receiving settlements
	gen   uint64
	queue []*job // received, not yet taken by a worker
	busy  int    // jobs received and not yet settled (queued or in a worker)
}

// consume runs one Consume call: its owner goroutine (the caller of Consume) owns the channel.
func (b *rabbitDriver) consume(ctx context.Context, top *topology, r *rules, stop context.CancelFunc, grace time.Duration, concurrency int) error {
	c := &consumer{
		rules: r,
		b:     b,
		top:   top,
		stop:  stop,
		grace: grace,
		jobs:  make(chan *job),
		res:   make(chan settlement),
		gone:  make(chan struct{}),
	}
	var workers sync.WaitGroup
	for range concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			c.work()
		}()
	}
	return c.run(ctx, &workers)
}

// run is the owner loop.
func (c *consumer) run(ctx context.Context, workers *sync.WaitGroup) error {
	var sub *subscription
	attempt := 0
	retry := time.NewTimer(0) // subscribe at once
	defer retry.Stop()
	for {
		var deliveries <-chan amqp.Delivery
		var retryC <-chan time.Time
		if sub != nil {
			deliveries = sub.deliveries
		} else {
			retryC = retry.C
		}
		var jobs chan *job
		var next *job
		if len(c.queue) > 0 {
			jobs, next = c.jobs, c.queue[0]
		}
		select {
		case <-ctx.Done():
			c.shutdown(sub, workers)
			return nil
		case <-c.b.p.closed:
			c.abandon(sub, workers)
			return ErrClosed
		case <-retryC:
			s, err := c.subscribe(ctx)
			if err != nil {
				if ctx.Err() != nil || c.b.isClosed() {
					continue // the loop takes the matching exit
				}
				attempt++
				wait := backoff(attempt)
				c.log.Warn("mq subscribe failed; retrying", zap.Int("attempt", attempt),
					zap.Duration("backoff", wait), zap.Error(err))
				retry.Reset(wait)
				continue
			}
			if attempt > 0 {
				c.log.Info("mq consumer resubscribed", zap.Uint64("generation", s.gen))
			}
			attempt = 0
			sub = s
			if h := c.b.hooks().subscribed; h != nil {
				h(c.top.route, s.gen)
			}
		case d, ok := <-deliveries:
			if !ok {
				c.lose(sub)
				sub = nil
				attempt++
				retry.Reset(backoff(attempt))
				continue
			}
			c.busy++
			if isProbe(&d) {
				// Answered off the owner goroutine (the reply waits for a confirm), settled here.
				j := &job{c: c, sub: sub, d: d, msg: &Message{ID: d.MessageId, Route: c.top.route}}
				workers.Add(1)
				go func() {
					defer workers.Done()
					c.answerProbe(j)
				}()
				continue
			}
			c.queue = append(c.queue, &job{c: c, sub: sub, d: d, msg: newMessage(c.top.route, &d)})
		case jobs <- next:
			c.queue[0] = nil
			c.queue = c.queue[1:]
		case s := <-c.res:
			c.busy--
			c.settle(sub, s)
		}
	}
}

// backoff is exponential from 100 ms, capped at 5 s, with jitter in [d/2, d) so that consumers
// cut off together do not reconnect together.
func backoff(attempt int) time.Duration {
	d := backoffMin << min(attempt-1, 10)
	d = min(d, backoffMax)
	return d/2 + rand.N(d/2)
}

// subscribe opens a channel on the consuming connection, declares the route, sets per-consumer
// prefetch and starts consuming.
func (c *consumer) subscribe(ctx context.Context) (*subscription, error) {
	conn, err := c.b.consumeConn(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	fail := func(err error) (*subscription, error) {
		ch.Close() //nolint:errcheck // already failing
		return nil, err
	}
	// Buffered: amqp091-go sends at most one error, then closes the channel; lose() reads it.
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	down := make(chan struct{})
	watch := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		// amqp091-go closes watch when the channel shuts down, whatever the cause.
		for range watch {
		}
		close(down)
	}()
	// The queues may be gone (deleted, or a broker that lost its state): declare before consuming.
	if err := c.top.declare(ch); err != nil {
		return fail(err)
	}
	c.b.noteDeclared()
	// Per-consumer prefetch: global QoS (global=true) on a quorum queue closes the connection.
	if err := ch.Qos(c.top.prefetch, 0, false); err != nil {
		return fail(fmt.Errorf("set prefetch: %w", err))
	}
	tag := fmt.Sprintf("%s-%s", c.top.queue, uuid.NewString()[:8])
	// Plain Consume, not ConsumeWithContext: the latter cancels the consumer from a goroutine of
	// its own when ctx ends, racing our ordered shutdown.
	deliveries, err := ch.Consume(c.top.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fail(fmt.Errorf("consume %q: %w", c.top.queue, err))
	}
	c.gen++
	return &subscription{ch: ch, tag: tag, gen: c.gen, deliveries: deliveries, closes: closes, down: down}, nil
}

// lose retires a subscription whose delivery stream ended (channel or connection closed, or the
// broker cancelled the consumer because the queue was deleted). The broker requeues everything
// unacked on it; queued jobs are dropped and results still in workers will be superseded.
func (c *consumer) lose(sub *subscription) {
	sub.dead.Store(true)
	var reason error
	select {
	case e, ok := <-sub.closes:
		if ok && e != nil {
			reason = e
		}
	default:
	}
	if !sub.ch.IsClosed() {
		sub.ch.Close() //nolint:errcheck // retiring it either way
	}
	dropped := c.dropQueued(sub)
	var ae *amqp.Error
	if errors.As(reason, &ae) && ourFault(ae.Code) {
		// What settling a stale delivery tag on a live channel looks like (406 PRECONDITION_FAILED
		// "unknown delivery tag"): acks are not answered, so the settle that caused it was counted
		// when it was written. On a consuming channel settles are all the port sends, so one of
		// them did not land: count it lost — the account must show the bug — and say so loudly.
		c.st.inc(evLost)
		c.log.Error("mq consumer channel closed by the broker for a protocol error of ours",
			zap.Uint64("generation", sub.gen), zap.Int("code", ae.Code), zap.Error(reason))
	}
	c.log.Warn("mq consumer lost its channel; resubscribing", zap.Uint64("generation", sub.gen),
		zap.Int("superseded", dropped), zap.Error(reason))
}

// dropQueued removes the not-yet-started jobs of sub, counting them superseded.
func (c *consumer) dropQueued(sub *subscription) int {
	kept := c.queue[:0]
	dropped := 0
	for _, j := range c.queue {
		if j.sub == sub {
			dropped++
			continue
		}
		kept = append(kept, j)
	}
	clear(c.queue[len(kept):])
	c.queue = kept
	c.busy -= dropped
	c.st.add(evSuperseded, dropped)
	return dropped
}

// settle applies a worker's verdict on the current subscription's channel, and only there.
func (c *consumer) settle(cur *subscription, s settlement) {
	j := s.job
	count := func(e event) {
		if !s.probe {
			c.st.inc(e)
		}
	}
	if s.act == actNone || j.sub != cur || j.sub.dead.Load() {
		count(evSuperseded)
		return
	}
	if h := c.b.hooks().settling; h != nil && !s.probe {
		h(c.top.route, &j.d)
	}
	var err error
	if s.act == actAck {
		err = j.d.Ack(false)
	} else {
		err = j.d.Nack(false, true)
	}
	if err == nil {
		count(s.ev)
		if s.rejected {
			count(evRejected)
		}
		if h := c.b.hooks().settled; h != nil && !s.probe {
			h(c.top.route, j.msg.ID, s.ev)
		}
		return
	}
	c.settleFailed(j.sub, err, func(torn bool) {
		if torn {
			// The channel or its connection was going away under us; lose() will notice. The
			// broker redelivers.
			count(evSuperseded)
			c.log.Debug("mq settle failed on a channel being torn down; superseded",
				zap.String("message_id", j.msg.ID), zap.Uint64("generation", j.sub.gen), zap.Error(err))
			return
		}
		count(evLost)
		c.log.Error("mq settle failed on a live channel", zap.String("message_id", j.msg.ID),
			zap.Int("attempt", j.msg.Attempt), zap.Error(err))
	})
}

// tornDownWait is how long a settle error that could be either is given to show whether the
// channel is closing: amqp091-go starts the shutdown of a connection whose socket write failed in
// a goroutine of its own, so the channel may not say it is closed at the instant the error comes
// back. The wait runs off the owner goroutine (see settleFailed).
const tornDownWait = 100 * time.Millisecond

type settleFault uint8

const (
	faultTornDown settleFault = iota // the channel or connection is going away: superseded
	faultOurs                        // a protocol error of the port's own (a bug): lost
	faultUnknown                     // neither known: decided by whether the channel closes soon
)

// ourFault reports whether an AMQP exception code says the port itself sent something wrong —
// acked an unknown delivery tag (406 PRECONDITION_FAILED), used a queue or exchange that is not
// there, a malformed or out-of-order frame — rather than that the broker, the operator or the
// network took the channel or connection away (320 CONNECTION_FORCED, 501 FRAME_ERROR, which is
// also how amqp091-go reports a failed socket write, 506 RESOURCE_ERROR, 541 INTERNAL_ERROR).
func ourFault(code int) bool {
	switch code {
	case amqp.ContentTooLarge, amqp.InvalidPath, amqp.AccessRefused, amqp.NotFound, amqp.ResourceLocked,
		amqp.PreconditionFailed, amqp.SyntaxError, amqp.CommandInvalid, amqp.ChannelError,
		amqp.UnexpectedFrame, amqp.NotAllowed, amqp.NotImplemented:
		return true
	}
	return false
}

// classifySettle says what a settle's error on sub means. amqp091-go answers ErrClosed once it
// knows the channel or connection is closed; before it does, a write on a dying socket fails with
// the socket's error (broken pipe, connection reset, use of a closed connection, EOF, a deadline),
// and an exception the broker sent comes back as an *amqp.Error — torn down, unless its code is a
// protocol error of ours (ourFault), which is a bug to count as lost, not hide as superseded. It
// never waits: anything else is faultUnknown, unless the channel is already known to be down.
func classifySettle(sub *subscription, err error) settleFault {
	if errors.Is(err, amqp.ErrClosed) || sub.dead.Load() {
		return faultTornDown
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		if ourFault(ae.Code) {
			return faultOurs
		}
		return faultTornDown
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.ErrClosedPipe) {
		return faultTornDown
	}
	if sub.ch.IsClosed() || isDone(sub.down) {
		return faultTornDown
	}
	return faultUnknown
}

// settleFailed calls decided with whether a failed settle on sub is a teardown (true) or a loss.
// A known error is decided at once, on the caller's (the owner's) goroutine; an unknown one in a
// goroutine of its own, which waits up to tornDownWait for the channel to shut down, so that the
// owner goroutine never stalls on it. decided must be safe to call from another goroutine.
func (c *consumer) settleFailed(sub *subscription, err error, decided func(torn bool)) {
	switch classifySettle(sub, err) {
	case faultTornDown:
		decided(true)
	case faultOurs:
		decided(false)
	default:
		go func() {
			t := time.NewTimer(tornDownWait)
			defer t.Stop()
			select {
			case <-sub.down: // nil for a subscription without one: the timer decides
				decided(true)
			case <-t.C:
				decided(sub.ch.IsClosed())
			}
		}()
	}
}

// shutdown is the owner's exit on ctx cancellation: stop taking deliveries, let the running
// handlers finish (until the handlers' context ends, then at most the grace), settle what they
// return, and give everything else back to the broker.
func (c *consumer) shutdown(sub *subscription, workers *sync.WaitGroup) {
	close(c.halt) // workers start no handler from now on
	alive := sub != nil && !sub.dead.Load()
	if alive && !c.cancelConsumer(sub) {
		alive = false
	}
	if alive {
		// amqp091-go handed over what it had buffered and closed the delivery channel.
		for d := range sub.deliveries {
			c.requeue(sub, &d)
		}
		// lose() already dropped the queued jobs of earlier subscriptions: these are all sub's.
		for _, j := range c.queue {
			c.requeue(sub, &j.d)
		}
	} else {
		c.st.add(evSuperseded, len(c.queue))
	}
	c.busy -= len(c.queue)
	c.queue = nil
	close(c.jobs)
	if c.busy > 0 {
		c.log.Info("mq consumer stopped taking deliveries; waiting for running handlers", zap.Int("handlers", c.busy))
	}

	// Workers check halt before calling a handler and turn a cancelled non-Ack into a requeue, so
	// what comes back now is final.
	var graceC, copiesC <-chan time.Time
	workDone := c.ctx.Done()
	abandoned := false
wait:
	for c.busy > 0 {
		select {
		case s := <-c.res:
			c.busy--
			c.settle(sub, s)
			if copiesC != nil && c.copying.Load() == 0 && c.busy > 0 {
				c.log.Error("mq handlers did not return within the shutdown grace; leaving them to the broker",
					zap.Int("handlers", c.busy), zap.Duration("grace", c.grace))
				abandoned = true
				break wait
			}
		case <-workDone:
			workDone = nil
			c.log.Warn("mq handlers still running when their context was cancelled", zap.Int("handlers", c.busy),
				zap.Duration("grace", c.grace))
			grace := time.NewTimer(c.grace)
			defer grace.Stop()
			graceC = grace.C
		case <-graceC:
			graceC = nil
			if n := c.copying.Load(); n > 0 {
				// A retry, defer or dead-letter copy is still being confirmed: abandoning now would
				// close the channel, so the broker requeues the original, and the copy, once
				// confirmed, would stand beside it. Wait for the copies — each is bounded by
				// publishTimeout from its start, which was before the work context ended — and
				// abandon the other handlers once they are settled. The service's hard bound
				// still holds: its broker close (c.b.p.closed) ends this wait.
				c.log.Warn("mq shutdown grace over with copies still being confirmed; waiting for them",
					zap.Int32("copies", n), zap.Duration("at_most", publishTimeout))
				copies := time.NewTimer(publishTimeout)
				defer copies.Stop()
				copiesC = copies.C
				continue
			}
			c.log.Error("mq handlers did not return within the shutdown grace; leaving them to the broker",
				zap.Int("handlers", c.busy), zap.Duration("grace", c.grace))
			abandoned = true
			break wait
		case <-copiesC:
			c.log.Error("mq copies not confirmed within the publish timeout; leaving their originals to the broker",
				zap.Int32("copies", c.copying.Load()), zap.Int("handlers", c.busy))
			abandoned = true
			break wait
		case <-c.b.p.closed:
			// The connection is gone: the broker requeues everything; nothing is left to settle.
			c.st.add(evSuperseded, c.busy)
			abandoned = true
			break wait
		}
	}
	c.stop()
	close(c.gone)
	if alive {
		// Anything still unsettled goes back to the broker with the channel.
		c.closeChannel(sub)
	}
	if !abandoned {
		// Every job is settled and jobs is closed: the workers are returning.
		workers.Wait()
		return
	}
	c.awaitWorkers(workers, time.Second)
}

// cancelConsumer cancels sub's broker consumer, so that the broker sends nothing more. A broker
// that does not answer within the grace is not waited for: the channel is closed instead (its
// deliveries go back to the broker with it). It reports whether sub is still usable.
func (c *consumer) cancelConsumer(sub *subscription) bool {
	done := make(chan error, 1)
	go func() { done <- sub.ch.Cancel(sub.tag, false) }()
	t := time.NewTimer(c.grace)
	defer t.Stop()
	var err error
	select {
	case err = <-done:
	case <-t.C:
		err = fmt.Errorf("no answer within %v", c.grace)
	case <-c.b.p.closed:
		err = ErrClosed
	}
	if err == nil {
		return true
	}
	c.log.Warn("mq consumer cancel failed; closing its channel", zap.Uint64("generation", sub.gen), zap.Error(err))
	sub.dead.Store(true)
	c.closeChannel(sub)
	// Closing the channel ends the call, but against a silent broker only when amqp091-go's
	// heartbeats notice the connection is dead: wait no longer than another grace, or the Broker's
	// close. The call's goroutine returns when the connection goes (done is buffered).
	t.Reset(c.grace)
	select {
	case <-done:
	case <-t.C:
		c.log.Warn("mq consumer cancel still unanswered after its channel's close; leaving it to the connection",
			zap.Uint64("generation", sub.gen))
	case <-c.b.p.closed:
	}
	return false
}

// closeChannel closes sub's channel, waiting for the broker's answer at most the grace.
func (c *consumer) closeChannel(sub *subscription) {
	if sub.ch.IsClosed() {
		return
	}
	done := make(chan struct{})
	go func() {
		sub.ch.Close() //nolint:errcheck // closing is the point; the broker requeues what is unacked
		close(done)
	}()
	t := time.NewTimer(c.grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.log.Warn("mq channel close not answered within the grace; leaving it to the connection")
	case <-c.b.p.closed:
	}
}

// abandon is the owner's exit when the Broker is closed: the connection is gone, so the broker
// requeues everything; there is nothing left to settle.
func (c *consumer) abandon(sub *subscription, workers *sync.WaitGroup) {
	close(c.halt)
	c.stop()
	if sub != nil {
		sub.dead.Store(true)
	}
	c.st.add(evSuperseded, len(c.queue))
	c.queue = nil
	close(c.jobs)
	close(c.gone)
	c.awaitWorkers(workers, c.grace)
}

// awaitWorkers waits for the worker goroutines to return, at most d: a handler that ignores its
// cancelled context must not hold up the service's exit.
func (c *consumer) awaitWorkers(workers *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() {
		workers.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.log.Error("mq handlers still running after the consumer stopped", zap.Duration("waited", d))
	}
}

// requeue returns a delivery of sub at shutdown, on the owner goroutine.
func (c *consumer) requeue(sub *subscription, d *amqp.Delivery) {
	err := d.Nack(false, true)
	if err == nil {
		c.st.inc(evRequeued)
		return
	}
	id := d.MessageId
	c.settleFailed(sub, err, func(torn bool) {
		if torn {
			c.st.inc(evSuperseded)
			return
		}
		c.st.inc(evLost)
		c.log.Error("mq requeue failed on a live channel", zap.String("message_id", id), zap.Error(err))
	})
}

// work is one worker goroutine: it runs handlers and sends verdicts back to the owner.
func (c *consumer) work() {
	for j := range c.jobs {
		s := c.handle(j)
		select {
		case c.res <- s:
		case <-c.gone:
		}
	}
}

// handle runs the shared rules on one job (on a worker goroutine): the verdict, with any copy
// already confirmed, goes to the owner to settle.
func (c *consumer) handle(j *job) settlement {
	return settlement{job: j, verdict: c.rules.handle(j)}
}

// job is a delivery of the rules (rules.go).
func (j *job) message() *Message { return j.msg }

// stale: the delivery's channel is dead, so the broker has requeued it (or will, on close).
func (j *job) stale() bool { return j.sub.dead.Load() }

// sendCopy publishes a copy of the AMQP delivery — same identity and properties, without the
// broker's headers — to the order's destination: the route's retry holding queue for the attempt,
// its delay holding queue for the deferral, or its DLQ; mandatory, and confirmed.
func (j *job) sendCopy(ctx context.Context, o copyOrder) (string, error) {
	c := j.c
	pub := copyOf(&j.d)
	o.apply(pub.Headers)
	exchange, key := "", ""
	switch o.kind {
	case copyRetry:
		key = c.top.retryQueue(o.attempt)
	case copyDefer:
		key, _, _ = c.top.delayQueue(o.delay) // o.delay >= the smallest level: see rules.holdsDefer
	case copyDeadLetter:
		key = c.top.dlq
	default:
		return "", fmt.Errorf("mq: copy of unknown kind %d", o.kind)
	}
	return key, c.b.publishCopy(ctx, exchange, key, pub)
}
