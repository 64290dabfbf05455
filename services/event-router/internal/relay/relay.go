// Package relay moves completion events from the Postgres outbox to the deliverers: woken by the
// settlement transaction's NOTIFY and by a scheduled pass, it claims unrelayed events with SKIP
// LOCKED; those its own in-process deliverer has room for are claimed for delivery in the same
// statement and handed over without a broker message, the others published with confirms and the
// confirmed ones marked relayed.
package relay

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/execution"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

const (
	batchSize = 500
	// DefaultClaimTTL is how long a relay's claim on the events it is publishing lasts, unscaled:
	// see Options.ClaimTTL.
	DefaultClaimTTL = 30 * time.Second
)

// Publisher is the part of the message port the relay uses.
type Publisher interface {
	PublishAll(ctx context.Context, route string, msgs []mq.Outgoing) []error
}

// DeadLetterQueue is the part of the message port the relay uses to recover dead-lettered
// notices.
type DeadLetterQueue interface {
	DeadLetters(ctx context.Context, route string, limit int) ([]mq.DeadLetter, error)
	Discard(ctx context.Context, route string, ids []string) (int, error)
}

// Options are the relay's timings, already time-scaled.
type Options struct {
	// Interval is the scheduled pass, which recovers lost NOTIFYs.
	Interval time.Duration
	// StaleAfter is how overdue a pending event's notice may be before it is published again
	// without other evidence that it was lost (see store.EventReleaseStale).
	StaleAfter time.Duration
	// RecoverEvery is how often the relay looks for lost notices: overdue ones (StaleAfter) and
	// dead-lettered ones.
	RecoverEvery time.Duration
	// DeadLetters, when set, is the events route's DLQ: every RecoverEvery the relay publishes a
	// fresh notice for each pending event whose notice is in it, and discards the dead letters of
	// events delivered or dead since.
	DeadLetters DeadLetterQueue
	// NoticeBudget is the events route's port-level retry budget (mq.RetryDelays): a notice relayed
	// less than this long ago cannot have been dead-lettered yet.
	NoticeBudget time.Duration
	// ClaimTTL is how long a claim on events being published lasts (DefaultClaimTTL when zero): a
	// relay killed between claim and publish leaves its events to the others for that long.
	ClaimTTL time.Duration
	// Handoff, when set, is this process's own deliverer: each pass claims for it, in the same
	// statement as the relay's claim, as many events as it has room for, and hands them over in
	// process instead of publishing their notices (issue 13: one trip through the broker).
	Handoff Handoff
}

// Handoff takes events claimed for delivery in process (store.EventClaimForRelay).
type Handoff interface {
	// Free is how many events Offer takes now.
	Free() int
	// ClaimTTL is the delivery claim each handed event gets.
	ClaimTTL() time.Duration
	// Offer queues the events; it does not block.
	Offer(evs []*store.Delivery)
}

// Relay publishes outbox events.
type Relay struct {
	store *store.Store
	pub   Publisher
	log   *zap.Logger
	opts  Options
	// lastRecovery is when the overdue-notice check last ran: it runs on the scheduled pass at
	// most every RecoverEvery, not on every NOTIFY, which is the hot path.
	lastRecovery time.Time
	// republished and cleared count what the dead-letter recovery did, for tests (the metrics
	// are process-wide).
	republished, cleared atomic.Int64
	// handedOff counts the events handed to Options.Handoff.
	handedOff atomic.Int64
}

// HandedOff is how many events this relay handed to its in-process deliverer.
func (r *Relay) HandedOff() int64 { return r.handedOff.Load() }

// NoticesRepublished is how many pending events this relay gave a fresh notice because their
// notice was in the DLQ.
func (r *Relay) NoticesRepublished() int64 { return r.republished.Load() }

// DeadLettersCleared is how many dead letters this relay discarded because their event was
// delivered or dead.
func (r *Relay) DeadLettersCleared() int64 { return r.cleared.Load() }

const (
	// deadLetterBatch is the most dead letters one recovery pass looks at.
	deadLetterBatch = 500
	// recoveryTimeout bounds one look at the DLQ.
	recoveryTimeout = 10 * time.Second
)

var (
	noticesReleased = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "integrations_event_notices_republished_total",
		Help: "Pending events whose notice was lost and published again, by evidence: stale (overdue), dead_lettered, or handoff (handed in process by a replica that died).",
	}, []string{"evidence"})
	// relayLag is the time from an event being written (settled) to its notice being confirmed
	// by the broker, or to its hand-off to this replica's deliverer, by path. The event's time is
	// the database's and now is this host's: a skew between them shows here (clamped at 0).
	relayLag = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "integrations_relay_lag_seconds",
		Help:    "Time from an event's creation to its notice published (broker) or handed to a deliverer in process (handoff).",
		Buckets: metrics.LatencyBuckets(),
	}, []string{"path"})
	deadLettersCleared = promauto.NewCounter(prometheus.CounterOpts{
		Name: "integrations_event_dead_letters_cleared_total",
		Help: "Dead-lettered event notices removed from the DLQ because their event was delivered or dead since.",
	})
)

// New returns a Relay.
func New(st *store.Store, pub Publisher, log *zap.Logger, opts Options) *Relay {
	if opts.RecoverEvery <= 0 {
		opts.RecoverEvery = opts.StaleAfter
	}
	if opts.ClaimTTL <= 0 {
		opts.ClaimTTL = DefaultClaimTTL
	}
	return &Relay{store: st, pub: pub, log: log, opts: opts}
}

// Run relays until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	go r.listen(ctx, wake)
	if r.opts.DeadLetters != nil {
		go r.watchDeadLetters(ctx, wake)
	}
	return lifecycle.Every(ctx, r.opts.Interval, wake, r.log, "relay pass failed", r.pass)
}

// listen turns NOTIFYs into wake-ups; if the connection fails, the scheduled pass carries on
// alone until it is back.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		if err := r.listenOnce(ctx, r.store.Pool(), wake); err != nil && ctx.Err() == nil {
			r.log.Warn("event notifications lost; relying on the scheduled pass", zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, pool *pgxpool.Pool, wake chan<- struct{}) error {
	pooled, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire listen connection: %w", err)
	}
	// A LISTENing connection must not go back to the pool: take it out, and close it after.
	conn := pooled.Hijack()
	defer func() { _ = conn.Close(context.Background()) }() // out of the pool: nothing else uses it
	if _, err := conn.Exec(ctx, "LISTEN "+execution.EventsNotifyChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// pass relays what is there to relay: the periodic recovery first, then claim rounds until a
// round finds less than a batch.
func (r *Relay) pass(ctx context.Context) error {
	if time.Since(r.lastRecovery) >= r.opts.RecoverEvery {
		if err := r.recover(ctx); err != nil {
			return err
		}
		r.lastRecovery = time.Now()
	}
	for {
		more, err := r.round(ctx)
		if err != nil || !more {
			return err
		}
	}
}

// recover releases what others left: notices published long ago and never delivered, events a
// stopped replica had taken in process, and held events whose predecessors are done.
func (r *Relay) recover(ctx context.Context) error {
	released, err := r.store.EventReleaseStale(ctx, r.opts.StaleAfter)
	if err != nil {
		return err
	}
	if released > 0 {
		noticesReleased.WithLabelValues("stale").Add(float64(released))
		r.log.Warn("event notices overdue; publishing them again", zap.Int64("events", released))
	}
	lost, err := r.store.EventReleaseHandoffs(ctx)
	if err != nil {
		return err
	}
	if lost > 0 {
		noticesReleased.WithLabelValues("handoff").Add(float64(lost))
		r.log.Warn("events handed in process by a replica that stopped without them; relaying them again",
			zap.Int64("events", lost))
	}
	unheld, err := r.store.EventUnholdReleased(ctx)
	if err != nil {
		return err
	}
	if unheld > 0 {
		r.log.Info("held events whose predecessors are done let go", zap.Int64("events", unheld))
	}
	return nil
}

// round claims one batch of events: those the in-process deliverer has room for are handed to
// it, the rest published as notices. more says the batch was full (held events set aside count:
// they took the scan's places), so more may be behind it.
func (r *Relay) round(ctx context.Context) (more bool, err error) {
	var free int
	var deliveryTTL time.Duration
	if r.opts.Handoff != nil {
		free, deliveryTTL = r.opts.Handoff.Free(), r.opts.Handoff.ClaimTTL()
	}
	claimed, here, parked, err := r.store.EventClaimForRelay(ctx, batchSize, r.opts.ClaimTTL, free, deliveryTTL)
	if err != nil {
		return false, err
	}
	if len(here) > 0 {
		r.handOff(ctx, here)
	}
	more = len(claimed)+len(here)+parked >= batchSize
	if len(claimed) > 0 {
		if err := r.publish(ctx, claimed); err != nil {
			return false, err
		}
	}
	return more, nil
}

// handOff gives events to the in-process deliverer, each with a relay span in its execution's
// trace, as for a notice: the hand-off carries it to the delivery in place of a message's headers.
func (r *Relay) handOff(ctx context.Context, here []*store.Delivery) {
	r.handedOff.Add(int64(len(here)))
	for _, d := range here {
		relayLag.WithLabelValues("handoff").Observe(metrics.Since(d.CreatedAt))
		_, span := telemetry.Start(telemetry.WithTraceparent(ctx, d.Traceparent, d.Tracestate), "relay",
			trace.SpanKindProducer, telemetry.ExecutionID(d.ExecutionID), telemetry.EventID(d.EventID),
			attribute.String("integrations.relay", "handoff"))
		// Only a span that exists changes what the delivery continues: with tracing off the
		// event's own trace context goes on as it is, without a context allocated for it.
		if sc := span.SpanContext(); sc.IsValid() {
			d.Traceparent, d.Tracestate = telemetry.Traceparent(trace.ContextWithSpanContext(ctx, sc))
		}
		span.End()
	}
	r.opts.Handoff.Offer(here)
}

// publish publishes a notice per claimed event, confirmed, and marks relayed those confirmed:
// one span per event's notice, in its execution's trace (from the event's row), not one for the
// batch (docs/decisions.md, Tracing). An unconfirmed one stays claimed until its claim expires.
func (r *Relay) publish(ctx context.Context, claimed []store.Unrelayed) error {
	msgs := make([]mq.Outgoing, len(claimed))
	spans := make([]trace.Span, len(claimed))
	for i, c := range claimed {
		body, err := proto.Marshal(&queuev1.EventNotice{EventId: c.ID, ApplicationId: c.ApplicationID})
		if err != nil {
			endAll(spans)
			return fmt.Errorf("encode event notice: %w", err)
		}
		_, spans[i] = telemetry.Start(telemetry.WithTraceparent(ctx, c.Traceparent, c.Tracestate), "relay",
			trace.SpanKindProducer, telemetry.ExecutionID(c.ExecutionID), telemetry.EventID(c.ID),
			attribute.String("integrations.relay", "broker"))
		msgs[i] = mq.Outgoing{ID: c.ID, Body: body, SpanContext: spans[i].SpanContext()}
	}
	errs := r.pub.PublishAll(ctx, routes.Events.Name, msgs)
	for i, err := range errs {
		telemetry.Fail(spans[i], err)
	}
	endAll(spans)
	var done []string
	for i, err := range errs {
		if err != nil {
			r.log.Warn("event publish not confirmed", zap.String("event_id", claimed[i].ID), zap.Error(err))
			continue
		}
		done = append(done, claimed[i].ID)
		relayLag.WithLabelValues("broker").Observe(metrics.Since(claimed[i].CreatedAt))
	}
	if len(done) == 0 {
		return nil
	}
	return r.store.EventMarkRelayed(ctx, done, claimed[0].ClaimedUntil)
}

// endAll ends the spans started (a nil one was not).
func endAll(spans []trace.Span) {
	for _, span := range spans {
		if span != nil {
			span.End()
		}
	}
}

// watchDeadLetters runs recoverDeadLetters every RecoverEvery, beside the relay's passes rather
// than in them, so that a broker in trouble cannot hold up relaying; when it released events it
// wakes the relay, which publishes their fresh notices at once.
func (r *Relay) watchDeadLetters(ctx context.Context, wake chan<- struct{}) {
	_ = lifecycle.Every(ctx, r.opts.RecoverEvery, nil, r.log, "dead-lettered event notices not checked", func(ctx context.Context) error {
		released, err := r.recoverDeadLetters(ctx)
		if err == nil && released > 0 {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
		return err
	})
}

// recoverDeadLetters reads the head of the events route's DLQ and settles what the database
// explains:
//   - a dead letter of a pending event: the event gets a fresh notice now (its dead letter stays
//     until the event is delivered or dead, so the DLQ shows it while it is not yet recovered) —
//     once: an event relayed since, or on its delivery schedule (its next attempt ahead, so a
//     notice waits for it), is not released again until that notice too is overdue by the budget;
//   - a dead letter of an event delivered or dead since (by a fresh notice, a duplicate, or its
//     schedule): discarded, counted and logged — its loss cost nothing but time;
//   - a dead letter the database does not explain (no such event, a body that is not a notice):
//     left for an operator.
//
// It reports how many events it released.
func (r *Relay) recoverDeadLetters(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, recoveryTimeout)
	defer cancel()
	dls, err := r.opts.DeadLetters.DeadLetters(ctx, routes.Events.Name, deadLetterBatch)
	if err != nil || len(dls) == 0 {
		return 0, err
	}
	// The notice's own event id decides; the dead letter's message id (the same, as the relay
	// publishes it) is what Discard selects by.
	byEvent := make(map[string][]string, len(dls))
	var ids []string
	for _, dl := range dls {
		var n queuev1.EventNotice
		if proto.Unmarshal(dl.Body, &n) != nil || uuid.Validate(n.GetEventId()) != nil {
			continue
		}
		if _, seen := byEvent[n.GetEventId()]; !seen {
			ids = append(ids, n.GetEventId())
		}
		byEvent[n.GetEventId()] = append(byEvent[n.GetEventId()], dl.ID)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	found, err := r.store.EventReleaseDeadNoticed(ctx, ids, r.opts.NoticeBudget)
	if err != nil {
		return 0, err
	}
	var settled []string
	released := 0
	for _, n := range found {
		switch {
		case n.Released:
			released++
		case n.Status == "delivered" || n.Status == "dead":
			settled = append(settled, byEvent[n.EventID]...)
		}
	}
	if released > 0 {
		noticesReleased.WithLabelValues("dead_lettered").Add(float64(released))
		r.republished.Add(int64(released))
		r.log.Warn("event notices dead-lettered; publishing them again", zap.Int("events", released))
	}
	if len(settled) == 0 {
		return released, nil
	}
	cleared, err := r.opts.DeadLetters.Discard(ctx, routes.Events.Name, settled)
	if cleared > 0 {
		deadLettersCleared.Add(float64(cleared))
		r.cleared.Add(int64(cleared))
		r.log.Info("dead-lettered event notices cleared: their events were delivered or dead since",
			zap.Int("dead_letters", cleared))
	}
	return released, err
}
