package deliver

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// NoticePublisher is the part of the message port the in-process deliverer uses to give an event
// back to the broker: a notice delayed until the event's next attempt (mq.Broker.PublishAfter).
type NoticePublisher interface {
	PublishAfter(ctx context.Context, route string, msgs []mq.Outgoing, delays []time.Duration) []error
}

// Local delivers events the relay of this process claimed for delivery and hands over in process
// (store.EventClaimForRelay), without a broker message: issue 13's one trip through the broker.
// What the broker still carries: an event whose attempt failed (its retry waits in the route's
// delay levels, as a notice this publishes), an event whose application is at its bound here (a
// notice deferred by Busy, as a broker notice would be), and the events of a replica that died
// (relayed and pending, its claim expired: the stale-notice path publishes them again).
//
// Its queue is bounded (Free): the relay claims for it only what fits, and publishes the rest.
type Local struct {
	d     *Deliverer
	pub   NoticePublisher
	route string
	log   *zap.Logger

	mu     sync.Mutex
	q      chan *store.Delivery
	closed bool

	delivered, noticed atomic.Int64
}

// Local returns the in-process deliverer of d: a queue of limit events, whose undelivered notices
// go to route through pub.
func (d *Deliverer) Local(pub NoticePublisher, route string, limit int) *Local {
	return &Local{d: d, pub: pub, route: route, log: d.log, q: make(chan *store.Delivery, max(limit, 1))}
}

// Free is how many events Offer takes now: the queue's free room, 0 once stopped. Only the relay
// offers, so the room cannot shrink between Free and Offer.
func (l *Local) Free() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0
	}
	return cap(l.q) - len(l.q)
}

// ClaimTTL is the delivery claim an event handed in process gets: one attempt with its margin,
// plus its time in the queue.
func (l *Local) ClaimTTL() time.Duration { return l.d.cfg.Timeout + 2*claimMargin }

// Handled is how many events handed in process were attempted here, and Noticed how many of them
// were given back to the broker as a notice (a retry, or a busy application): for tests.
func (l *Local) Handled() int64 { return l.delivered.Load() }

// Noticed is how many of the events handed in process went back to the broker as a notice: see Handled.
func (l *Local) Noticed() int64 { return l.noticed.Load() }

// Offer queues events claimed for delivery here. Events offered after Run stopped (a relay pass
// finishing during shutdown) are given back to the relay at once.
func (l *Local) Offer(evs []*store.Delivery) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.unclaim(evs)
		return
	}
	var over []*store.Delivery
	for _, ev := range evs {
		select {
		case l.q <- ev:
		default:
			over = append(over, ev) // more than Free said: not possible with one relay
		}
	}
	l.mu.Unlock()
	if len(over) > 0 {
		l.unclaim(over)
	}
}

// Run delivers with workers goroutines until take ends; attempts in flight then finish under
// work (the consumer's drain), and events still queued are given back to the relay (a kill -9
// leaves them to the stale-notice path instead).
func (l *Local) Run(take, work context.Context, workers int) error {
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for {
				select {
				case <-take.Done():
					return
				case ev := <-l.q:
					l.deliver(work, ev)
				}
			}
		})
	}
	<-take.Done()
	l.mu.Lock()
	l.closed = true // the relay publishes from now on
	l.mu.Unlock()
	wg.Wait()
	l.mu.Lock()
	var left []*store.Delivery
	for len(l.q) > 0 {
		left = append(left, <-l.q)
	}
	l.mu.Unlock()
	if len(left) > 0 {
		l.unclaim(left)
	}
	return nil
}

// deliver makes ev's attempt, under its application's bound, and publishes a notice when the
// event needs one.
func (l *Local) deliver(ctx context.Context, ev *store.Delivery) {
	logger := l.log.With(log.EventID(ev.EventID), log.ApplicationID(ev.ApplicationID))
	if !l.d.limiter.acquire(ctx, ev.ApplicationID) {
		if ctx.Err() != nil {
			l.unclaim([]*store.Delivery{ev})
			return
		}
		// Its application is at its bound here: the event waits in the broker like a busy
		// notice (it does not hold a worker, and is not dropped), and its claim ends once that
		// notice is confirmed.
		if l.notify(ctx, ev, l.d.cfg.Busy, logger) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := l.d.store.DeliveryRelease(rctx, ev.EventID, ev.Claim); err != nil {
				logger.Warn("event claim not released; its notice waits for it to expire", zap.Error(err))
			}
		}
		return
	}
	defer l.d.limiter.release(ev.ApplicationID)
	l.delivered.Add(1)
	v := l.d.deliverClaimed(ctx, ev, logger)
	switch v.kind {
	case verdictDefer:
		l.notify(ctx, ev, v.delay, logger)
	case verdictFail:
		// Attempted, not recorded: a notice retries it once the claim expires (at least once).
		l.notify(ctx, ev, max(l.d.cfg.Busy, claimPoll), logger)
	case verdictStopped:
		// Claim released by deliverClaimed; unrelayed so that a relay publishes it now.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := l.d.store.EventUnrelay(rctx, []string{ev.EventID}); err != nil {
			logger.Warn("stopped event not given back to the relay; the stale-notice path publishes it", zap.Error(err))
		}
	}
}

// notify publishes ev's notice, delayed by delay, and reports whether the broker confirmed it. An
// unconfirmed notice gives the event back to the relay (unclaimed and unrelayed) when it is still
// under this claim; otherwise — its attempt recorded, its claim ended — only unrelayed, so the
// relay publishes a notice, which waits for the event's next attempt as any notice does.
func (l *Local) notify(ctx context.Context, ev *store.Delivery, delay time.Duration, logger *zap.Logger) bool {
	body, err := proto.Marshal(&queuev1.EventNotice{EventId: ev.EventID, ApplicationId: ev.ApplicationID})
	if err == nil {
		pctx := context.WithoutCancel(ctx)
		err = l.pub.PublishAfter(pctx, l.route, []mq.Outgoing{{ID: ev.EventID, Body: body}}, []time.Duration{delay})[0]
	}
	if err == nil {
		l.noticed.Add(1)
		return true
	}
	logger.Warn("event notice not confirmed; the relay publishes it again", zap.Error(fmt.Errorf("publish event notice: %w", err)))
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := l.d.store.DeliveryUnclaim(rctx, []string{ev.EventID}, []time.Time{ev.Claim}); err != nil {
		logger.Warn("event not given back to the relay; the stale-notice path publishes it", zap.Error(err))
	}
	if err := l.d.store.EventUnrelay(rctx, []string{ev.EventID}); err != nil {
		logger.Warn("event not given back to the relay; the stale-notice path publishes it", zap.Error(err))
	}
	return false
}

// unclaim gives events not attempted here back to the relay, in one statement.
func (l *Local) unclaim(evs []*store.Delivery) {
	ids := make([]string, len(evs))
	claims := make([]time.Time, len(evs))
	for i, ev := range evs {
		ids[i], claims[i] = ev.EventID, ev.Claim
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.d.store.DeliveryUnclaim(ctx, ids, claims); err != nil {
		l.log.Warn("events handed in process not given back to the relay; the stale-notice path publishes them",
			zap.Int("events", len(evs)), zap.Error(err))
	}
}
