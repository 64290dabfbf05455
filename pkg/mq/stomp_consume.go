package mq

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/stomp"
)

// stompSub is one SUBSCRIBE on one connection. Its deliveries can only be acknowledged on that
// connection, by that subscription: once it is replaced or its connection is gone, their
// settlements are superseded.
type stompSub struct {
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

// stompJob is one delivery on its way to, or in, a worker.
type stompJob struct {
	c      *stompConsumer
	sub    *stompSub
	m      *stomp.Message
	h      map[string]any // the decoded headers: the application's and the port's bookkeeping
	msg    *Message
	key    string // the delivery's stable identity for the "reissued" check: its send id
	seq    uint64 // this delivery's number within the consumer
	due    time.Time
	probe  string
	gen    uint64 // the generation of the connection that delivered it
	gotten time.Time
	// requeues is how many times the message came back as a requeue copy (mq_requeued): the
	// port's own count, since no broker counts copies (see deadReasonDeliveryLimit).
	requeues int
}

// deadReasonDeliveryLimit is the reason of a dead letter the STOMP provider sends once a message
// came back deliveryLimit times as a requeue copy (the zero Result, a panic): RabbitMQ's broker
// dead-letters such a message by x-delivery-limit, with this reason, and without a bound a
// poison message would be copied and acked for ever.
const deadReasonDeliveryLimit = "delivery_limit"

// stompDone is a worker's report on a job, to the owner goroutine.
type stompDone struct {
	job     *stompJob
	recycle bool // the job was left unacknowledged on a live subscription: recycle it to return it
}

// stompConsumer is one Consume call on the STOMP provider. Its owner goroutine (Consume's caller)
// owns the connection and the subscription: it subscribes, receives, hands deliveries to workers,
// and recycles or replaces the subscription. Workers settle (ACK with a RECEIPT) themselves: a
// STOMP connection takes concurrent writes, and the owner must not wait for RECEIPTs.
type stompConsumer struct {
	*rules
	b     *stompDriver
	top   *topology
	stop  context.CancelFunc
	grace time.Duration
	jobs  chan *stompJob
	res   chan stompDone
	gone  chan struct{}
	queue []*stompJob
	busy  int

	conn *stomp.Conn // the consumer's connection; owner only
	inst uint64      // subscriptions made; owner only
	// curGen and curInst are the generation of the current connection and the number of the
	// current subscription (0: none): the first two supersession checks read them.
	curGen, curInst atomic.Uint64

	mu     sync.Mutex
	seq    uint64
	latest map[string]uint64 // stable identity → the newest delivery of it in this consumer
}

// consume runs one Consume call. It subscribes with ack:client-individual and the route's
// prefetch (activemq.prefetchSize) on a connection of its own, and reconnects by itself, with
// backoff, for as long as ctx lives.
//
// A delivery returned to the broker while the consumer runs (the zero Result, a panic, a copy not
// confirmed) is a copy sent with the same attempt and confirmed, then the original acknowledged:
// a STOMP NACK does not redeliver (ActiveMQ Classic sends the message to ActiveMQ.DLQ, Artemis
// drops it), and an unacknowledged delivery comes back only when its subscription ends. If that
// copy is not confirmed, the original is left unacknowledged and the subscription recycled, which
// returns it. A message returned deliveryLimit times so is dead-lettered instead
// (deadReasonDeliveryLimit). When the consumer stops, deliveries returned to the broker are simply left
// unacknowledged: the subscription's end returns them. Stopping is as on RabbitMQ ([Drain] too),
// but for one thing: the deliveries taken and not started go back to the broker only when the
// consumer disconnects, once its running handlers are settled (an UNSUBSCRIBE before would void
// their ACKs).
func (b *stompDriver) consume(ctx context.Context, top *topology, r *rules, stop context.CancelFunc, grace time.Duration, concurrency int) error {
	c := &stompConsumer{
		rules:  r,
		b:      b,
		top:    top,
		stop:   stop,
		grace:  grace,
		jobs:   make(chan *stompJob),
		res:    make(chan stompDone),
		gone:   make(chan struct{}),
		latest: map[string]uint64{},
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
func (c *stompConsumer) run(ctx context.Context, workers *sync.WaitGroup) error {
	var sub *stompSub
	attempt := 0
	retry := time.NewTimer(0) // subscribe at once
	defer retry.Stop()
	for {
		var deliveries <-chan *stomp.Message
		var retryC <-chan time.Time
		if sub != nil {
			deliveries = sub.s.C()
		} else {
			retryC = retry.C
		}
		var jobs chan *stompJob
		var next *stompJob
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
				c.log.Info("mq consumer resubscribed", zap.Uint64("generation", s.conn.Generation()))
			}
			attempt = 0
			sub = s
		case m, ok := <-deliveries:
			if !ok {
				c.lose(sub)
				sub = nil
				attempt++
				retry.Reset(backoff(attempt))
				continue
			}
			c.busy++
			c.queue = append(c.queue, c.newJob(sub, m))
		case jobs <- next:
			c.queue[0] = nil
			c.queue = c.queue[1:]
		case d := <-c.res:
			c.busy--
			if d.recycle && sub != nil && d.job.sub == sub {
				c.recycle(ctx, sub)
				sub = nil
				retry.Reset(0)
			}
		}
	}
}

// newJob builds a job of a delivery of sub and makes it the newest of its identity.
func (c *stompConsumer) newJob(sub *stompSub, m *stomp.Message) *stompJob {
	h := fromSTOMP(m.Headers)
	id := stompValue(m.Headers, hdrSTOMPID)
	if id == "" {
		id = m.MessageID // a message the port did not publish
	}
	key := stompValue(m.Headers, hdrSTOMPSend)
	if key == "" {
		key = "message-id:" + m.MessageID
	}
	requeued := stompValue(m.Headers, hdrSTOMPRequeued)
	redelivered := stompValue(m.Headers, "redelivered") == "true" || requeued != ""
	j := &stompJob{c: c, sub: sub, m: m, h: h, key: key, gen: m.Generation, gotten: time.Now(),
		probe: stompValue(m.Headers, hdrSTOMPProbe)}
	if requeued != "" {
		// A count; "true" from a port that did not count yet is one.
		j.requeues = 1
		if n, err := strconv.Atoi(requeued); err == nil && n > 0 {
			j.requeues = n
		}
	}
	if ms, err := strconv.ParseInt(stompValue(m.Headers, hdrSTOMPDue), 10, 64); err == nil {
		j.due = time.UnixMilli(ms)
	}
	if j.probe == "" {
		j.msg = messageOf(c.top.route, id, m.Body, h, redelivered)
	} else {
		j.msg = &Message{ID: id, Route: c.top.route}
	}
	c.mu.Lock()
	c.seq++
	j.seq = c.seq
	c.latest[key] = j.seq
	c.mu.Unlock()
	return j
}

// subscribe dials the consumer's connection if it has none alive, and subscribes to the route's
// work queue with client-individual acknowledgement and the route's prefetch.
func (c *stompConsumer) subscribe(ctx context.Context) (*stompSub, error) {
	if c.conn != nil && isDone(c.conn.Done()) {
		c.b.release(c.conn, time.Second)
		c.conn = nil
	}
	if c.conn == nil {
		conn, err := c.b.dial(ctx, "consume")
		if err != nil {
			return nil, err
		}
		c.conn = conn
	}
	sctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	s, err := c.conn.Subscribe(sctx, dest(c.top.queue), stomp.SubscribeOptions{
		Ack: stomp.AckClientIndividual, Prefetch: c.top.prefetch,
	})
	if err != nil {
		// A connection that cannot subscribe is not trusted with the next try.
		c.b.release(c.conn, time.Second)
		c.conn = nil
		return nil, fmt.Errorf("subscribe %q: %w", c.top.queue, err)
	}
	c.inst++
	sub := &stompSub{conn: c.conn, s: s, inst: c.inst}
	c.curGen.Store(c.conn.Generation())
	c.curInst.Store(sub.inst)
	if h := c.b.hooks().subscribed; h != nil {
		h(c.top.route, c.conn.Generation())
	}
	return sub, nil
}

// retire marks sub replaced and drops its queued jobs, counting them superseded: the broker
// returns them when the subscription ends. wait: sub's connection lives on, so the ACKs workers
// are writing on it are let through first (what follows is an UNSUBSCRIBE); a lost connection
// voids them anyway.
func (c *stompConsumer) retire(sub *stompSub, wait bool) int {
	if wait {
		if h := c.b.hooks().stompRetiring; h != nil {
			h()
		}
		sub.acking.Lock()
		sub.dead.Store(true)
		sub.acking.Unlock()
	} else {
		sub.dead.Store(true)
	}
	c.curInst.CompareAndSwap(sub.inst, 0)
	kept := c.queue[:0]
	dropped := 0
	for _, j := range c.queue {
		if j.sub == sub {
			dropped++
			c.forget(j)
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

// lose retires a subscription whose channel closed: its connection ended (a network fault, a
// heart-beat timeout, an ERROR frame). The broker returns everything unacknowledged on it.
func (c *stompConsumer) lose(sub *stompSub) {
	dropped := c.retire(sub, false)
	err := sub.conn.Err()
	c.log.Warn("mq consumer lost its connection; resubscribing", zap.Uint64("generation", sub.conn.Generation()),
		zap.Int("superseded", dropped), zap.Error(err))
	c.b.release(sub.conn, time.Second)
	if c.conn == sub.conn {
		c.conn = nil
	}
}

// recycle ends sub (UNSUBSCRIBE), so that the broker returns the delivery a worker left
// unacknowledged — with every other one sub holds, whose settlements are then superseded — and
// the loop subscribes again.
func (c *stompConsumer) recycle(ctx context.Context, sub *stompSub) {
	dropped := c.retire(sub, true)
	c.log.Warn("mq consumer recycling its subscription to return a delivery", zap.Int("superseded", dropped))
	uctx, cancel := context.WithTimeout(ctx, c.grace)
	defer cancel()
	if err := sub.s.Unsubscribe(uctx); err != nil {
		// The connection may be what failed: a fresh one returns the deliveries just the same.
		c.log.Warn("mq unsubscribe failed; reconnecting", zap.Error(err))
		c.b.release(sub.conn, time.Second)
		if c.conn == sub.conn {
			c.conn = nil
		}
	}
}

// forget ends a job's claim on its identity, if it is still the newest.
func (c *stompConsumer) forget(j *stompJob) {
	c.mu.Lock()
	if c.latest[j.key] == j.seq {
		delete(c.latest, j.key)
	}
	c.mu.Unlock()
}

// reissued reports that a newer delivery of j's message is in this consumer.
func (c *stompConsumer) reissued(j *stompJob) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.latest[j.key] != j.seq
}

// shutdown is the owner's exit on ctx's end: no handler starts from now on; queued deliveries and
// any that still arrive are left unacknowledged (counted requeued: the subscription's end returns
// them); running handlers finish (until the handlers' context ends, then at most the grace, and
// the copies being confirmed) and settle; then the subscription and the connection end.
func (c *stompConsumer) shutdown(sub *stompSub, workers *sync.WaitGroup) {
	close(c.halt)
	for _, j := range c.queue {
		c.forget(j)
	}
	c.st.add(evRequeued, len(c.queue))
	c.busy -= len(c.queue)
	c.queue = nil
	close(c.jobs)
	var deliveries <-chan *stomp.Message
	if sub != nil {
		deliveries = sub.s.C()
	}
	var graceC, copiesC <-chan time.Time
	workDone := c.ctx.Done()
	abandoned := false
wait:
	for c.busy > 0 {
		select {
		case _, ok := <-deliveries:
			if !ok {
				deliveries = nil
				continue
			}
			c.st.inc(evRequeued) // never handled: returned with the subscription
		case <-c.res:
			c.busy--
			if copiesC != nil && c.copying.Load() == 0 && c.busy > 0 {
				abandoned = true
				break wait
			}
		case <-workDone:
			workDone = nil
			grace := time.NewTimer(c.grace)
			defer grace.Stop()
			graceC = grace.C
		case <-graceC:
			graceC = nil
			if n := c.copying.Load(); n > 0 {
				// A copy on its way must be confirmed and its original acked, or both stand.
				copies := time.NewTimer(publishTimeout)
				defer copies.Stop()
				copiesC = copies.C
				continue
			}
			abandoned = true
			break wait
		case <-copiesC:
			abandoned = true
			break wait
		case <-c.b.p.closed:
			abandoned = true
			break wait
		}
	}
	if abandoned {
		c.log.Error("mq handlers did not return within the shutdown grace; leaving them to the broker",
			zap.Int("handlers", c.busy), zap.Duration("grace", c.grace))
	}
	c.stop()
	close(c.gone)
	if sub != nil {
		sub.dead.Store(true)
	}
	if c.conn != nil {
		// DISCONNECT returns to the broker whatever the connection still holds unacknowledged.
		c.b.release(c.conn, c.grace)
		c.conn = nil
	}
	if !abandoned {
		workers.Wait()
		return
	}
	awaitWorkers(c.log, workers, time.Second)
}

// abandon is the owner's exit when the Broker is closed: the connections are gone, the broker
// returns everything; nothing is left to settle.
func (c *stompConsumer) abandon(sub *stompSub, workers *sync.WaitGroup) {
	close(c.halt)
	c.stop()
	if sub != nil {
		sub.dead.Store(true)
	}
	c.st.add(evSuperseded, len(c.queue))
	c.queue = nil
	close(c.jobs)
	close(c.gone)
	if c.conn != nil {
		c.b.release(c.conn, time.Second)
		c.conn = nil
	}
	awaitWorkers(c.log, workers, c.grace)
}

// awaitWorkers waits for worker goroutines to return, at most d.
func awaitWorkers(log *zap.Logger, workers *sync.WaitGroup, d time.Duration) {
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
		log.Error("mq handlers still running after the consumer stopped", zap.Duration("waited", d))
	}
}

// work is one worker goroutine: it runs the rules on a job, settles it, and reports to the owner.
func (c *stompConsumer) work() {
	for j := range c.jobs {
		d := c.process(j)
		c.forget(j)
		select {
		case c.res <- d:
		case <-c.gone:
		}
	}
}

// process handles and settles one job.
func (c *stompConsumer) process(j *stompJob) stompDone {
	if j.probe != "" {
		c.answerProbe(j)
		return stompDone{job: j, recycle: c.settle(j, verdict{act: actAck}, true)}
	}
	v := verdict{act: actRequeue, ev: evRequeued} // stopped while held
	if c.hold(j) {
		v = c.rules.handle(j)
	}
	// Stopping (the handlers' context ends before the owner closes halt): the subscription's end
	// returns the delivery, and a copy would stand beside it.
	if v.act == actRequeue && !c.halted() && c.ctx.Err() == nil && !j.stale() && j.requeues >= deliveryLimit {
		// The backstop: dead-lettered rather than copied once more. If that copy is not
		// confirmed, the requeue below goes ahead and the next delivery tries again.
		log := c.log.With(zap.String("message_id", j.msg.ID), zap.Int("attempt", j.msg.Attempt))
		log.Error("mq message returned to the broker too many times without a result; dead-lettering",
			zap.Int("requeues", j.requeues))
		if dl := c.rules.deadLetter(j, log, deadReasonDeliveryLimit,
			fmt.Errorf("returned to the broker %d times without a result", j.requeues)); dl.act != actRequeue {
			v = dl
		}
	}
	if v.act == actRequeue && !c.halted() && c.ctx.Err() == nil && !j.stale() {
		if err := c.requeueCopy(j); err != nil {
			c.log.Warn("mq requeue copy not confirmed; recycling the subscription to return the delivery",
				zap.String("message_id", j.msg.ID), zap.Error(err))
			c.st.inc(v.ev)
			return stompDone{job: j, recycle: true}
		}
		v.act = actAck // the copy is the message now
	}
	return stompDone{job: j, recycle: c.settle(j, v, false)}
}

// hold waits, in the worker, until a scheduled copy is due (the broker may deliver it up to
// stompScheduleLead early); false when the consumer stopped meanwhile.
func (c *stompConsumer) hold(j *stompJob) bool {
	wait := time.Until(j.due)
	return wait <= 0 || c.rules.sleep(wait)
}

// requeueCopy returns a delivery to the broker the STOMP way: a copy, same attempt and headers,
// marked redelivered with the count of its requeues, sent to the work queue and confirmed.
func (c *stompConsumer) requeueCopy(j *stompJob) error {
	ctx, cancel := c.copyContext()
	defer cancel()
	h := copyHeaders(j.h)
	hs, err := c.b.sendHeaders(j.msg.ID, j.contentType(), h, 0, time.Now())
	if err != nil {
		return err
	}
	hs = append(hs, stomp.Header{Key: hdrSTOMPRequeued, Value: strconv.Itoa(j.requeues + 1)})
	return c.b.sendCopy(ctx, dest(c.top.queue), hs, j.m.Body)
}

// settle applies a verdict to a job on its own subscription: ACK (with a RECEIPT) for actAck,
// nothing for a requeue (left unacknowledged: the consumer is stopping, and the subscription's
// end returns it) or a stale job (superseded). probe: not counted. It reports that the
// subscription should be recycled: an ACK went unanswered on a live connection, so the broker may
// still hold the delivery, and on Classic would hold it for as long as the subscription lives.
func (c *stompConsumer) settle(j *stompJob, v verdict, probe bool) (recycle bool) {
	count := func(e event) {
		if !probe {
			c.st.inc(e)
		}
	}
	// Held from the checks until the ACK is written: a recycle's UNSUBSCRIBE goes after it.
	j.sub.acking.RLock()
	switch {
	case v.act == actNone || j.stale():
		j.sub.acking.RUnlock()
		count(evSuperseded)
		return false
	case v.act == actRequeue:
		j.sub.acking.RUnlock()
		count(v.ev)
		return false
	}
	if h := c.b.hooks().stompSettling; h != nil && !probe {
		h(j.sub.conn, j.m)
	}
	r := j.sub.conn.Post(&stomp.Frame{Command: "ACK", Headers: []stomp.Header{{Key: "id", Value: j.m.AckID}}})
	j.sub.acking.RUnlock()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	err := r.Wait(ctx)
	if err == nil {
		count(v.ev)
		if v.rejected {
			count(evRejected)
		}
		return false
	}
	if _, refused := err.(*stomp.ServerError); refused { //nolint:errorlint // only the ERROR answering this ACK itself, not one wrapped in the connection's end
		// The broker answered this ACK with an ERROR on a live connection: it did not hold the
		// delivery (a bug of ours). The account must show it.
		count(evLost)
		c.log.Error("mq acknowledgement refused by the broker", zap.String("message_id", j.msg.ID),
			zap.Int("attempt", j.msg.Attempt), zap.Error(err))
		return false // the broker closes the connection after an ERROR
	}
	if isDone(j.sub.conn.Done()) || j.sub.conn.Err() != nil {
		// The connection went away under the ACK: the broker redelivers. Err as well as Done: a
		// connection records why it ended a moment before it closes Done, and an ACK posted in
		// between fails with that reason at once — counted lost, on a loaded machine, before
		// (issue 22: the contract suite's connection cut, 1 in ~70 runs under load).
		count(evSuperseded)
		c.log.Debug("mq acknowledgement on a connection going away; superseded",
			zap.String("message_id", j.msg.ID), zap.Error(err))
		return false
	}
	count(evLost)
	c.log.Error("mq acknowledgement without an answer on a live connection; recycling the subscription",
		zap.String("message_id", j.msg.ID), zap.Int("attempt", j.msg.Attempt), zap.Error(err))
	return true
}

// message is the handler's view (rules.go's delivery).
func (j *stompJob) message() *Message { return j.msg }

// stale reports the three supersession checks: the connection changed (the delivery's generation
// is not the consumer's current one, or its connection ended), the consumer was replaced (its
// subscription is not the current one), or the delivery was reissued (a newer delivery of the
// same SEND is in this consumer).
func (j *stompJob) stale() bool {
	c := j.c
	if j.gen != c.curGen.Load() || isDone(j.sub.conn.Done()) {
		return true
	}
	if j.sub.dead.Load() || j.sub.inst != c.curInst.Load() {
		return true
	}
	return c.reissued(j)
}

func (j *stompJob) contentType() string {
	if ct := stompValue(j.m.Headers, "content-type"); ct != "" {
		return ct
	}
	return defaultContentType
}

// sendCopy sends the copy o orders — the delivery's id, body, application and bookkeeping
// headers, the order's applied — confirmed: a retry to the work queue scheduled after the
// policy's delay for the attempt, a deferral scheduled after its delay level, a dead letter to
// the DLQ.
func (j *stompJob) sendCopy(ctx context.Context, o copyOrder) (string, error) {
	c := j.c
	h := copyHeaders(j.h)
	o.apply(h)
	destination := dest(c.top.queue)
	var delay time.Duration
	switch o.kind {
	case copyRetry:
		delay = c.top.retryTTLs[min(max(o.attempt-1, 0), len(c.top.retryTTLs)-1)]
	case copyDefer:
		delay = o.delay
		if _, ttl, ok := c.top.delayQueue(o.delay); ok {
			delay = ttl
		}
	case copyDeadLetter:
		destination = dest(c.top.dlq)
	default:
		return "", fmt.Errorf("mq: copy of unknown kind %d", o.kind)
	}
	hs, err := c.b.sendHeaders(j.msg.ID, j.contentType(), h, delay, time.Now())
	if err != nil {
		return destination, err
	}
	return destination, c.b.sendCopy(ctx, destination, hs, j.m.Body)
}

// copyHeaders is a copy of a delivery's decoded headers a copy may change.
func copyHeaders(h map[string]any) map[string]any {
	out := make(map[string]any, len(h)+6)
	for k, v := range h {
		out[k] = v
	}
	return out
}

// answerProbe answers a Diagnose probe to its reply-to destination; a probe nobody waits for
// any more is answered into the void. It is acknowledged either way, never handled nor counted.
func (c *stompConsumer) answerProbe(j *stompJob) {
	replyTo := stompValue(j.m.Headers, "reply-to")
	if replyTo == "" || j.stale() {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, publishTimeout)
	defer cancel()
	body, _ := json.Marshal(probeAnswer{By: processName, Counters: c.st.snapshot()})
	if err := c.b.sendOwn(ctx, replyTo, map[string]string{hdrSTOMPProbe: j.probe}, body); err != nil {
		c.log.Info("mq diagnostic probe answered into the void", zap.Error(err))
	}
}
