package mq

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	plog "github.com/integrations-platform/integrations/pkg/log"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// consume runs one Consume call on a connection of its own (recycling one consumer's subscription
// touches no other), subscribed with ack:client-individual and the route's prefetch
// (activemq.prefetchSize).
//
// A delivery returned to the broker while the consumer runs (the zero Result, a panic, a copy not
// confirmed) is a copy sent with the same attempt and confirmed, then the original acknowledged:
// a STOMP NACK does not redeliver (ActiveMQ Classic sends the message to ActiveMQ.DLQ, Artemis
// drops it), and an unacknowledged delivery comes back only when its subscription ends. If that
// copy is not confirmed, the original is left unacknowledged and the subscription recycled, which
// returns it. The copy counts the returns (hdrSTOMPRequeued), which no broker does for STOMP: the
// engine dead-letters a message returned deliveryLimit times (deadReasonDeliveryLimit). When the
// consumer stops, deliveries returned to the broker are simply left unacknowledged: the
// connection's end returns them, after the running handlers are settled (an UNSUBSCRIBE before
// would void their ACKs; see Drain).
func (b *stompDriver) consume(ctx context.Context, c *consumer) error {
	return run(ctx, c, &stompLink{b: b, c: c, latest: map[string]uint64{}})
}

// stompLink is one Consume call's hold on the STOMP broker: its connection and its subscriptions,
// one at a time. Workers acknowledge (with a RECEIPT) themselves: a STOMP connection takes
// concurrent writes, and the owner must not wait for RECEIPTs.
type stompLink struct {
	b    *stompDriver
	c    *consumer
	conn *stomp.Conn // the consumer's connection; owner only
	inst uint64      // subscriptions made; owner only
	// curGen and curInst are the generation of the current connection and the number of the
	// current subscription (0: none): the first two supersession checks read them.
	curGen, curInst atomic.Uint64

	mu     sync.Mutex
	seq    uint64
	latest map[string]uint64 // stable identity → the newest delivery of it in this consumer
}

// stompStream is one SUBSCRIBE on one connection. Its deliveries can only be acknowledged on that
// connection, by that subscription: once it is replaced or its connection is gone, their
// settlements are superseded.
type stompStream struct {
	l    *stompLink
	conn *stomp.Conn
	s    *stomp.Subscription
	inst uint64 // the consumer's count of its subscriptions: "the consumer was replaced"
	dead atomic.Bool
	// acking orders a worker's acknowledgement against the subscription's end: a worker holds it
	// (read) from its supersession checks until its ACK is written, the owner (write) to mark the
	// subscription dead before its UNSUBSCRIBE. An ACK written after the UNSUBSCRIBE names a
	// delivery the subscription no longer holds: Artemis answers it with an ERROR and closes the
	// connection (voiding every other ACK in flight), and Classic delivers the message again.
	acking sync.RWMutex
}

func (s *stompStream) deliveries() <-chan *stomp.Message { return s.s.C() }
func (s *stompStream) generation() uint64                { return s.conn.Generation() }

// stompDelivery is one delivery of a stream.
type stompDelivery struct {
	s       *stompStream
	m       *stomp.Message
	h       map[string]any // the decoded headers: the application's and the port's bookkeeping
	msg     *Message
	key     string // the delivery's stable identity for the "reissued" check: its send id
	seq     uint64 // this delivery's number within the consumer
	at      time.Time
	isProbe string
	gen     uint64 // the generation of the connection that delivered it
	// returned is how many times the message came back as a requeue copy (mq_requeued): the
	// port's own count, since no broker counts copies (see deadReasonDeliveryLimit).
	returned int
}

// delivery builds the engine's view of a delivery of s and makes it the newest of its identity.
func (s *stompStream) delivery(m *stomp.Message) delivery {
	l := s.l
	route := l.c.top.route
	h := fromSTOMP(m.Headers)
	id := cmp.Or(m.Value(hdrSTOMPID), m.MessageID) // a message the port did not publish
	key := m.Value(hdrSTOMPSend)
	if key == "" {
		key = "message-id:" + m.MessageID
	}
	requeued := m.Value(hdrSTOMPRequeued)
	redelivered := m.Value("redelivered") == "true" || requeued != ""
	j := &stompDelivery{s: s, m: m, h: h, key: key, gen: m.Generation, isProbe: m.Value(hdrSTOMPProbe)}
	if requeued != "" {
		// A count; "true" from a port that did not count yet is one.
		j.returned = 1
		if n, err := strconv.Atoi(requeued); err == nil && n > 0 {
			j.returned = n
		}
	}
	if ms, err := strconv.ParseInt(m.Value(hdrSTOMPDue), 10, 64); err == nil {
		j.at = time.UnixMilli(ms)
	}
	if j.isProbe == "" {
		j.msg = messageOf(route, id, m.Body, h, redelivered)
	} else {
		j.msg = &Message{ID: id, Route: route}
	}
	l.mu.Lock()
	l.seq++
	j.seq = l.seq
	l.latest[key] = j.seq
	l.mu.Unlock()
	return j
}

func (j *stompDelivery) message() *Message { return j.msg }
func (j *stompDelivery) probe() bool       { return j.isProbe != "" }
func (j *stompDelivery) due() time.Time    { return j.at }
func (j *stompDelivery) requeues() int     { return j.returned }

// done ends the delivery's claim on its identity, if it is still the newest.
func (j *stompDelivery) done() {
	l := j.s.l
	l.mu.Lock()
	if l.latest[j.key] == j.seq {
		delete(l.latest, j.key)
	}
	l.mu.Unlock()
}

// stale reports the three supersession checks: the connection changed (the delivery's generation
// is not the consumer's current one, or its connection ended), the consumer was replaced (its
// subscription is not the current one), or the delivery was reissued (a newer delivery of the
// same SEND is in this consumer).
func (j *stompDelivery) stale() bool {
	l := j.s.l
	if j.gen != l.curGen.Load() || isDone(j.s.conn.Done()) {
		return true
	}
	if j.s.dead.Load() || j.s.inst != l.curInst.Load() {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latest[j.key] != j.seq
}

func (j *stompDelivery) contentType() string {
	if ct := j.m.Value("content-type"); ct != "" {
		return ct
	}
	return defaultContentType
}

// sendCopy sends the copy o orders — the delivery's id, body, application and bookkeeping
// headers, the order's applied — confirmed: a retry to the work queue scheduled after the
// policy's delay for the attempt, a deferral scheduled after its delay level, a dead letter to
// the DLQ.
func (j *stompDelivery) sendCopy(ctx context.Context, o copyOrder) (string, error) {
	top := j.s.l.c.top
	b := j.s.l.b
	h := copyHeaders(j.h)
	o.apply(h)
	destination := dest(top.queue)
	var delay time.Duration
	switch o.kind {
	case copyRetry:
		delay = top.retryTTLs[min(max(o.attempt-1, 0), len(top.retryTTLs)-1)]
	case copyDefer:
		delay = o.delay
		if _, ttl, ok := top.delayQueue(o.delay); ok {
			delay = ttl
		}
	case copyDeadLetter:
		destination = dest(top.dlq)
	default:
		return "", fmt.Errorf("mq: copy of unknown kind %d", o.kind)
	}
	hs, err := b.sendHeaders(j.msg.ID, j.contentType(), h, delay, time.Now())
	if err != nil {
		return destination, err
	}
	return destination, b.sendCopy(ctx, destination, hs, j.m.Body)
}

// copyHeaders is a copy of a delivery's decoded headers a copy may change.
func copyHeaders(h map[string]any) map[string]any {
	out := make(map[string]any, len(h)+6)
	for k, v := range h {
		out[k] = v
	}
	return out
}

// subscribe dials the consumer's connection if it has none alive, and subscribes to the route's
// work queue with client-individual acknowledgement and the route's prefetch.
func (l *stompLink) subscribe(ctx context.Context) (stream[*stomp.Message], error) {
	top := l.c.top
	if l.conn != nil && isDone(l.conn.Done()) {
		l.b.release(l.conn, time.Second)
		l.conn = nil
	}
	if l.conn == nil {
		conn, err := l.b.dial(ctx, "consume")
		if err != nil {
			return nil, err
		}
		l.conn = conn
	}
	sctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	s, err := l.conn.Subscribe(sctx, dest(top.queue), stomp.SubscribeOptions{
		Ack: stomp.AckClientIndividual, Prefetch: top.prefetch,
	})
	if err != nil {
		// A connection that cannot subscribe is not trusted with the next try.
		l.b.release(l.conn, time.Second)
		l.conn = nil
		return nil, fmt.Errorf("subscribe %q: %w", top.queue, err)
	}
	l.inst++
	sub := &stompStream{l: l, conn: l.conn, s: s, inst: l.inst}
	l.curGen.Store(l.conn.Generation())
	l.curInst.Store(sub.inst)
	return sub, nil
}

// retire marks s replaced: its deliveries' settlements are superseded from now on. wait: s's
// connection lives on, so the ACKs workers are writing on it are let through first (what follows
// is an UNSUBSCRIBE); a lost connection voids them anyway.
func (l *stompLink) retire(s *stompStream, wait bool) {
	if wait {
		if h := l.b.hooks().retiring; h != nil {
			h()
		}
		s.acking.Lock()
		s.dead.Store(true)
		s.acking.Unlock()
	} else {
		s.dead.Store(true)
	}
	l.curInst.CompareAndSwap(s.inst, 0)
}

// lose retires a subscription whose channel closed: its connection ended (a network fault, a
// heart-beat timeout, an ERROR frame). The broker returns everything unacknowledged on it.
func (l *stompLink) lose(st stream[*stomp.Message]) (ours bool, reason error) {
	s := st.(*stompStream)
	l.retire(s, false)
	err := s.conn.Err()
	l.b.release(s.conn, time.Second)
	if l.conn == s.conn {
		l.conn = nil
	}
	return false, err
}

// recycle ends s (UNSUBSCRIBE), so that the broker returns the delivery a worker left
// unacknowledged with every other one s holds.
func (l *stompLink) recycle(ctx context.Context, st stream[*stomp.Message]) {
	s := st.(*stompStream)
	l.retire(s, true)
	uctx, cancel := context.WithTimeout(ctx, l.c.grace)
	defer cancel()
	if err := s.s.Unsubscribe(uctx); err != nil {
		// The connection may be what failed: a fresh one returns the deliveries just the same.
		l.c.log.Warn("mq unsubscribe failed; reconnecting", zap.Error(err))
		l.b.release(s.conn, time.Second)
		if l.conn == s.conn {
			l.conn = nil
		}
	}
}

// halt stops nothing: STOMP cannot stop a subscription's flow without ending it, and ending it
// would void the running handlers' ACKs. What arrives meanwhile is given back, left
// unacknowledged until end.
func (l *stompLink) halt(stream[*stomp.Message]) (bool, []*stomp.Message) { return true, nil }

// end retires s and closes the consumer's connection (DISCONNECT, at most grace), which returns
// to the broker whatever it still holds unacknowledged.
func (l *stompLink) end(st stream[*stomp.Message], grace time.Duration) {
	if st != nil {
		l.retire(st.(*stompStream), false)
	}
	if l.conn != nil {
		l.b.release(l.conn, grace)
		l.conn = nil
	}
}

// giveBack leaves a delivery unacknowledged: the consumer is stopping, and its connection's end
// returns it (a copy would stand beside it).
func (l *stompLink) giveBack(_ delivery, report func(settled)) { report(settledOK) }

// settle acknowledges a delivery (ACK with a RECEIPT) on its own subscription. A requeue while the
// consumer runs is a copy to the work queue, confirmed, then the original's ACK; a requeue of a
// stopping consumer leaves the delivery unacknowledged (the connection's end returns it). It asks
// for a recycle when a requeue copy was not confirmed (the original, unacknowledged, must come
// back) or an ACK went unanswered on a live connection (the broker may still hold the delivery,
// and on Classic would hold it for as long as the subscription lives).
func (l *stompLink) settle(d delivery, v verdict, stopping bool, report func(settled)) bool {
	j := d.(*stompDelivery)
	if v.act == actRequeue && !stopping && !j.stale() {
		if err := l.requeueCopy(j); err != nil {
			l.c.log.Warn("mq requeue copy not confirmed; recycling the subscription to return the delivery",
				zap.String("message_id", j.msg.ID), zap.Error(err))
			report(settledOK)
			return true
		}
		v.act = actAck // the copy is the message now
	}
	// Held from the checks until the ACK is written: a recycle's UNSUBSCRIBE goes after it.
	j.s.acking.RLock()
	switch {
	case v.act == actNone || j.stale():
		j.s.acking.RUnlock()
		report(settledSuperseded)
		return false
	case v.act == actRequeue:
		j.s.acking.RUnlock()
		report(settledOK)
		return false
	}
	if h := l.b.hooks().settling; h != nil && !j.probe() {
		h(j.msg, func() {
			j.s.conn.Write(&stomp.Frame{Command: "ACK", Headers: []stomp.Header{{Key: "id", Value: j.m.AckID}}}) //nolint:errcheck // the port's ACK shows the outcome
		})
	}
	r := j.s.conn.Post(&stomp.Frame{Command: "ACK", Headers: []stomp.Header{{Key: "id", Value: j.m.AckID}}})
	j.s.acking.RUnlock()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	err := r.Wait(ctx)
	if err == nil {
		report(settledOK)
		return false
	}
	if _, refused := err.(*stomp.ServerError); refused { //nolint:errorlint // only the ERROR answering this ACK itself, not one wrapped in the connection's end
		// The broker answered this ACK with an ERROR on a live connection: it did not hold the
		// delivery (a bug of ours). The account must show it.
		report(settledLost)
		l.c.log.Error("mq acknowledgement refused by the broker", zap.String("message_id", j.msg.ID),
			plog.Deliveries(j.msg.Attempt), zap.Error(err))
		return false // the broker closes the connection after an ERROR
	}
	if isDone(j.s.conn.Done()) || j.s.conn.Err() != nil {
		// The connection went away under the ACK: the broker redelivers. Err as well as Done: a
		// connection records why it ended a moment before it closes Done, and an ACK posted in
		// between fails with that reason at once — counted lost, on a loaded machine, before
		// (issue 22: the contract suite's connection cut, 1 in ~70 runs under load).
		report(settledSuperseded)
		l.c.log.Debug("mq acknowledgement on a connection going away; superseded",
			zap.String("message_id", j.msg.ID), zap.Error(err))
		return false
	}
	report(settledLost)
	l.c.log.Error("mq acknowledgement without an answer on a live connection; recycling the subscription",
		zap.String("message_id", j.msg.ID), plog.Deliveries(j.msg.Attempt), zap.Error(err))
	return true
}

// requeueCopy returns a delivery to the broker the STOMP way: a copy, same attempt and headers,
// marked redelivered with the count of its returns, sent to the work queue and confirmed.
func (l *stompLink) requeueCopy(j *stompDelivery) error {
	ctx, cancel := l.c.copyContext()
	defer cancel()
	h := copyHeaders(j.h)
	hs, err := l.b.sendHeaders(j.msg.ID, j.contentType(), h, 0, time.Now())
	if err != nil {
		return err
	}
	hs = append(hs, stomp.Header{Key: hdrSTOMPRequeued, Value: strconv.Itoa(j.returned + 1)})
	return l.b.sendCopy(ctx, dest(l.c.top.queue), hs, j.m.Body)
}

// answerProbe answers a Diagnose probe to its reply-to destination; a probe nobody waits for
// any more is answered into the void.
func (l *stompLink) answerProbe(ctx context.Context, d delivery, counters Counters) {
	j := d.(*stompDelivery)
	replyTo := j.m.Value("reply-to")
	if replyTo == "" || j.stale() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	body, _ := json.Marshal(probeAnswer{By: processName, Counters: counters})
	if err := l.b.sendOwn(ctx, replyTo, map[string]string{hdrSTOMPProbe: j.isProbe}, body); err != nil {
		l.c.log.Info("mq diagnostic probe answered into the void", zap.Error(err))
	}
}
