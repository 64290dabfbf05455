package mq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
)

// redriveBatch is how many dead letters Redrive publishes before it awaits their confirms.
const redriveBatch = 256

// deadLetters fetches the messages one by one with basic.get, holding each unacked while it
// fetches the next (so each is seen once), and then hands them all back with one nack
// requeue=true: the DLQ is a classic queue, where a requeued message returns to its original
// position and nothing counts deliveries, so listing any number of times neither loses nor
// reorders a dead letter (see dlqArgs). A concurrent Redrive or Discard of the same DLQ does not
// see the messages it holds at that moment (Redrive looks again for the ids it was given).
func (b *rabbitDriver) deadLetters(ctx context.Context, q dlqRef, limit int) (_ []DeadLetter, err error) {
	ch, done, err := b.dlqChannel(ctx)
	if err != nil {
		return nil, err
	}
	defer done(&err)
	dlq := q.dlq
	var out []DeadLetter
	var last uint64
	for len(out) < limit {
		d, ok, err := ch.Get(dlq, false)
		if err != nil {
			// The channel is gone (a missing DLQ closes it with 404, or ctx closed it); the broker
			// requeues what it held.
			return nil, fmt.Errorf("get from %q: %w", dlq, ctxErr(ctx, err))
		}
		if !ok {
			break
		}
		last = d.DeliveryTag
		out = append(out, deadLetterOf(&d))
	}
	if last > 0 {
		// multiple=true is safe here: this goroutine alone owns ch and holds every tag up to last.
		if err := ch.Nack(last, true, true); err != nil {
			// Closing the channel requeues them just the same.
			return out, fmt.Errorf("requeue: %w", err)
		}
	}
	return out, nil
}

// redrive takes the DLQ's messages with basic.get and publishes the chosen in batches, acking
// each dead letter once its copy is confirmed. A selected id it did not find may be held at that
// moment by a concurrent listing (deadLetters holds what it lists for the time of a few gets: the
// dispatcher's recovery lists the executions DLQ every pass), so it looks again, a few times over
// a second at most, for those it did not see — an operator's redrive of what they just listed
// found nothing on a loaded machine (issue 22).
func (b *rabbitDriver) redrive(ctx context.Context, q dlqRef, ids []string) (moved int, err error) {
	want := idSet(ids)
	for wait := redriveLookAgain; ; wait *= 2 {
		n, seen, err := b.redriveWalk(ctx, q, want)
		moved += n
		for id := range seen {
			delete(want, id)
		}
		if err != nil || len(ids) == 0 || len(want) == 0 || wait > redriveLookAgainMax {
			return moved, err
		}
		select {
		case <-ctx.Done():
			return moved, nil
		case <-time.After(wait):
		}
	}
}

// idSet is ids as a set.
func idSet(ids []string) map[string]bool {
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}

// redriveLookAgain is how long Redrive waits before it looks again for selected dead letters it
// did not find; each wait doubles, up to redriveLookAgainMax (in all under a second).
const (
	redriveLookAgain    = 25 * time.Millisecond
	redriveLookAgainMax = 400 * time.Millisecond
)

// redriveWalk is one walk of redrive over the DLQ (want empty: every message), reporting the
// selected ids it came across, moved or not.
func (b *rabbitDriver) redriveWalk(ctx context.Context, q dlqRef, want map[string]bool) (moved int, seen map[string]bool, err error) {
	queue, dlq := q.queue, q.dlq
	seen = map[string]bool{}
	ch, done, err := b.dlqChannel(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer done(&err)
	if _, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil); err != nil {
		return 0, nil, fmt.Errorf("check %q: %w", dlq, err)
	}
	var errs []error
	var batch []amqp.Delivery
	// held is the highest delivery tag still unacked: the final nack requeues up to it. It must be
	// a tag we hold: basic.nack multiple=true with an already acked tag is "unknown delivery tag",
	// 406, and closes the channel.
	var held uint64
	// flush publishes the batch, and acks in the DLQ what the broker confirmed. An ack that fails
	// means the channel is gone: the broker requeues the DLQ copies, so those are duplicated.
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		defer func() { batch = batch[:0] }()
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		defer cancel()
		p, err := b.publisher(pctx)
		if err != nil {
			return err
		}
		flights := make([]flight, len(batch))
		for i := range batch {
			flights[i] = p.send(pctx, "", queue, redriveCopy(&batch[i]))
		}
		for i, err := range p.await(pctx, flights) {
			if err != nil {
				errs = append(errs, fmt.Errorf("message %q: %w", batch[i].MessageId, err))
				held = max(held, batch[i].DeliveryTag) // requeued in place below
				continue
			}
			if err := ch.Ack(batch[i].DeliveryTag, false); err != nil {
				return fmt.Errorf("ack %q in %q after its copy was confirmed: %w", batch[i].MessageId, dlq, err)
			}
			moved++
		}
		return nil
	}
	next := walkDLQ(ch, dlq)
	for {
		d, ok, err := next()
		if err != nil {
			// The channel is gone; the broker requeues what it held, unmoved.
			return moved, seen, fmt.Errorf("get from %q: %w", dlq, ctxErr(ctx, err))
		}
		if !ok {
			break
		}
		if want[d.MessageId] {
			seen[d.MessageId] = true
		}
		if len(want) > 0 && !want[d.MessageId] {
			held = max(held, d.DeliveryTag) // held unacked, so the next get moves past it; requeued in place below
			continue
		}
		batch = append(batch, d)
		if len(batch) == redriveBatch {
			if err := flush(); err != nil {
				return moved, seen, err
			}
		}
	}
	if err := flush(); err != nil {
		return moved, seen, err
	}
	if held > 0 {
		// Everything still held (not selected, or not confirmed) goes back where it was.
		if err := ch.Nack(held, true, true); err != nil {
			errs = append(errs, fmt.Errorf("requeue the rest: %w", err))
		}
	}
	return moved, seen, errors.Join(errs...)
}

// discard acks the chosen dead letters as basic.get hands them over, and requeues the others.
func (b *rabbitDriver) discard(ctx context.Context, q dlqRef, ids []string) (removed int, err error) {
	if len(ids) == 0 {
		return 0, nil
	}
	dlq := q.dlq
	want := idSet(ids)
	ch, done, err := b.dlqChannel(ctx)
	if err != nil {
		return 0, err
	}
	defer done(&err)
	if _, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil); err != nil {
		return 0, fmt.Errorf("check %q: %w", dlq, err)
	}
	// held is the highest tag still unacked (see Redrive: a nack multiple=true must name one).
	var held uint64
	next := walkDLQ(ch, dlq)
	for {
		d, ok, err := next()
		if err != nil {
			return removed, fmt.Errorf("get from %q: %w", dlq, ctxErr(ctx, err))
		}
		if !ok {
			break
		}
		if !want[d.MessageId] {
			held = max(held, d.DeliveryTag)
			continue
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			return removed, fmt.Errorf("ack %q: %w", d.MessageId, err)
		}
		removed++
	}
	if held > 0 {
		if err := ch.Nack(held, true, true); err != nil {
			return removed, fmt.Errorf("requeue the rest: %w", err)
		}
	}
	return removed, nil
}

// walkDLQ returns next, which takes dlq's messages one by one with basic.get (each held unacked
// on ch until the caller settles it) and reports false once the queue is empty or the walk has
// seen as many as the queue held when it started, as the first get-ok counts them (its
// message-count: how many more the queue held) — so a message dead-lettered again while Redrive or
// Discard runs is not taken twice. That count is the queue's as it hands out the first message,
// after whatever it was sent before (a listing's requeue just before); a passive declare's count,
// used before, is a separate question to the queue and need not be (issue 22).
func walkDLQ(ch *amqp.Channel, dlq string) func() (amqp.Delivery, bool, error) {
	n, total := 0, 1
	return func() (amqp.Delivery, bool, error) {
		if n >= total {
			return amqp.Delivery{}, false, nil
		}
		d, ok, err := ch.Get(dlq, false)
		if err != nil || !ok {
			return d, false, err
		}
		if n == 0 {
			total = int(d.MessageCount) + 1
		}
		n++
		return d, true, nil
	}
}

// dlqChannel opens a channel for reading a DLQ on the consuming connection (basic.get is a
// consumer's operation, and must not stall behind a blocked publishing connection). ctx ending
// closes the channel, which ends a waiting basic.get. done closes it in any case, and sets *err,
// if it is nil, when the broker had closed it first (a 404, or a 406 for a bad delivery tag: a
// bug).
func (b *rabbitDriver) dlqChannel(ctx context.Context) (ch *amqp.Channel, done func(err *error), err error) {
	conn, err := b.consumeConn(ctx)
	if err != nil {
		return nil, nil, err
	}
	ch, err = conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	// Buffered: amqp091-go sends at most one error, then closes the channel.
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	stop := context.AfterFunc(ctx, func() { ch.Close() }) //nolint:errcheck // cancellation
	return ch, func(err *error) {
		stop()
		// Synchronous (close-ok), so an error the broker sent for an earlier method has arrived.
		ch.Close() //nolint:errcheck // whatever it held is requeued on close
		if e, ok := <-closes; ok && e != nil && *err == nil {
			*err = fmt.Errorf("channel closed by the broker: %w", e)
		}
	}, nil
}

// ctxErr prefers the context's error: a channel closed by cancellation says only "closed".
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// redriveCopy is a dead letter republished afresh: copyOf without the port's bookkeeping headers,
// so the message starts again at attempt 1 with a full budget.
func redriveCopy(d *amqp.Delivery) amqp.Publishing {
	pub := copyOf(d)
	redriveHeaders(pub.Headers)
	return pub
}

// deadLetterOf parses a DLQ delivery.
func deadLetterOf(d *amqp.Delivery) DeadLetter {
	dl := deadLetterFrom(d.MessageId, d.Body, d.Headers)
	str := func(k string) string { s, _ := d.Headers[k].(string); return s }
	// Dead-lettered by the broker (x-delivery-limit): its headers say why and when.
	dl.Reason = cmp.Or(dl.Reason, str("x-first-death-reason"))
	dl.SourceQueue = cmp.Or(dl.SourceQueue, str("x-first-death-queue"))
	if dl.DeadAt.IsZero() {
		if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
			if death, ok := deaths[0].(amqp.Table); ok {
				dl.DeadAt, _ = death["time"].(time.Time)
			}
		}
	}
	return dl
}

// diagnose checks passively that the route's work queue, every holding queue and the DLQ exist (a
// missing one is a failure: a missing holding queue or DLQ turns retries and dead letters into
// returned publishes, and the broker's own dead-lettering into silent drops), then runs the probe's
// round trip: the probe (confirmed) carries the x-mq-probe header and a reply-to naming an
// exclusive reply queue of this connection.
func (b *rabbitDriver) diagnose(ctx context.Context, top *topology, timeout time.Duration, d *Diagnosis) {
	conn, err := b.consumeConn(ctx)
	if err != nil {
		d.problem("no connection to the broker: %v", err)
		return
	}
	work, workOK := checkQueue(conn, "work queue", top.queue, d.problem)
	d.Messages, d.Consumers = work.Messages, work.Consumers
	for _, q := range top.queues()[2:] {
		checkQueue(conn, "holding queue", q, d.problem)
	}
	dlq, _ := checkQueue(conn, "dead-letter queue", top.dlq, d.problem)
	d.DLQ = dlq.Messages
	if !workOK {
		return // nothing to probe through
	}
	d.answered(b.roundTrip(ctx, conn, top.queue, timeout))
}

// checkQueue declares a queue passively on a throwaway channel: a missing queue closes the channel
// with 404, and must not take a shared channel with it.
func checkQueue(conn *amqp.Connection, kind, name string, problem func(string, ...any)) (amqp.Queue, bool) {
	ch, err := conn.Channel()
	if err != nil {
		problem("check %s %s: open channel: %v", kind, name, err)
		return amqp.Queue{}, false
	}
	defer ch.Close() //nolint:errcheck // throwaway; already closed after a 404
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return q, true
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		problem("%s %s missing", kind, name)
	default:
		problem("check %s %s: %v", kind, name, err)
	}
	return amqp.Queue{}, false
}

// roundTrip publishes a probe to queue and waits for a consumer's answer on a reply queue of its
// own. The reply queue is classic by necessity: exclusive (it dies with this connection) and
// auto-deleted (with its consumer), which quorum queues cannot be.
func (b *rabbitDriver) roundTrip(ctx context.Context, conn *amqp.Connection, queue string, timeout time.Duration) (time.Duration, []byte, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: open channel: %w", err)
	}
	defer ch.Close() //nolint:errcheck // takes the reply queue with it
	rq, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: declare reply queue: %w", err)
	}
	replies, err := ch.Consume(rq.Name, "", true, true, false, false, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: consume reply queue: %w", err)
	}
	id := uuid.NewString()
	probe := amqp.Publishing{
		Headers:       amqp.Table{hdrProbe: id},
		MessageId:     "mq-probe-" + id,
		CorrelationId: id,
		ReplyTo:       rq.Name,
		Timestamp:     time.Now().UTC(),
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	err = b.publishTo(pctx, "", queue, probe)
	cancel()
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: probe publish to %s: %w", queue, err)
	}
	return awaitAnswer(ctx, replies, start, timeout, func(m amqp.Delivery) ([]byte, bool) {
		return m.Body, m.CorrelationId == id
	})
}

// deleteRoute deletes the route's work queue, holding queues and DLQ, with their messages.
func (b *rabbitDriver) deleteRoute(ctx context.Context, t *topology) error {
	p, err := b.publisher(ctx)
	if err != nil {
		return err
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close() //nolint:errcheck // a throwaway channel
	for _, q := range t.queues() {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("delete queue %q: %w", q, err)
		}
	}
	return nil
}
