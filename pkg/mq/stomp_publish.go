package mq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// Publish publishes one message to a route's queue and returns once the broker's RECEIPT says it
// has it. It gives up after ctx or a 10 s publish timeout, whichever ends first.
func (b *STOMP) Publish(ctx context.Context, route string, msg Outgoing) error {
	return b.PublishAll(ctx, route, []Outgoing{msg})[0]
}

// PublishAll publishes msgs to a route's queue, pipelined: every SEND is written (in order), then
// every RECEIPT awaited. It returns one error per message, nil when the broker took it. A header
// STOMP cannot carry fails that message (ErrSTOMPHeader) and sends nothing for it.
func (b *STOMP) PublishAll(ctx context.Context, route string, msgs []Outgoing) []error {
	if err := validateRoute(route); err != nil {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, err))
	}
	queue := b.QueueName(route)
	if err := ValidateName(queue); err != nil {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, err))
	}
	return b.publishMany(ctx, b.routeStats(route), route, queue, msgs, func(int) time.Duration { return 0 })
}

// PublishAfter is PublishAll for messages due after delays[i]: as on RabbitMQ a message waits the
// route's largest delay level not longer than its delay (plus the tolerance; see
// [RabbitMQ.PublishAfter]), and one due sooner than the smallest level goes to the work queue at
// once; the wait is the broker's scheduler instead of a holding queue. The route must have been
// declared on this Broker (ErrUnknownRoute otherwise).
func (b *STOMP) PublishAfter(ctx context.Context, route string, msgs []Outgoing, delays []time.Duration) []error {
	if len(delays) != len(msgs) {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %d messages but %d delays", route, len(msgs), len(delays)))
	}
	t, ok := b.topology(route)
	if !ok {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, ErrUnknownRoute))
	}
	return b.publishMany(ctx, b.routeStats(route), route, t.queue, msgs, func(i int) time.Duration {
		if _, ttl, ok := t.delayQueue(delays[i]); ok {
			return ttl
		}
		return 0
	})
}

// publishMany sends application messages to queue, each after delay(i), pipelined, counting them
// in st.
func (b *STOMP) publishMany(ctx context.Context, st *routeStats, route, queue string, msgs []Outgoing, delay func(int) time.Duration) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	conn, err := b.publisher(ctx)
	if err != nil {
		return failAll(len(msgs), fmt.Errorf("mq: publish to %q: %w", route, err))
	}
	receipts := make([]*stomp.Receipt, len(msgs))
	ids := make([]string, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		ids[i] = m.ID
		if ids[i] == "" {
			ids[i] = uuid.NewString()
		}
		ct := m.ContentType
		if ct == "" {
			ct = defaultContentType
		}
		h := applicationHeaders(ctx, m)
		hs, err := b.sendHeaders(ids[i], ct, h, delay(i), now)
		switch {
		case err != nil:
		case len(h) > stompMaxHeaders-len(bookkeeping):
			err = fmt.Errorf("%d headers, over the %d an application message may carry over STOMP (its copies add the port's): %w",
				len(h), stompMaxHeaders-len(bookkeeping), ErrSTOMPHeader)
		case len(m.Body) > stompMaxBody:
			err = fmt.Errorf("body of %d bytes, over the %d a STOMP message of the port may carry", len(m.Body), stompMaxBody)
		}
		if err != nil {
			errs[i] = fmt.Errorf("mq: publish %q to %q: %w", ids[i], route, err)
			continue
		}
		receipts[i] = conn.SendAsync(dest(queue), hs, m.Body)
		st.inc(evPublished)
	}
	for i, r := range receipts {
		if r == nil {
			continue
		}
		if err := r.Wait(ctx); err != nil {
			errs[i] = fmt.Errorf("mq: publish %q to %q: %w", ids[i], route, err)
			continue
		}
		st.inc(evConfirmed)
	}
	return errs
}

// sendHeaders are a SEND's headers: the message's (h, encoded), persistent (ActiveMQ's STOMP
// default is not), its id, a fresh send id, and for a delay its due time and the broker's schedule
// header (see stompScheduleLead).
func (b *STOMP) sendHeaders(id, contentType string, h map[string]any, delay time.Duration, now time.Time) ([]stomp.Header, error) {
	hs, err := stompHeaders(h)
	if err != nil {
		return nil, err
	}
	if err := stompText("message id", id); err != nil {
		return nil, err
	}
	if err := stompText("content type", contentType); err != nil {
		return nil, err
	}
	hs = append(hs,
		stomp.Header{Key: "persistent", Value: "true"},
		stomp.Header{Key: "content-type", Value: contentType},
		stomp.Header{Key: hdrSTOMPID, Value: id},
		stomp.Header{Key: hdrSTOMPSend, Value: uuid.NewString()},
	)
	if delay > 0 {
		// Rounded up to the millisecond: the hold must not let a copy through a fraction early.
		due := now.Add(delay).Add(time.Millisecond - 1).UnixMilli()
		hs = append(hs, stomp.Header{Key: hdrSTOMPDue, Value: strconv.FormatInt(due, 10)})
		if ahead := delay - stompScheduleLead; ahead >= time.Millisecond {
			if b.schedule == stompScheduleArtemis {
				hs = append(hs, stomp.Header{Key: "_AMQ_SCHED_DELIVERY", Value: strconv.FormatInt(now.Add(ahead).UnixMilli(), 10)})
			} else {
				hs = append(hs, stomp.Header{Key: "AMQ_SCHEDULED_DELAY", Value: strconv.FormatInt(ahead.Milliseconds(), 10)})
			}
		}
	}
	return hs, nil
}

// stompText checks a value the port writes into a header of its own.
func stompText(what, v string) error {
	if _, err := stompHeaders(map[string]any{"v": v}); err != nil {
		return fmt.Errorf("%s: not UTF-8 text without NUL: %w", what, ErrSTOMPHeader)
	}
	return nil
}

// sendOwn sends a message of the port's own (a marker, a probe, a probe's answer) to destination
// and waits for its RECEIPT. It is not counted.
func (b *STOMP) sendOwn(ctx context.Context, destination string, headers map[string]string, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	conn, err := b.publisher(ctx)
	if err != nil {
		return err
	}
	hs := []stomp.Header{{Key: "persistent", Value: "true"}}
	for k, v := range headers {
		hs = append(hs, stomp.Header{Key: k, Value: v})
	}
	return conn.Send(ctx, destination, hs, body)
}

// sendCopy sends a copy the rules or Redrive ordered (its headers ready) to destination, and
// waits for its RECEIPT: nil only once the broker has it. The test hooks around the write let
// tests withhold that RECEIPT.
func (b *STOMP) sendCopy(ctx context.Context, destination string, hs []stomp.Header, body []byte) error {
	conn, err := b.publisher(ctx)
	if err != nil {
		return err
	}
	h := b.hooks()
	if h.copySending != nil {
		h.copySending(destination)
	}
	r := conn.SendAsync(destination, hs, body)
	if h.copySent != nil {
		h.copySent(destination)
	}
	return r.Wait(ctx)
}
