package mq

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// shutdownGrace is how long a cancelled Consume without Drain waits for running handlers to
// return. It is longer than publishTimeout so a retry copy being confirmed at cancellation still
// settles.
const shutdownGrace = publishTimeout + 5*time.Second

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
	r := &rules{
		h:      h,
		pol:    policy{queue: top.queue, maxAttempts: top.maxAttempts, levels: top.delayTTLs},
		st:     p.routeStats(route),
		log:    p.log.With(zap.String("route", route)),
		ctx:    hctx,
		halt:   make(chan struct{}),
		copyTO: publishTimeout,
	}
	return p.drv.consume(ctx, top, r, stop, o.grace, max(concurrency, 1))
}

// ConsumeOption changes how Consume or Subscribe stops.
type ConsumeOption func(*consumeOptions)

type consumeOptions struct {
	work  context.Context
	grace time.Duration
}

// Drain makes a consumer stop the way a deploy wants it to: when Consume's ctx ends, it stops
// taking deliveries (the broker consumer is cancelled, the deliveries it holds and has not
// started go back to the broker at once), and the handlers already running go on — their context
// is derived from work, not from Consume's ctx — and are settled as usual. When work ends, the
// handlers' context is cancelled; Consume waits at most grace more for them to return (a cut-off
// handler's non-Ack result is a requeue, as always), then closes its channel, which returns
// anything still unsettled to the broker, and returns without waiting for handlers that ignore
// their context. A handler whose retry, defer or dead-letter copy is being published when the
// grace ends is waited for until the copy's confirm (at most the publish timeout, 10 s), so that
// the copy does not end up beside the original the closed channel requeues; the Broker's close
// ends that wait too, which keeps a service's hard bound. The grace also bounds the broker's
// answers to the consumer's cancel and to the channel's close; it is at least minDrainGrace.
func Drain(work context.Context, grace time.Duration) ConsumeOption {
	return func(o *consumeOptions) {
		o.work = work
		o.grace = max(grace, minDrainGrace)
	}
}

// minDrainGrace leaves a broker on a loaded host time to answer a cancel or a close.
const minDrainGrace = 100 * time.Millisecond
