package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	plog "github.com/integrations-platform/integrations/pkg/log"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// consume runs one Consume call on the consuming connection: a channel per subscription, the
// route declared on it before consuming, per-consumer prefetch, and every settlement on the
// channel its delivery came from.
func (b *rabbitDriver) consume(ctx context.Context, c *consumer) error {
	return run(ctx, c, &rabbitLink{b: b, c: c})
}

// rabbitLink is one Consume call's hold on RabbitMQ: its subscriptions, one at a time, each a
// channel of the consuming connection.
type rabbitLink struct {
	b   *rabbitDriver
	c   *consumer
	gen uint64 // subscriptions made; owner only
}

// rabbitStream is one channel with one consumer on it. Its deliveries may only be settled on it:
// once it is dead, results for its deliveries are superseded (RabbitMQ closes a channel that acks
// a tag it does not know, so they are never tried on the next subscription).
type rabbitStream struct {
	l      *rabbitLink
	ch     *amqp.Channel
	tag    string
	gen    uint64
	msgs   <-chan amqp.Delivery
	closes chan *amqp.Error
	// down is closed once amqp091-go has shut the channel down (its NotifyClose channels are
	// closed then, whatever the cause): a settle error can be told apart without polling.
	down chan struct{}
	dead atomic.Bool
}

func (s *rabbitStream) deliveries() <-chan amqp.Delivery { return s.msgs }
func (s *rabbitStream) generation() uint64               { return s.gen }

func (s *rabbitStream) delivery(d amqp.Delivery) delivery {
	j := &rabbitDelivery{s: s, d: d}
	if j.probe() {
		j.msg = &Message{ID: d.MessageId, Route: s.l.c.top.route}
	} else {
		j.msg = newMessage(s.l.c.top.route, &d)
	}
	return j
}

// rabbitDelivery is one AMQP delivery of a stream.
type rabbitDelivery struct {
	s   *rabbitStream
	d   amqp.Delivery
	msg *Message
}

func (j *rabbitDelivery) message() *Message { return j.msg }

// stale: the delivery's channel is dead, so the broker has requeued it (or will, on close).
func (j *rabbitDelivery) stale() bool { return j.s.dead.Load() }

// probe: a Diagnose probe carries the x-mq-probe header, which an application publish never does.
func (j *rabbitDelivery) probe() bool {
	_, ok := j.d.Headers[hdrProbe].(string)
	return ok
}

func (j *rabbitDelivery) due() time.Time { return time.Time{} }

// requeues is 0: the work queue's x-delivery-limit counts them.
func (j *rabbitDelivery) requeues() int { return 0 }

func (j *rabbitDelivery) done() {}

// sendCopy publishes a copy of the AMQP delivery — same identity and properties, without the
// broker's headers — to the order's destination: the route's retry holding queue for the attempt,
// its delay holding queue for the deferral, or its DLQ; mandatory, and confirmed.
func (j *rabbitDelivery) sendCopy(ctx context.Context, o copyOrder) (string, error) {
	top := j.s.l.c.top
	pub := copyOf(&j.d)
	o.apply(pub.Headers)
	var key string
	switch o.kind {
	case copyRetry:
		key = top.retryQueue(o.attempt)
	case copyDefer:
		key, _, _ = top.delayQueue(o.delay) // o.delay >= the smallest level: see rules.holdsDefer
	case copyDeadLetter:
		key = top.dlq
	default:
		return "", fmt.Errorf("mq: copy of unknown kind %d", o.kind)
	}
	return key, j.s.l.b.publishCopy(ctx, "", key, pub)
}

// subscribe opens a channel on the consuming connection, declares the route, sets per-consumer
// prefetch and starts consuming.
func (l *rabbitLink) subscribe(ctx context.Context) (stream[amqp.Delivery], error) {
	top := l.c.top
	conn, err := l.b.consumeConn(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	fail := func(err error) (stream[amqp.Delivery], error) {
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
	if err := top.declare(ch); err != nil {
		return fail(err)
	}
	l.b.noteDeclared()
	// Per-consumer prefetch: global QoS (global=true) on a quorum queue closes the connection.
	if err := ch.Qos(top.prefetch, 0, false); err != nil {
		return fail(fmt.Errorf("set prefetch: %w", err))
	}
	tag := fmt.Sprintf("%s-%s", top.queue, uuid.NewString()[:8])
	// Plain Consume, not ConsumeWithContext: the latter cancels the consumer from a goroutine of
	// its own when ctx ends, racing our ordered shutdown.
	msgs, err := ch.Consume(top.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fail(fmt.Errorf("consume %q: %w", top.queue, err))
	}
	l.gen++
	return &rabbitStream{l: l, ch: ch, tag: tag, gen: l.gen, msgs: msgs, closes: closes, down: down}, nil
}

// lose retires a stream whose deliveries ended: its channel or connection closed, or the broker
// cancelled the consumer because the queue was deleted. The broker requeues everything unacked on
// it. A channel the broker closed for a protocol error of ours (406 PRECONDITION_FAILED "unknown
// delivery tag": on a consuming channel settlements are all the port sends) is reported as ours.
func (l *rabbitLink) lose(st stream[amqp.Delivery]) (ours bool, reason error) {
	s := st.(*rabbitStream)
	s.dead.Store(true)
	select {
	case e, ok := <-s.closes:
		if ok && e != nil {
			reason = e
		}
	default:
	}
	if !s.ch.IsClosed() {
		s.ch.Close() //nolint:errcheck // retiring it either way
	}
	var ae *amqp.Error
	return errors.As(reason, &ae) && ourFault(ae.Code), reason
}

// recycle closes the stream's channel, which returns what it holds; RabbitMQ's requeue is a nack,
// so settle never asks for it.
func (l *rabbitLink) recycle(_ context.Context, st stream[amqp.Delivery]) {
	s := st.(*rabbitStream)
	s.dead.Store(true)
	l.closeChannel(s)
}

// halt cancels the broker consumer, so that the broker sends nothing more, and hands back what
// amqp091-go had buffered (it closes the delivery channel after the cancel). A cancel the broker
// does not answer within the grace retires the stream: its channel is closed instead.
func (l *rabbitLink) halt(st stream[amqp.Delivery]) (alive bool, held []amqp.Delivery) {
	s := st.(*rabbitStream)
	if s.dead.Load() || !l.cancelConsumer(s) {
		return false, nil
	}
	for d := range s.msgs {
		held = append(held, d)
	}
	return true, held
}

// end closes the stream's channel (anything unsettled goes back to the broker with it), waiting
// for the broker's answer at most grace. The consuming connection is the driver's, shared.
func (l *rabbitLink) end(st stream[amqp.Delivery], _ time.Duration) {
	if st == nil {
		return
	}
	s := st.(*rabbitStream)
	if !s.dead.Swap(true) {
		l.closeChannel(s)
	}
}

// settle acknowledges (basic.ack) or requeues (basic.nack requeue=true) a delivery on its own
// channel, and only there.
func (l *rabbitLink) settle(d delivery, v verdict, _ bool, report func(settled)) bool {
	j := d.(*rabbitDelivery)
	if v.act == actNone || j.s.dead.Load() {
		report(settledSuperseded)
		return false
	}
	if h := l.b.hooks().settling; h != nil && !j.probe() {
		h(j.msg, func() { j.d.Ack(false) }) //nolint:errcheck // acks are not answered
	}
	if v.act == actAck {
		l.written(j, j.d.Ack(false), report)
	} else {
		l.written(j, j.d.Nack(false, true), report)
	}
	return false
}

// giveBack nacks a delivery with requeue, at shutdown, on the owner goroutine.
func (l *rabbitLink) giveBack(d delivery, report func(settled)) {
	j := d.(*rabbitDelivery)
	l.written(j, j.d.Nack(false, true), report)
}

// written reports a settlement's write: taken (RabbitMQ does not answer acks and nacks), or, by
// its error (settleFailed), superseded — the channel or its connection was going away under it,
// and the broker redelivers — or lost.
func (l *rabbitLink) written(j *rabbitDelivery, err error, report func(settled)) {
	if err == nil {
		report(settledOK)
		return
	}
	l.settleFailed(j.s, err, func(torn bool) {
		if torn {
			report(settledSuperseded)
			l.c.log.Debug("mq settle failed on a channel being torn down; superseded",
				zap.String("message_id", j.msg.ID), zap.Uint64("generation", j.s.gen), zap.Error(err))
			return
		}
		report(settledLost)
		l.c.log.Error("mq settle failed on a live channel", zap.String("message_id", j.msg.ID),
			plog.Deliveries(j.msg.Attempt), zap.Error(err))
	})
}

// answerProbe replies to a probe. The probe is worth nothing once answered, or once nobody waits
// for the answer (the reply queue is gone: the reply comes back unroutable), so it is acked
// either way.
func (l *rabbitLink) answerProbe(ctx context.Context, d delivery, counters Counters) {
	j := d.(*rabbitDelivery)
	if j.s.dead.Load() || j.d.ReplyTo == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	id, _ := j.d.Headers[hdrProbe].(string)
	body, _ := json.Marshal(probeAnswer{By: processName, Counters: counters})
	reply := amqp.Publishing{
		Headers:       amqp.Table{hdrProbe: id},
		CorrelationId: id,
		Timestamp:     time.Now().UTC(),
		ContentType:   "application/json",
		Body:          body,
	}
	if err := l.b.publishTo(ctx, "", j.d.ReplyTo, reply); err != nil {
		l.c.log.Info("mq diagnostic probe answered into the void", zap.String("message_id", j.d.MessageId), zap.Error(err))
	}
}

// tornDownWait is how long a settle error that could be either is given to show whether the
// channel is closing: amqp091-go starts the shutdown of a connection whose socket write failed in
// a goroutine of its own, so the channel may not say it is closed at the instant the error comes
// back. The wait runs off the caller's goroutine (see settleFailed).
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

// classifySettle says what a settle's error on s means. amqp091-go answers ErrClosed once it
// knows the channel or connection is closed; before it does, a write on a dying socket fails with
// the socket's error (broken pipe, connection reset, use of a closed connection, EOF, a deadline),
// and an exception the broker sent comes back as an *amqp.Error — torn down, unless its code is a
// protocol error of ours (ourFault), which is a bug to count as lost, not hide as superseded. It
// never waits: anything else is faultUnknown, unless the channel is already known to be down.
func classifySettle(s *rabbitStream, err error) settleFault {
	if errors.Is(err, amqp.ErrClosed) || s.dead.Load() {
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
	if s.ch.IsClosed() || isDone(s.down) {
		return faultTornDown
	}
	return faultUnknown
}

// settleFailed calls decided with whether a failed settle on s is a teardown (true) or a loss. A
// known error is decided at once, on the caller's goroutine; an unknown one in a goroutine of its
// own, which waits up to tornDownWait for the channel to shut down, so that neither the owner
// goroutine (giving deliveries back) nor a worker stalls on it. decided must be safe to call from
// another goroutine.
func (l *rabbitLink) settleFailed(s *rabbitStream, err error, decided func(torn bool)) {
	switch classifySettle(s, err) {
	case faultTornDown:
		decided(true)
	case faultOurs:
		decided(false)
	default:
		go func() {
			t := time.NewTimer(tornDownWait)
			defer t.Stop()
			select {
			case <-s.down: // nil for a stream without one: the timer decides
				decided(true)
			case <-t.C:
				decided(s.ch.IsClosed())
			}
		}()
	}
}

// cancelConsumer cancels s's broker consumer, so that the broker sends nothing more. A broker
// that does not answer within the grace is not waited for: the channel is closed instead (its
// deliveries go back to the broker with it). It reports whether s is still usable.
func (l *rabbitLink) cancelConsumer(s *rabbitStream) bool {
	grace := l.c.grace
	done := make(chan error, 1)
	go func() { done <- s.ch.Cancel(s.tag, false) }()
	t := time.NewTimer(grace)
	defer t.Stop()
	var err error
	select {
	case err = <-done:
	case <-t.C:
		err = fmt.Errorf("no answer within %v", grace)
	case <-l.b.p.closed:
		err = ErrClosed
	}
	if err == nil {
		return true
	}
	l.c.log.Warn("mq consumer cancel failed; closing its channel", zap.Uint64("generation", s.gen), zap.Error(err))
	s.dead.Store(true)
	l.closeChannel(s)
	// Closing the channel ends the call, but against a silent broker only when amqp091-go's
	// heartbeats notice the connection is dead: wait no longer than another grace, or the Broker's
	// close. The call's goroutine returns when the connection goes (done is buffered).
	t.Reset(grace)
	select {
	case err := <-done:
		_ = err // the cancel's own answer: the channel is closed whatever it says
	case <-t.C:
		l.c.log.Warn("mq consumer cancel still unanswered after its channel's close; leaving it to the connection",
			zap.Uint64("generation", s.gen))
	case <-l.b.p.closed:
	}
	return false
}

// closeChannel closes s's channel, waiting for the broker's answer at most the grace.
func (l *rabbitLink) closeChannel(s *rabbitStream) {
	if s.ch.IsClosed() {
		return
	}
	done := make(chan struct{})
	go func() {
		s.ch.Close() //nolint:errcheck // closing is the point; the broker requeues what is unacked
		close(done)
	}()
	t := time.NewTimer(l.c.grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		l.c.log.Warn("mq channel close not answered within the grace; leaving it to the connection")
	case <-l.b.p.closed:
	}
}
