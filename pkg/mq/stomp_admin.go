package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
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
func (b *STOMP) browse(ctx context.Context, queue, selector string, limit int) ([]*stomp.Message, error) {
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
			if stompValue(m.Headers, "browser") == "end" {
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
func (b *STOMP) browseCount(ctx context.Context, queue string, limit int) (int, error) {
	if limit <= 0 {
		limit = stompBrowseCap
	}
	msgs, err := b.browse(ctx, queue, "", limit)
	return len(msgs), err
}

// stompDLQ is a route's scoped work queue and DLQ, once its declaration marker shows that the
// route was declared in this scope (by any process): STOMP cannot tell a missing queue from an
// empty one, and ActiveMQ would create one on first use.
func (b *STOMP) stompDLQ(ctx context.Context, route string) (queue, dlq string, err error) {
	if err := validateRoute(route); err != nil {
		return "", "", err
	}
	queue = b.QueueName(route)
	dlq = queue + ".dlq"
	if err := ValidateName(queue + stompMarkerSuffix); err != nil {
		return "", "", err
	}
	n, err := b.browseCount(ctx, queue+stompMarkerSuffix, 1)
	if err != nil {
		return "", "", err
	}
	if n == 0 {
		return "", "", fmt.Errorf("route %q was never declared in scope %q: %w", route, b.cfg.Scope, ErrUnknownRoute)
	}
	return queue, dlq, nil
}

// DeadLetters lists up to limit messages at the head of a route's DLQ, oldest first, without
// taking them: a browser subscription, which neither consumes nor reorders. The route need not be
// declared on this Broker, but in its scope (ErrUnknownRoute otherwise).
func (b *STOMP) DeadLetters(ctx context.Context, route string, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("mq: dead letters of %q: limit %d must be positive", route, limit)
	}
	_, dlq, err := b.stompDLQ(ctx, route)
	if err != nil {
		return nil, fmt.Errorf("mq: dead letters of %q: %w", route, err)
	}
	msgs, err := b.browse(ctx, dlq, "", limit)
	if err != nil {
		return nil, fmt.Errorf("mq: dead letters of %q: %w", route, err)
	}
	out := make([]DeadLetter, len(msgs))
	for i, m := range msgs {
		id := stompValue(m.Headers, hdrSTOMPID)
		if id == "" {
			id = m.MessageID
		}
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
func (b *STOMP) takeDLQ(ctx context.Context, dlq string, ids []string, move func(m *stomp.Message) error) (int, error) {
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

// Redrive moves the dead letters of a route whose ids are in ids (all of them when empty) back to
// the route's work queue with a fresh attempt budget (see [RabbitMQ.Redrive]): each copy's
// RECEIPT comes before its dead letter is acknowledged in the DLQ, so a failure leaves it there,
// possibly duplicated, never lost. The dead letters are chosen by a selector on hdrSTOMPID, an
// identifier-named header (ActiveMQ cannot select on a hyphenated name).
func (b *STOMP) Redrive(ctx context.Context, route string, ids []string) (int, error) {
	queue, dlq, err := b.stompDLQ(ctx, route)
	if err != nil {
		return 0, fmt.Errorf("mq: redrive %q: %w", route, err)
	}
	st := b.routeStats(route)
	moved, err := b.takeDLQ(ctx, dlq, ids, func(m *stomp.Message) error {
		id := stompValue(m.Headers, hdrSTOMPID)
		if id == "" {
			id = m.MessageID
		}
		h := fromSTOMP(m.Headers)
		redriveHeaders(h)
		ct := stompValue(m.Headers, "content-type")
		if ct == "" {
			ct = defaultContentType
		}
		hs, err := b.sendHeaders(id, ct, h, 0, time.Now())
		if err != nil {
			return fmt.Errorf("message %q: %w", id, err)
		}
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		defer cancel()
		if err := b.sendCopy(pctx, dest(queue), hs, m.Body); err != nil {
			return fmt.Errorf("message %q: %w", id, err)
		}
		st.inc(evRedriven)
		return nil
	})
	if err != nil {
		return moved, fmt.Errorf("mq: redrive %q: %w", route, err)
	}
	return moved, nil
}

// Discard removes from a route's DLQ the dead letters whose ids are in ids (every copy of each);
// an empty ids removes nothing (see [RabbitMQ.Discard]).
func (b *STOMP) Discard(ctx context.Context, route string, ids []string) (int, error) {
	_, dlq, err := b.stompDLQ(ctx, route)
	if err != nil {
		return 0, fmt.Errorf("mq: discard from %q: %w", route, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	removed, err := b.takeDLQ(ctx, dlq, ids, func(*stomp.Message) error { return nil })
	if err != nil {
		return removed, fmt.Errorf("mq: discard from %q: %w", route, err)
	}
	return removed, nil
}

// Diagnose checks each route, concurrently, as far as STOMP can tell: the route's declaration
// marker (STOMP cannot ask whether a queue exists; ActiveMQ creates one on first use), the work
// queue's and the DLQ's ready messages (by browsing, up to stompBrowseCap; scheduled retries and
// deferrals are not counted), and a probe's round trip through the work queue, answered by
// whichever process consumes the route into a temporary queue of this connection. Consumers stays
// 0: STOMP does not tell how many consumers a queue has.
func (b *STOMP) Diagnose(ctx context.Context, routes []Route, timeout time.Duration) []Diagnosis {
	if timeout <= 0 {
		timeout = defaultDiagnoseTimeout
	}
	out := make([]Diagnosis, len(routes))
	var wg sync.WaitGroup
	for i, r := range routes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = b.diagnose(ctx, r, timeout)
		}()
	}
	wg.Wait()
	return out
}

func (b *STOMP) diagnose(ctx context.Context, r Route, timeout time.Duration) (d Diagnosis) {
	d.Route = r.Name
	defer func() {
		if d.AnsweredBy == "" {
			d.Counters = b.Counters(r.Name)
		}
		d.OK = len(d.Problems) == 0
	}()
	problem := func(format string, args ...any) { d.Problems = append(d.Problems, fmt.Sprintf(format, args...)) }
	top, err := b.planSTOMP(r)
	if err != nil {
		problem("invalid route: %v", err)
		return d
	}
	if n, err := b.browseCount(ctx, top.queue+stompMarkerSuffix, 1); err != nil {
		problem("no connection to the broker: %v", err)
		return d
	} else if n == 0 {
		problem("route not declared in this scope (no declaration marker %s)", top.queue+stompMarkerSuffix)
	}
	if d.Messages, err = b.browseCount(ctx, top.queue, 0); err != nil {
		problem("browse work queue %s: %v", top.queue, err)
	}
	if d.DLQ, err = b.browseCount(ctx, top.dlq, 0); err != nil {
		problem("browse dead-letter queue %s: %v", top.dlq, err)
	}
	rt, answer, err := b.roundTrip(ctx, top.queue, timeout)
	if err != nil {
		problem("%v", err)
		return d
	}
	d.RoundTrip = rt
	if answer != nil {
		d.AnsweredBy, d.Counters = answer.By, answer.Counters
	}
	return d
}

// roundTrip sends a probe to queue with a reply-to naming a temporary queue (it dies with the
// connection) and waits for a consumer's answer there.
func (b *STOMP) roundTrip(ctx context.Context, queue string, timeout time.Duration) (time.Duration, *probeAnswer, error) {
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
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	for {
		select {
		case m, ok := <-s.C():
			if !ok {
				return 0, nil, errors.New("round trip: reply subscription ended")
			}
			if stompValue(m.Headers, hdrSTOMPProbe) != id {
				continue
			}
			rt := time.Since(start)
			var answer probeAnswer
			if json.Unmarshal(m.Body, &answer) != nil || answer.By == "" {
				return rt, nil, nil
			}
			return rt, &answer, nil
		case <-wait.C:
			return 0, nil, fmt.Errorf("no consumer answered within %v", timeout)
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("round trip: %w", ctx.Err())
		}
	}
}

// DeleteRoutes empties every queue of the routes in this scope — work queue, DLQ, declaration
// marker — and forgets them. That is all STOMP can do: it has no command to delete a
// destination (ActiveMQ keeps the empty queues until its own garbage collection of inactive
// destinations, when configured, takes them), nor to remove what the broker's scheduler holds:
// a retry or deferral scheduled for later still arrives in the emptied queue.
func (b *STOMP) DeleteRoutes(ctx context.Context, routes ...Route) error {
	for _, r := range routes {
		t, err := b.planSTOMP(r)
		if err != nil {
			return err
		}
		for _, q := range []string{t.queue, t.dlq, t.queue + stompMarkerSuffix} {
			if err := b.drain(ctx, q); err != nil {
				return fmt.Errorf("mq: delete routes: %w", err)
			}
		}
		b.mu.Lock()
		delete(b.routes, r.Name)
		b.mu.Unlock()
	}
	return nil
}

// drain consumes and acknowledges every message a queue holds now.
func (b *STOMP) drain(ctx context.Context, queue string) error {
	_, err := b.takeDLQ(ctx, queue, nil, func(*stomp.Message) error { return nil })
	if err != nil {
		return fmt.Errorf("empty %q: %w", queue, err)
	}
	return nil
}
