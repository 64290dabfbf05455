package mq

import (
	"context"
	"fmt"
	"sync"
	"time"

	plog "github.com/integrations-platform/integrations/pkg/log"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"
)

// The consumer engine: one Consume call, whatever the broker. Its owner goroutine (Consume's
// caller) subscribes and resubscribes with backoff, receives deliveries into a queue, hands them
// to the workers, recycles or replaces a subscription, and stops the consumer in one order; each
// worker runs the handler-return rules (rules.go) on a delivery and settles it through the
// driver's link; the counters are counted here, from what a settlement reports. What the engine
// asks of a broker is a link (driver.go): a subscription's deliveries, their settlement, and the
// consumer's connection's end.

// shutdownGrace is how long a cancelled Consume without Drain waits for running handlers to
// return. It is longer than publishTimeout so a retry copy being confirmed at cancellation still
// settles.
const shutdownGrace = publishTimeout + 5*time.Second

// ConsumeOption changes how Consume stops.
type ConsumeOption func(*consumeOptions)

type consumeOptions struct {
	work  context.Context
	grace time.Duration
}

// Drain makes a consumer stop the way a deploy wants it to: when Consume's ctx ends, it stops
// taking deliveries (the broker consumer is cancelled, the deliveries it holds and has not
// started go back to the broker), and the handlers already running go on — their context is
// derived from work, not from Consume's ctx — and are settled as usual. When work ends, the
// handlers' context is cancelled; Consume waits at most grace more for them to return (a cut-off
// handler's non-Ack result is a requeue, as always), then ends its subscription, which returns
// anything still unsettled to the broker, and returns without waiting for handlers that ignore
// their context. A handler whose retry, defer or dead-letter copy is being published when the
// grace ends is waited for until the copy's confirm (at most the publish timeout, 10 s), so that
// the copy does not end up beside the original the broker gets back; the Broker's close ends that
// wait too, which keeps a service's hard bound. The grace also bounds the broker's answers to the
// consumer's cancel and to its close; it is at least minDrainGrace.
//
// On STOMP the deliveries taken and not started go back only when the consumer disconnects, once
// its running handlers are settled: STOMP cannot stop a subscription's flow without ending it, and
// ending it would void their acknowledgements (docs/decisions.md, "The STOMP provider").
func Drain(work context.Context, grace time.Duration) ConsumeOption {
	return func(o *consumeOptions) {
		o.work = work
		o.grace = max(grace, minDrainGrace)
	}
}

// minDrainGrace leaves a broker on a loaded host time to answer a cancel or a close.
const minDrainGrace = 100 * time.Millisecond

// Consume consumes a declared route with `concurrency` handler goroutines (at least 1) until ctx
// is cancelled, and then returns nil. It reconnects by itself, with exponential backoff and
// jitter, for as long as ctx lives. It returns ErrUnknownRoute for a route not declared with
// Declare, and ErrClosed if the Broker is closed.
//
// On cancellation it stops taking deliveries, gives back to the broker the deliveries it holds and
// has not started, cancels the handlers' context, waits up to 15 s for them, settles what they
// returned (only Ack is acked) and returns every other delivery to the broker. With [Drain], the
// handlers' context outlives ctx: running handlers finish first.
//
// A diagnostic probe (see [Broker.Diagnose]) arriving on the route is answered and acked here,
// before and without any handler, and is not counted in the route's Counters.
func (p *port) Consume(ctx context.Context, route string, concurrency int, h Handler, opts ...ConsumeOption) error {
	top, ok := p.topology(route)
	if !ok {
		return fmt.Errorf("mq: consume %q: %w", route, ErrUnknownRoute)
	}
	if h == nil {
		return fmt.Errorf("mq: consume %q: nil handler", route)
	}
	if err := p.startConsumer(); err != nil {
		return err
	}
	defer p.consumers.Done()
	o := consumeOptions{work: ctx, grace: shutdownGrace}
	for _, opt := range opts {
		opt(&o)
	}
	hctx, stop := context.WithCancel(o.work)
	defer stop()
	log := p.log.With(zap.String("route", route))
	st := p.routeStats(route)
	c := &consumer{
		rules: &rules{
			h:      p.handlerChain(h, top, log),
			pol:    policy{queue: top.queue, maxAttempts: top.maxAttempts, levels: top.delayTTLs},
			st:     st,
			log:    log,
			ctx:    hctx,
			halt:   make(chan struct{}),
			copyTO: publishTimeout,
		},
		p:           p,
		top:         top,
		stop:        stop,
		grace:       o.grace,
		concurrency: max(concurrency, 1),
		jobs:        make(chan *job),
		res:         make(chan finished),
		gone:        make(chan struct{}),
	}
	return p.drv.consume(ctx, c)
}

// consumer is one Consume call's engine state. The owner goroutine alone touches queue and busy.
type consumer struct {
	// rules are the handler-return rules; their context, halt and copying are also the shutdown's.
	*rules
	p           *port
	top         *topology
	l           settler
	stop        context.CancelFunc // cancels the handlers' context
	grace       time.Duration      // how long handlers get to return once their context is cancelled
	concurrency int
	jobs        chan *job
	res         chan finished
	gone        chan struct{} // closed when the owner stops receiving results
	workers     sync.WaitGroup
	queue       []*job // received, not yet taken by a worker
	busy        int    // received and not yet finished (queued, in a worker, or a probe being answered)
}

// job is one delivery on its way to, or in, a worker.
type job struct {
	d   delivery
	sub any // the stream it came by
}

// finished is a worker's report on a job to the owner.
type finished struct {
	job     *job
	recycle bool // recycle the job's stream (settle's recycle)
}

// owner is the owner goroutine of a consumer over one link.
type owner[M any] struct {
	*consumer
	l link[M]
	s stream[M] // the current subscription; nil: none
}

// run starts the workers and runs the owner loop until ctx ends (nil) or the Broker closes
// (ErrClosed). A driver's consume calls it with its link.
func run[M any](ctx context.Context, c *consumer, l link[M]) error {
	c.l = l
	for range c.concurrency {
		c.workers.Add(1)
		go func() {
			defer c.workers.Done()
			c.work()
		}()
	}
	o := &owner[M]{consumer: c, l: l}
	bo := resubscribeBackoff()
	failures := 0
	retry := time.NewTimer(0) // subscribe at once
	defer retry.Stop()
	for {
		var deliveries <-chan M
		var retryC <-chan time.Time
		if o.s != nil {
			deliveries = o.s.deliveries()
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
			o.shutdown()
			return nil
		case <-c.p.closed:
			o.abandon()
			return ErrClosed
		case <-retryC:
			s, err := l.subscribe(ctx)
			if err != nil {
				if ctx.Err() != nil || c.p.isClosed() {
					continue // the loop takes the matching exit
				}
				failures++
				wait := bo.NextBackOff()
				c.log.Warn("mq subscribe failed; retrying", zap.Int("failures", failures),
					zap.Duration("backoff", wait), zap.Error(err))
				retry.Reset(wait)
				continue
			}
			if failures > 0 {
				c.log.Info("mq consumer resubscribed", zap.Uint64("generation", s.generation()))
			}
			failures = 0
			bo.Reset()
			o.s = s
			if h := c.p.hooks().subscribed; h != nil {
				h(c.top.route, s.generation())
			}
		case m, ok := <-deliveries:
			if !ok {
				o.lose()
				failures++
				retry.Reset(bo.NextBackOff())
				continue
			}
			c.busy++
			j := &job{d: o.s.delivery(m), sub: o.s}
			if j.d.probe() {
				// Answered off the owner goroutine and without a worker: a busy route still
				// answers its diagnosis.
				c.workers.Add(1)
				go func() {
					defer c.workers.Done()
					c.answer(j)
				}()
				continue
			}
			c.queue = append(c.queue, j)
		case jobs <- next:
			c.queue[0] = nil
			c.queue = c.queue[1:]
		case f := <-c.res:
			c.busy--
			if f.recycle && o.s != nil && f.job.sub == any(o.s) {
				o.recycle(ctx)
				retry.Reset(0)
			}
		}
	}
}

// resubscribeBackoff is exponential from 100 ms, capped at 5 s, each wait drawn from [d/2, d] so
// that consumers cut off together do not reconnect together.
func resubscribeBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 75 * time.Millisecond // ± a third: [50 ms, 100 ms]
	b.RandomizationFactor = 1.0 / 3
	b.Multiplier = 2
	b.MaxInterval = 3750 * time.Millisecond // ± a third: [2.5 s, 5 s]
	return b
}

// lose retires the current subscription, which ended by itself: its queued deliveries are dropped
// (superseded: the broker redelivers them) and results still in workers will be superseded.
func (o *owner[M]) lose() {
	s := o.s
	o.s = nil
	ours, reason := o.l.lose(s)
	dropped := o.drop(s)
	if ours {
		// What settling a delivery the broker no longer holds looks like (RabbitMQ's 406
		// "unknown delivery tag"): such a settlement is not answered, so it was counted when it
		// was written. Count it lost — the account must show the bug — and say so loudly.
		o.st.inc(evLost)
		o.log.Error("mq consumer's subscription closed by the broker for a protocol error of ours",
			zap.Uint64("generation", s.generation()), zap.Error(reason))
	}
	o.log.Warn("mq consumer lost its subscription; resubscribing", zap.Uint64("generation", s.generation()),
		zap.Int("superseded", dropped), zap.Error(reason))
}

// recycle ends the current subscription so that the broker returns a delivery a worker could not
// settle — with every other one it holds, whose settlements are then superseded — and the loop
// subscribes again.
func (o *owner[M]) recycle(ctx context.Context) {
	s := o.s
	o.s = nil
	o.l.recycle(ctx, s)
	dropped := o.drop(s)
	o.log.Warn("mq consumer recycled its subscription to return a delivery", zap.Int("superseded", dropped))
}

// drop removes the queued jobs of a retired stream, counting them superseded.
func (o *owner[M]) drop(s stream[M]) int {
	kept := o.queue[:0]
	dropped := 0
	for _, j := range o.queue {
		if j.sub == any(s) {
			dropped++
			j.d.done()
			continue
		}
		kept = append(kept, j)
	}
	clear(o.queue[len(kept):])
	o.queue = kept
	o.busy -= dropped
	o.st.add(evSuperseded, dropped)
	return dropped
}

// shutdown is the owner's exit on ctx's end: stop taking deliveries and give back those not
// started, let the running handlers finish (until the handlers' context ends, then at most the
// grace, and the copies being confirmed), settle what they return, and end the subscription.
func (o *owner[M]) shutdown() {
	close(o.halt) // workers start no handler from now on
	var deliveries <-chan M
	if o.s != nil {
		alive, held := o.l.halt(o.s)
		if alive {
			for _, m := range held {
				o.giveBack(o.s.delivery(m))
			}
			deliveries = o.s.deliveries()
		}
		if !alive {
			// Its deliveries go back to the broker with it.
			o.st.add(evSuperseded, len(o.queue))
			for _, j := range o.queue {
				j.d.done()
			}
			o.busy -= len(o.queue)
			o.queue = nil
		}
	}
	// Earlier streams' queued jobs were dropped when they ended: these are all the current one's.
	for _, j := range o.queue {
		o.giveBack(j.d)
	}
	o.busy -= len(o.queue)
	o.queue = nil
	close(o.jobs)
	if o.busy > 0 {
		o.log.Info("mq consumer stopped taking deliveries; waiting for running handlers", zap.Int("handlers", o.busy))
	}

	// Workers check halt before calling a handler and turn a cancelled non-Ack into a requeue, so
	// what they settle now is final.
	var graceC, copiesC <-chan time.Time
	workDone := o.ctx.Done()
	abandoned := false
wait:
	for o.busy > 0 {
		select {
		case m, ok := <-deliveries:
			if !ok {
				deliveries = nil
				continue
			}
			o.giveBack(o.s.delivery(m)) // never handled: returned with the subscription
		case <-o.res:
			o.busy--
			if copiesC != nil && o.copying.Load() == 0 && o.busy > 0 {
				o.log.Error("mq handlers did not return within the shutdown grace; leaving them to the broker",
					zap.Int("handlers", o.busy), zap.Duration("grace", o.grace))
				abandoned = true
				break wait
			}
		case <-workDone:
			workDone = nil
			o.log.Warn("mq handlers still running when their context was cancelled", zap.Int("handlers", o.busy),
				zap.Duration("grace", o.grace))
			grace := time.NewTimer(o.grace)
			defer grace.Stop()
			graceC = grace.C
		case <-graceC:
			graceC = nil
			if n := o.copying.Load(); n > 0 {
				// A retry, defer or dead-letter copy is still being confirmed: abandoning now would
				// end the subscription, so the broker gets the original back, and the copy, once
				// confirmed, would stand beside it. Wait for the copies — each is bounded by
				// publishTimeout from its start, which was before the work context ended — and
				// abandon the other handlers once they are settled. The service's hard bound
				// still holds: its broker close ends this wait.
				o.log.Warn("mq shutdown grace over with copies still being confirmed; waiting for them",
					zap.Int32("copies", n), zap.Duration("at_most", publishTimeout))
				copies := time.NewTimer(publishTimeout)
				defer copies.Stop()
				copiesC = copies.C
				continue
			}
			o.log.Error("mq handlers did not return within the shutdown grace; leaving them to the broker",
				zap.Int("handlers", o.busy), zap.Duration("grace", o.grace))
			abandoned = true
			break wait
		case <-copiesC:
			o.log.Error("mq copies not confirmed within the publish timeout; leaving their originals to the broker",
				zap.Int32("copies", o.copying.Load()), zap.Int("handlers", o.busy))
			abandoned = true
			break wait
		case <-o.p.closed:
			// The connection is gone: the broker redelivers everything; a handler that returns
			// now finds its delivery superseded.
			abandoned = true
			break wait
		}
	}
	o.stop()
	close(o.gone)
	o.l.end(o.s, o.grace)
	if !abandoned {
		// Every job is finished and jobs is closed: the workers are returning.
		o.workers.Wait()
		return
	}
	o.awaitWorkers(time.Second)
}

// abandon is the owner's exit when the Broker is closed: the connections are gone, so the broker
// redelivers everything; there is nothing left to settle.
func (o *owner[M]) abandon() {
	close(o.halt)
	o.stop()
	o.st.add(evSuperseded, len(o.queue))
	for _, j := range o.queue {
		j.d.done()
	}
	o.queue = nil
	close(o.jobs)
	close(o.gone)
	o.l.end(o.s, o.grace)
	o.awaitWorkers(o.grace)
}

// awaitWorkers waits for the worker goroutines to return, at most d: a handler that ignores its
// cancelled context must not hold up the service's exit.
func (c *consumer) awaitWorkers(d time.Duration) {
	done := make(chan struct{})
	go func() {
		c.workers.Wait()
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

// giveBack returns a delivery taken and not started to the broker, counting it requeued (or
// superseded, or lost, as the link reports).
func (c *consumer) giveBack(d delivery) {
	c.l.giveBack(d, c.report(d, verdict{act: actRequeue, ev: evRequeued}))
	d.done()
}

// work is one worker goroutine: it runs the rules on a job, settles it, and reports to the owner.
func (c *consumer) work() {
	for j := range c.jobs {
		recycle := c.process(j.d)
		j.d.done()
		select {
		case c.res <- finished{job: j, recycle: recycle}:
		case <-c.gone:
		}
	}
}

// process holds a delivery until it is due, runs the rules on it and settles their verdict.
func (c *consumer) process(d delivery) (recycle bool) {
	v := verdict{act: actRequeue, ev: evRequeued} // stopped while held
	if c.hold(d) {
		v = c.rules.handle(d)
	}
	if v.act == actRequeue && !c.stopping() && !d.stale() && d.requeues() >= deliveryLimit {
		// A broker that does not count a message's returns (its link does): dead-lettered rather
		// than returned once more, as RabbitMQ's x-delivery-limit does. If that copy is not
		// confirmed, the requeue goes ahead and the next delivery tries again.
		m := d.message()
		log := c.log.With(zap.String("message_id", m.ID), plog.Deliveries(m.Attempt))
		log.Error("mq message returned to the broker too many times without a result; dead-lettering",
			zap.Int("requeues", d.requeues()))
		if dl := c.rules.deadLetter(d, log, deadReasonDeliveryLimit,
			fmt.Errorf("returned to the broker %d times without a result", d.requeues())); dl.act != actRequeue {
			v = dl
		}
	}
	return c.l.settle(d, v, c.stopping(), c.report(d, v))
}

// stopping reports that the consumer stopped taking deliveries or its handlers' context ended.
func (c *consumer) stopping() bool { return c.halted() || c.ctx.Err() != nil }

// hold waits, in the worker, until a delivery is due (a broker's scheduler may deliver it early:
// see stompScheduleLead); false when the consumer stopped meanwhile.
func (c *consumer) hold(d delivery) bool {
	wait := time.Until(d.due())
	return wait <= 0 || c.rules.sleep(wait)
}

// answer answers a diagnostic probe and acknowledges it, uncounted.
func (c *consumer) answer(j *job) {
	c.l.answerProbe(c.ctx, j.d, c.st.snapshot())
	recycle := c.l.settle(j.d, verdict{act: actAck}, false, func(settled) {})
	j.d.done()
	select {
	case c.res <- finished{job: j, recycle: recycle}:
	case <-c.gone:
	}
}

// report is how a settlement of d under v is counted: the verdict's event (and Rejected) once
// the broker took it, else superseded or lost. Safe to call from any goroutine, once.
func (c *consumer) report(d delivery, v verdict) func(settled) {
	return func(s settled) {
		switch s {
		case settledSuperseded:
			c.st.inc(evSuperseded)
		case settledLost:
			c.st.inc(evLost)
		default:
			c.st.inc(v.ev)
			if v.rejected {
				c.st.inc(evRejected)
			}
			if h := c.p.hooks().settled; h != nil {
				h(c.top.route, d.message().ID, v.ev)
			}
		}
	}
}
