package mq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// redriveBatch is how many dead letters Redrive publishes before it awaits their confirms.
const redriveBatch = 256

// DeadLetter is one message in a DLQ, as DeadLetters lists it.
type DeadLetter struct {
	ID      string         // AMQP message-id
	Body    []byte         // the payload
	Headers map[string]any // every header the message carries, the port's and the broker's
	// Reason is x-dead-reason ("rejected", "retry_exhausted"), or for a
	// message the broker dead-lettered itself its x-first-death-reason (e.g. "delivery_limit").
	Reason         string
	LastError      string    // x-last-error: the handler's error, empty when the broker dead-lettered it
	Attempts       int       // x-delivery-attempt: deliveries to a handler that counted, at least 1
	FirstFailureAt time.Time // x-first-failure-at; zero when unknown
	LastFailureAt  time.Time // x-last-failure-at; zero when unknown
	DeadAt         time.Time // x-dead-at, or the broker's x-death time
	SourceQueue    string    // x-source-queue, or the broker's x-first-death-queue
	// Redriven is how many times the message was redriven (x-redriven) before it came back to the
	// DLQ: Redrive resets the attempt budget, not this.
	Redriven int
}

// DeadLetters lists up to limit messages at the head of a route's DLQ ("<scope>.<route>.dlq"),
// oldest first, without taking them out.
// The route need not be declared by this Broker.
//
// It fetches the messages one by one with basic.get, holding each unacked while it fetches the
// next (so each is seen once), and then hands them all back with one nack requeue=true: the DLQ is
// a classic queue, where a requeued message returns to its original position and nothing counts
// deliveries, so listing any number of times neither loses nor reorders a dead letter (see
// dlqArgs). A concurrent Redrive or Discard of the same DLQ does not see the messages it holds at
// that moment (Redrive looks again for the ids it was given).
func (b *RabbitMQ) DeadLetters(ctx context.Context, route string, limit int) (_ []DeadLetter, err error) {
	if limit <= 0 {
		return nil, fmt.Errorf("mq: dead letters of %q: limit %d must be positive", route, limit)
	}
	_, dlq, err := b.dlqOf(route)
	if err != nil {
		return nil, err
	}
	ch, done, err := b.dlqChannel(ctx)
	if err != nil {
		return nil, fmt.Errorf("mq: dead letters of %q: %w", route, err)
	}
	defer func() {
		if cerr := done(); cerr != nil && err == nil {
			err = fmt.Errorf("mq: dead letters of %q: %w", route, cerr)
		}
	}()
	var out []DeadLetter
	var last uint64
	for len(out) < limit {
		d, ok, err := ch.Get(dlq, false)
		if err != nil {
			// The channel is gone (a missing DLQ closes it with 404, or ctx closed it); the broker
			// requeues what it held.
			return nil, fmt.Errorf("mq: dead letters of %q: get from %q: %w", route, dlq, ctxErr(ctx, err))
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
			return out, fmt.Errorf("mq: dead letters of %q: requeue: %w", route, err)
		}
	}
	return out, nil
}

// Redrive moves the dead letters of a route whose message ids are in ids (all of them when ids is
// empty) back to the route's work queue, with a fresh attempt budget: the port's bookkeeping
// headers (x-delivery-attempt, x-dead-reason, x-last-error, the failure times) and the broker's
// x-death family are stripped, the id, body and properties kept, and x-redriven counts one more
// redrive (DeadLetter.Redriven), so that a recovery can cap its redrives of a message that keeps
// failing. Each copy is confirmed by the
// broker before its DLQ original is acked; messages not selected, and any whose copy was not
// confirmed, stay in the DLQ in their positions. It returns how many were moved, and an error if
// any selected message could not be (a moved message is then possibly a duplicate, never lost).
//
// It looks at most at the messages the DLQ held when it started, so a message that fails again
// while Redrive runs is not redriven twice. A selected id it did not find may be held at that
// moment by a concurrent listing (DeadLetters holds what it lists for the time of a few gets: the
// dispatcher's recovery lists the executions DLQ every pass), so it looks again, a few times over
// a second at most, for those it did not see — an operator's redrive of what they just listed
// found nothing on a loaded machine (issue 22).
func (b *RabbitMQ) Redrive(ctx context.Context, route string, ids []string) (moved int, err error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	for wait := redriveLookAgain; ; wait *= 2 {
		n, seen, err := b.redriveWalk(ctx, route, want)
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

// redriveLookAgain is how long Redrive waits before it looks again for selected dead letters it
// did not find; each wait doubles, up to redriveLookAgainMax (in all under a second).
const (
	redriveLookAgain    = 25 * time.Millisecond
	redriveLookAgainMax = 400 * time.Millisecond
)

// redriveWalk is one walk of Redrive over the DLQ (want empty: every message), reporting the
// selected ids it came across, moved or not.
func (b *RabbitMQ) redriveWalk(ctx context.Context, route string, want map[string]bool) (moved int, seen map[string]bool, err error) {
	queue, dlq, err := b.dlqOf(route)
	if err != nil {
		return 0, nil, err
	}
	seen = map[string]bool{}
	ch, done, err := b.dlqChannel(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("mq: redrive %q: %w", route, err)
	}
	defer func() {
		if cerr := done(); cerr != nil && err == nil {
			err = fmt.Errorf("mq: redrive %q: %w", route, cerr)
		}
	}()
	if _, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil); err != nil {
		return 0, nil, fmt.Errorf("mq: redrive %q: check %q: %w", route, dlq, err)
	}
	st := b.routeStats(route)
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
			st.inc(evRedriven)
		}
		return nil
	}
	next := walkDLQ(ch, dlq)
	for {
		d, ok, err := next()
		if err != nil {
			// The channel is gone; the broker requeues what it held, unmoved.
			return moved, seen, fmt.Errorf("mq: redrive %q: get from %q: %w", route, dlq, ctxErr(ctx, err))
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
				return moved, seen, fmt.Errorf("mq: redrive %q: %w", route, err)
			}
		}
	}
	if err := flush(); err != nil {
		return moved, seen, fmt.Errorf("mq: redrive %q: %w", route, err)
	}
	if held > 0 {
		// Everything still held (not selected, or not confirmed) goes back where it was.
		if err := ch.Nack(held, true, true); err != nil {
			errs = append(errs, fmt.Errorf("requeue the rest: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return moved, seen, fmt.Errorf("mq: redrive %q: %w", route, err)
	}
	return moved, seen, nil
}

// Discard removes from a route's DLQ the dead letters whose message ids are in ids (every copy of
// each), and reports how many it removed. It is for dead letters a caller has shown to be
// explained — the work they carried was done since, or was decided otherwise — so that the DLQ
// keeps only what still needs an operator; it never chooses by itself, and an empty ids removes
// nothing. Dead letters not selected stay in their positions. Like Redrive it looks at most at the
// messages the DLQ held when it started.
func (b *RabbitMQ) Discard(ctx context.Context, route string, ids []string) (removed int, err error) {
	_, dlq, err := b.dlqOf(route)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	ch, done, err := b.dlqChannel(ctx)
	if err != nil {
		return 0, fmt.Errorf("mq: discard from %q: %w", route, err)
	}
	defer func() {
		if cerr := done(); cerr != nil && err == nil {
			err = fmt.Errorf("mq: discard from %q: %w", route, cerr)
		}
	}()
	if _, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil); err != nil {
		return 0, fmt.Errorf("mq: discard from %q: check %q: %w", route, dlq, err)
	}
	// held is the highest tag still unacked (see Redrive: a nack multiple=true must name one).
	var held uint64
	next := walkDLQ(ch, dlq)
	for {
		d, ok, err := next()
		if err != nil {
			return removed, fmt.Errorf("mq: discard from %q: get from %q: %w", route, dlq, ctxErr(ctx, err))
		}
		if !ok {
			break
		}
		if !want[d.MessageId] {
			held = max(held, d.DeliveryTag)
			continue
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			return removed, fmt.Errorf("mq: discard from %q: ack %q: %w", route, d.MessageId, err)
		}
		removed++
	}
	if held > 0 {
		if err := ch.Nack(held, true, true); err != nil {
			return removed, fmt.Errorf("mq: discard from %q: requeue the rest: %w", route, err)
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

// dlqOf is the scoped work queue and DLQ of a route.
func (b *RabbitMQ) dlqOf(route string) (queue, dlq string, err error) {
	if err := validateRoute(route); err != nil {
		return "", "", err
	}
	queue = b.QueueName(route)
	dlq = queue + ".dlq"
	if err := ValidateName(dlq); err != nil {
		return "", "", err
	}
	return queue, dlq, nil
}

// dlqChannel opens a channel for reading a DLQ on the consuming connection (basic.get is a
// consumer's operation, and must not stall behind a blocked publishing connection). ctx ending
// closes the channel, which ends a waiting basic.get. done closes it in any case, and reports
// whether the broker had closed it first (a 404, or a 406 for a bad delivery tag: a bug).
func (b *RabbitMQ) dlqChannel(ctx context.Context) (*amqp.Channel, func() error, error) {
	conn, err := b.consumeConn(ctx)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	// Buffered: amqp091-go sends at most one error, then closes the channel.
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	stop := context.AfterFunc(ctx, func() { ch.Close() }) //nolint:errcheck // cancellation
	return ch, func() error {
		stop()
		// Synchronous (close-ok), so an error the broker sent for an earlier method has arrived.
		ch.Close() //nolint:errcheck // whatever it held is requeued on close
		if e, ok := <-closes; ok && e != nil {
			return fmt.Errorf("channel closed by the broker: %w", e)
		}
		return nil
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
	if dl.Reason == "" {
		dl.Reason = str("x-first-death-reason")
	}
	if dl.SourceQueue == "" {
		dl.SourceQueue = str("x-first-death-queue")
	}
	if dl.DeadAt.IsZero() {
		if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
			if death, ok := deaths[0].(amqp.Table); ok {
				dl.DeadAt, _ = death["time"].(time.Time)
			}
		}
	}
	return dl
}

// deadLetterFrom reads a dead letter's port headers, for every provider (headers decoded; see
// copyOrder.apply); a provider adds what its broker says of a message it dead-lettered itself.
func deadLetterFrom(id string, body []byte, headers map[string]any) DeadLetter {
	h := make(map[string]any, len(headers))
	for k, v := range headers {
		if k != hdrPublishTag {
			h[k] = v
		}
	}
	str := func(k string) string { s, _ := headers[k].(string); return s }
	ts := func(k string) time.Time {
		t, _ := time.Parse(time.RFC3339Nano, str(k))
		return t
	}
	return DeadLetter{
		ID:             id,
		Body:           append([]byte(nil), body...),
		Headers:        h,
		Reason:         str(hdrDeadReason),
		LastError:      str(hdrLastError),
		Attempts:       attemptOf(headers),
		FirstFailureAt: ts(hdrFirstFailure),
		LastFailureAt:  ts(hdrLastFailure),
		DeadAt:         ts(hdrDeadAt),
		SourceQueue:    str(hdrSourceQueue),
		Redriven:       redrivenOf(headers),
	}
}
