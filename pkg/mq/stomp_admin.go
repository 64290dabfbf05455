package mq

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// stompBrowseCap bounds how many messages Diagnose and DeleteRoutes browse to count a queue:
// STOMP has no queue depth, only a listing.
const stompBrowseCap = 10000

// browse lists up to limit messages of a queue (all when limit <= 0) matching selector (all when
// empty), oldest first, with a browser subscription: nothing is consumed, nothing reordered
// (ActiveMQ's browser:true). Scheduled messages not yet due are not in the queue and not listed.
func (b *stompDriver) browse(ctx context.Context, queue, selector string, limit int) ([]*stomp.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	conn, err := b.publisher(ctx)
	if err != nil {
		return nil, err
	}
	s, err := conn.Subscribe(ctx, dest(queue), stomp.SubscribeOptions{Ack: stomp.AckAuto, Browser: true, Selector: selector})
	if err != nil {
		return nil, fmt.Errorf("browse %q: %w", queue, err)
	}
	defer unsubscribe(s)
	var out []*stomp.Message
	for limit <= 0 || len(out) < limit {
		select {
		case m, ok := <-s.C():
			if !ok {
				return nil, fmt.Errorf("browse %q: connection ended: %w", queue, conn.Err())
			}
			if m.Value("browser") == "end" {
				return out, nil
			}
			out = append(out, m)
		case <-ctx.Done():
			return nil, fmt.Errorf("browse %q: %w", queue, ctx.Err())
		}
	}
	return out, nil
}

// unsubscribe ends a subscription of the port's own, bounded.
func unsubscribe(s *stomp.Subscription) {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	s.Unsubscribe(ctx) //nolint:errcheck // the connection ending ends it too
}

// browseCount counts a queue's messages, at most limit (all, up to stompBrowseCap, when 0).
func (b *stompDriver) browseCount(ctx context.Context, queue string, limit int) (int, error) {
	if limit <= 0 {
		limit = stompBrowseCap
	}
	msgs, err := b.browse(ctx, queue, "", limit)
	return len(msgs), err
}

// declared checks a route's declaration marker: STOMP cannot tell a missing queue from an empty
// one, and ActiveMQ would create one on first use, so the dead-letter operations of a route never
// declared in this scope (by any process) fail with ErrUnknownRoute, as RabbitMQ's 404 makes them.
func (b *stompDriver) declared(ctx context.Context, q dlqRef) error {
	if err := ValidateName(q.queue + stompMarkerSuffix); err != nil {
		return err
	}
	n, err := b.browseCount(ctx, q.queue+stompMarkerSuffix, 1)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("route %q was never declared in scope %q: %w", q.route, b.p.cfg.Scope, ErrUnknownRoute)
	}
	return nil
}

// deadLetters lists a DLQ with a browser subscription, which neither consumes nor reorders.
func (b *stompDriver) deadLetters(ctx context.Context, q dlqRef, limit int) ([]DeadLetter, error) {
	if err := b.declared(ctx, q); err != nil {
		return nil, err
	}
	msgs, err := b.browse(ctx, q.dlq, "", limit)
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, len(msgs))
	for i, m := range msgs {
		id := cmp.Or(m.Value(hdrSTOMPID), m.MessageID)
		out[i] = deadLetterFrom(id, m.Body, fromSTOMP(m.Headers))
	}
	return out, nil
}

// idSelector selects the messages whose id is one of ids (every message when ids is empty): the
// id DeadLetters lists, which is mq_id for a message of the port and the broker's message-id
// (JMSMessageID to a selector) for one another producer sent.
func idSelector(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	q := make([]string, len(ids))
	for i, id := range ids {
		q[i] = selectorString(id)
	}
	in := " IN (" + strings.Join(q, ", ") + ")"
	return "(" + hdrSTOMPID + in + ") OR (" + hdrSTOMPID + " IS NULL AND JMSMessageID" + in + ")"
}

// takeDLQ consumes, one at a time, the messages of a route's DLQ whose ids are in ids (all when
// empty) — at most as many as it held when it started — and calls move on each; a message is
// acknowledged (removed) only once move returned nil. The first failure stops it: that message
// and the rest stay in the DLQ, in their positions.
func (b *stompDriver) takeDLQ(ctx context.Context, dlq string, ids []string, move func(m *stomp.Message) error) (int, error) {
	selector := idSelector(ids)
	want, err := b.browse(ctx, dlq, selector, 0)
	if err != nil || len(want) == 0 {
		return 0, err
	}
	conn, err := b.publisher(ctx)
	if err != nil {
		return 0, err
	}
	sctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	// Prefetch 1: the broker hands over the next only once this one is acknowledged, so a
	// failure leaves at most the message it failed on unacknowledged (returned by the UNSUBSCRIBE).
	s, err := conn.Subscribe(sctx, dest(dlq), stomp.SubscribeOptions{Ack: stomp.AckClientIndividual, Prefetch: 1, Selector: selector})
	if err != nil {
		return 0, fmt.Errorf("consume %q: %w", dlq, err)
	}
	defer unsubscribe(s)
	done := 0
	for range want {
		var m *stomp.Message
		wait := time.NewTimer(publishTimeout)
		select {
		case got, ok := <-s.C():
			wait.Stop()
			if !ok {
				return done, fmt.Errorf("consume %q: connection ended: %w", dlq, conn.Err())
			}
			m = got
		case <-wait.C:
			return done, nil // another process took the rest
		case <-ctx.Done():
			wait.Stop()
			return done, ctx.Err()
		}
		if err := move(m); err != nil {
			return done, err
		}
		actx, cancel := context.WithTimeout(ctx, publishTimeout)
		err := conn.Ack(actx, m.AckID)
		cancel()
		if err != nil {
			return done, fmt.Errorf("acknowledge in %q: %w", dlq, err)
		}
		done++
	}
	return done, nil
}

// redrive consumes the chosen dead letters (takeDLQ, selected on hdrSTOMPID, an
// identifier-named header: ActiveMQ cannot select on a hyphenated name) and sends each back to the
// work queue; each copy's RECEIPT comes before its dead letter is acknowledged in the DLQ, so a
// failure leaves it there, possibly duplicated, never lost.
func (b *stompDriver) redrive(ctx context.Context, q dlqRef, ids []string) (int, error) {
	if err := b.declared(ctx, q); err != nil {
		return 0, err
	}
	return b.takeDLQ(ctx, q.dlq, ids, func(m *stomp.Message) error {
		id := cmp.Or(m.Value(hdrSTOMPID), m.MessageID)
		h := fromSTOMP(m.Headers)
		redriveHeaders(h)
		ct := cmp.Or(m.Value("content-type"), defaultContentType)
		hs, err := b.sendHeaders(id, ct, h, 0, time.Now())
		if err != nil {
			return fmt.Errorf("message %q: %w", id, err)
		}
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		defer cancel()
		if err := b.sendCopy(pctx, dest(q.queue), hs, m.Body); err != nil {
			return fmt.Errorf("message %q: %w", id, err)
		}
		return nil
	})
}

// discard consumes the chosen dead letters (every copy of each) and acknowledges them.
func (b *stompDriver) discard(ctx context.Context, q dlqRef, ids []string) (int, error) {
	if err := b.declared(ctx, q); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	return b.takeDLQ(ctx, q.dlq, ids, func(*stomp.Message) error { return nil })
}

// diagnose says what STOMP can tell: the route's declaration marker (STOMP cannot ask whether a
// queue exists; ActiveMQ creates one on first use), the work queue's and the DLQ's ready messages
// (by browsing, up to stompBrowseCap; scheduled retries and deferrals are not counted), and a
// probe's round trip through the work queue, answered by whichever process consumes the route
// into a temporary queue of this connection. Consumers stays 0: STOMP does not tell how many
// consumers a queue has.
func (b *stompDriver) diagnose(ctx context.Context, top *topology, timeout time.Duration, d *Diagnosis) {
	if err := checkRoute(top.route); err != nil {
		d.problem("invalid route: %v", err)
		return
	}
	if n, err := b.browseCount(ctx, top.queue+stompMarkerSuffix, 1); err != nil {
		d.problem("no connection to the broker: %v", err)
		return
	} else if n == 0 {
		d.problem("route not declared in this scope (no declaration marker %s)", top.queue+stompMarkerSuffix)
	}
	var err error
	if d.Messages, err = b.browseCount(ctx, top.queue, 0); err != nil {
		d.problem("browse work queue %s: %v", top.queue, err)
	}
	if d.DLQ, err = b.browseCount(ctx, top.dlq, 0); err != nil {
		d.problem("browse dead-letter queue %s: %v", top.dlq, err)
	}
	d.answered(b.roundTrip(ctx, top.queue, timeout))
}

// roundTrip sends a probe to queue with a reply-to naming a temporary queue (it dies with the
// connection) and waits for a consumer's answer there.
func (b *stompDriver) roundTrip(ctx context.Context, queue string, timeout time.Duration) (time.Duration, []byte, error) {
	conn, err := b.publisher(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: %w", err)
	}
	id := uuid.NewString()
	replyTo := "/temp-queue/mq-probe-" + id
	sctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	s, err := conn.Subscribe(sctx, replyTo, stomp.SubscribeOptions{Ack: stomp.AckAuto})
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: subscribe reply queue: %w", err)
	}
	defer unsubscribe(s)
	start := time.Now()
	err = b.sendOwn(ctx, dest(queue), map[string]string{
		hdrSTOMPProbe: id, hdrSTOMPID: "mq-probe-" + id, hdrSTOMPSend: id, "reply-to": replyTo,
	}, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("round trip: probe publish to %s: %w", queue, err)
	}
	return awaitAnswer(ctx, s.C(), start, timeout, func(m *stomp.Message) ([]byte, bool) {
		return m.Body, m.Value(hdrSTOMPProbe) == id
	})
}

// deleteRoute empties every queue of the route in this scope — work queue, DLQ, declaration
// marker. That is all STOMP can do: it has no command to delete a destination (ActiveMQ keeps the
// empty queues until its own garbage collection of inactive destinations, when configured, takes
// them), nor to remove what the broker's scheduler holds: a retry or deferral scheduled for later
// still arrives in the emptied queue.
func (b *stompDriver) deleteRoute(ctx context.Context, t *topology) error {
	if err := checkRoute(t.route); err != nil {
		return err
	}
	for _, q := range []string{t.queue, t.dlq, t.queue + stompMarkerSuffix} {
		if err := b.drain(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// drain consumes and acknowledges every message a queue holds now.
func (b *stompDriver) drain(ctx context.Context, queue string) error {
	_, err := b.takeDLQ(ctx, queue, nil, func(*stomp.Message) error { return nil })
	if err != nil {
		return fmt.Errorf("empty %q: %w", queue, err)
	}
	return nil
}
