package mq

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	plog "github.com/integrations-platform/integrations/pkg/log"

	"go.uber.org/zap"
)

// The handler-return rules, written once for every provider. A driver supplies the broker
// primitives — a delivery it can tell is stale, a copy of it published to a retry, delay or
// dead-letter destination and confirmed (a publisher confirm, a STOMP RECEIPT), and the
// settlement of the original on the connection and consumer it came from (engine.go's link) —
// and these rules decide: calling the handler (a panic, a cancelled context and the zero Result never ack), the
// retry from x-delivery-attempt and the route's RetryPolicy (the next attempt or a dead letter),
// the dead-letter headers, Defer's hold-or-copy choice, and what each outcome counts.

// action is what becomes of the original delivery once the rules have decided (and, for a copy,
// once the broker confirmed it).
type action uint8

const (
	actNone    action = iota // settle nothing: the delivery is stale, the broker redelivers it (superseded)
	actAck                   // acknowledge it
	actRequeue               // return it to the broker, to be delivered again
)

// verdict is the rules' decision on one delivery, for the engine to settle through its link.
type verdict struct {
	act      action
	ev       event // counted once the settlement succeeded
	rejected bool  // also count evRejected
}

// copyKind names the destination of a copy.
type copyKind uint8

const (
	copyRetry      copyKind = iota + 1 // the route's retry holding for the delay after copyOrder.attempt
	copyDefer                          // the route's delay level for copyOrder.delay; headers unchanged
	copyDeadLetter                     // the route's DLQ
)

// copyOrder is a copy the rules ask a provider to publish, confirmed, before the original is
// acknowledged. The provider makes the copy of its own delivery (identity, body, properties,
// every application and bookkeeping header, none of the broker's own), applies the order's
// headers with apply, and publishes it to its destination for kind.
type copyOrder struct {
	kind    copyKind
	attempt int           // the delivery's x-delivery-attempt
	delay   time.Duration // copyDefer's
	reason  string        // copyDeadLetter's x-dead-reason
	cause   error         // the handler's error, for x-last-error
	source  string        // copyDeadLetter's x-source-queue: the scoped work queue
	at      time.Time     // the failure's time
}

// apply writes the order's bookkeeping headers into h, a copy's headers (which hold the
// original's). Values are Go values (int32 attempts, RFC 3339 strings); a provider whose headers
// are text encodes them, and decodes them back before building a Message.
func (o copyOrder) apply(h map[string]any) {
	now := o.at.UTC().Format(time.RFC3339Nano)
	switch o.kind {
	case copyRetry:
		h[hdrAttempt] = int32(o.attempt + 1)
		h[hdrLastError] = errText(o.cause)
	case copyDeadLetter:
		h[hdrAttempt] = int32(o.attempt)
		h[hdrDeadReason] = o.reason
		h[hdrLastError] = errText(o.cause)
		h[hdrSourceQueue] = o.source
		h[hdrDeadAt] = now
	default:
		return // a deferral spends no attempt and is no failure: the copy is the message unchanged
	}
	if _, ok := h[hdrFirstFailure]; !ok {
		h[hdrFirstFailure] = now
	}
	h[hdrLastFailure] = now
}

// deadReasonDeliveryLimit is a dead letter's reason when a message came back deliveryLimit times
// without a result (the zero Result, a panic): RabbitMQ's broker dead-letters such a message by
// x-delivery-limit with this reason; on a broker that does not count returns, the engine does
// (delivery.requeues). Without a bound a poison message would be returned for ever.
const deadReasonDeliveryLimit = "delivery_limit"

// policy is what the rules need of a route.
type policy struct {
	queue       string          // the scoped work queue: a dead letter's x-source-queue
	maxAttempts int             // deliveries, the first included, before Fail dead-letters
	levels      []time.Duration // the applied delay levels, ascending; none: Defer dead-letters
}

// rules applies the handler-return rules for one Consume call.
type rules struct {
	h      Handler // the route's handler in the port's middleware (handlerChain)
	pol    policy
	st     *routeStats
	log    *zap.Logger
	ctx    context.Context // handler context: cancelled when the work context ends (see Drain)
	halt   chan struct{}   // closed when the consumer stops taking deliveries
	copyTO time.Duration   // bounds one copy's publish and confirm
	// copying is how many retry, defer or dead-letter copies workers are publishing (written,
	// or waiting for their confirm): a shutdown does not abandon them at its grace.
	copying atomic.Int32
}

// handle runs the handler for one delivery and turns its Result into a verdict, publishing the
// retry, defer or dead-letter copy (and waiting for its confirm) here, on the worker, so that the
// engine's owner goroutine never waits on the broker.
func (r *rules) handle(d delivery) verdict {
	if d.stale() {
		return verdict{act: actNone} // the broker has already requeued it
	}
	if r.halted() || r.ctx.Err() != nil {
		// Taken, not started, and the consumer is stopping: back to the broker, for another replica.
		return verdict{act: actRequeue, ev: evRequeued}
	}
	m := d.message()
	res, panicked := r.call(m)
	// A deferral shorter than the smallest delay level is waited out here, holding the delivery
	// (bounded by that level), and the handler asked again: no copy, no broker round trip.
	for !panicked && res.outcome == outcomeDefer && r.holdsDefer(res.delay) {
		if !r.sleep(max(res.delay, time.Millisecond)) {
			// Stopping: redeliver (to another replica) rather than hold it through the drain.
			return verdict{act: actRequeue, ev: evRequeued}
		}
		if d.stale() {
			return verdict{act: actNone}
		}
		res, panicked = r.call(m)
	}
	log := r.log.With(zap.String("message_id", m.ID), plog.Deliveries(m.Attempt))
	if panicked {
		r.st.inc(evPanicked)
		return verdict{act: actRequeue, ev: evRequeued}
	}
	if res.outcome == outcomeAck {
		return verdict{act: actAck, ev: evAcknowledged}
	}
	if r.ctx.Err() != nil {
		// Whatever it returned, a handler cut off by shutdown may not have finished: redeliver.
		return verdict{act: actRequeue, ev: evRequeued}
	}
	switch res.outcome {
	case outcomeFail:
		if m.Attempt >= r.pol.maxAttempts {
			return r.deadLetter(d, log, deadReasonExhausted, res.err)
		}
		return r.retry(d, log, res.err)
	case outcomeReject:
		return r.deadLetter(d, log, deadReasonRejected, res.err)
	case outcomeDefer:
		if len(r.pol.levels) == 0 {
			// A requeue would come straight back and be deferred again, a hot loop until the
			// delivery limit: dead-letter it, saying why, where an operator sees it.
			log.Error("mq handler deferred a message on a route without delay levels; dead-lettering",
				zap.Duration("delay", res.delay))
			return r.deadLetter(d, log, deadReasonRejected, errors.New("deferred on a route without delay levels"))
		}
		return r.deferCopy(d, log, res.delay)
	default:
		log.Warn("mq handler returned no result; requeueing")
		return verdict{act: actRequeue, ev: evRequeued}
	}
}

// call runs the handler (wrapped in the port's middleware: handlerChain), reporting whether it
// panicked.
func (r *rules) call(m *Message) (res Result, panicked bool) {
	res = r.h(r.ctx, m)
	return res, res.outcome == outcomePanicked
}

// copyContext bounds a retry, defer or dead-letter publish. It is detached from shutdown: a copy
// that is on its way should be confirmed and its original acked, not abandoned half way (which
// would leave both the copy and the redelivered original). Until its cancel is called the copy
// counts in r.copying, which a shutdown waits for past its grace.
func (r *rules) copyContext() (context.Context, context.CancelFunc) {
	r.copying.Add(1)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.copyTO)
	return ctx, func() {
		cancel()
		r.copying.Add(-1)
	}
}

// retry publishes the next attempt to its retry holding; the original is acked only once the
// copy is confirmed.
func (r *rules) retry(d delivery, log *zap.Logger, cause error) verdict {
	if d.stale() {
		return verdict{act: actNone}
	}
	o := copyOrder{kind: copyRetry, attempt: d.message().Attempt, cause: cause, at: time.Now()}
	ctx, cancel := r.copyContext()
	defer cancel()
	dest, err := d.sendCopy(ctx, o)
	if err != nil {
		log.Warn("mq retry publish not confirmed; requeueing", zap.String("queue", dest), zap.Error(err))
		return verdict{act: actRequeue, ev: evRequeued}
	}
	log.Info("mq message failed; retry scheduled", zap.String("queue", dest), zap.Error(cause))
	return verdict{act: actAck, ev: evRetried}
}

// deferCopy publishes the message, unchanged (x-delivery-attempt included: a deferral spends no
// attempt), to the delay level for d; the original is acked only once the copy is confirmed.
func (r *rules) deferCopy(d delivery, log *zap.Logger, delay time.Duration) verdict {
	if d.stale() {
		return verdict{act: actNone}
	}
	o := copyOrder{kind: copyDefer, attempt: d.message().Attempt, delay: delay, at: time.Now()}
	ctx, cancel := r.copyContext()
	defer cancel()
	dest, err := d.sendCopy(ctx, o)
	if err != nil {
		log.Warn("mq deferred copy not confirmed; requeueing", zap.String("queue", dest), zap.Error(err))
		return verdict{act: actRequeue, ev: evRequeued}
	}
	log.Debug("mq message deferred", zap.String("queue", dest), zap.Duration("delay", delay))
	return verdict{act: actAck, ev: evDeferred}
}

// deadLetter publishes the message to the DLQ with the reason; the original is acked only once
// the copy is confirmed.
func (r *rules) deadLetter(d delivery, log *zap.Logger, reason string, cause error) verdict {
	if d.stale() {
		return verdict{act: actNone}
	}
	o := copyOrder{kind: copyDeadLetter, attempt: d.message().Attempt, reason: reason, cause: cause,
		source: r.pol.queue, at: time.Now()}
	ctx, cancel := r.copyContext()
	defer cancel()
	if _, err := d.sendCopy(ctx, o); err != nil {
		log.Warn("mq dead-letter publish not confirmed; requeueing", zap.String("reason", reason), zap.Error(err))
		return verdict{act: actRequeue, ev: evRequeued}
	}
	log.Warn("mq message dead-lettered", zap.String("reason", reason), zap.Error(cause))
	return verdict{act: actAck, ev: evDeadLettered, rejected: reason == deadReasonRejected}
}

// holdsDefer reports whether a deferral of d is waited out in the worker rather than in a delay
// level: d is shorter than the route's smallest level.
func (r *rules) holdsDefer(d time.Duration) bool {
	return len(r.pol.levels) > 0 && d < r.pol.levels[0]
}

// sleep waits d; false if the consumer stopped taking deliveries or the handlers' context ended
// first.
func (r *rules) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.halt:
		return false
	case <-r.ctx.Done():
		return false
	}
}

// halted reports whether the consumer stopped taking deliveries.
func (r *rules) halted() bool {
	select {
	case <-r.halt:
		return true
	default:
		return false
	}
}
