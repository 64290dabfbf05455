// Package dispatch is the dispatcher's loop: claim dispatch records due within the horizon (the
// executions route's largest delay level), publish each into the delay level that holds it until
// it is due, with publisher confirms, and delete what the broker confirmed. It runs on a
// schedule, when nudged, and when the next record comes within the horizon.
package dispatch

import (
	"context"
	"fmt"
	"time"

	plog "github.com/integrations-platform/integrations/pkg/log"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/store"
)

var (
	lastPass = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "integrations_dispatcher_last_pass_timestamp_seconds",
		Help: "Unix time of the dispatcher's last completed pass; alert when it is stale.",
	})
	published = promauto.NewCounter(prometheus.CounterOpts{
		Name: "integrations_dispatcher_published_total",
		Help: "Dispatch records published to the broker and deleted.",
	})
	dispatchLag = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "integrations_dispatch_lag_seconds",
		Help:    "Time from a dispatch's due time to its publish being confirmed (0 when published ahead of it).",
		Buckets: metrics.LatencyBuckets(),
	})
	publishFailures = promauto.NewCounter(prometheus.CounterOpts{
		Name: "integrations_dispatcher_publish_failures_total",
		Help: "Dispatch records whose publish was not confirmed; retried after their claim expires.",
	})
)

// Publisher is the part of the message port the dispatcher uses.
type Publisher interface {
	PublishAfter(ctx context.Context, route string, msgs []mq.Outgoing, delays []time.Duration) []error
}

// Dispatcher claims and publishes dispatch records.
type Dispatcher struct {
	dispatcherv1.UnimplementedDispatcherServiceServer
	store    *store.Store
	pub      Publisher
	log      *zap.Logger
	interval time.Duration
	claimTTL time.Duration
	// horizon is how far ahead a record is published: the executions route's largest delay level
	// as the broker applies it (scaled). Records due later wait in Postgres. 0 publishes only due
	// records.
	horizon   time.Duration
	batchSize int
	wake      chan struct{}
}

// Config is a Dispatcher's settings.
type Config struct {
	Interval  time.Duration // the longest wait between passes
	ClaimTTL  time.Duration // how long a claim reserves a record
	Horizon   time.Duration // how far ahead of its due time a record is published
	BatchSize int           // the most records claimed at a time
}

// New returns a Dispatcher.
func New(st *store.Store, pub Publisher, log *zap.Logger, cfg Config) *Dispatcher {
	return &Dispatcher{store: st, pub: pub, log: log, interval: cfg.Interval, claimTTL: cfg.ClaimTTL,
		horizon: max(cfg.Horizon, 0), batchSize: cfg.BatchSize, wake: make(chan struct{}, 1)}
}

// Nudge implements DispatcherService.Nudge: it asks for a pass without waiting for it.
func (d *Dispatcher) Nudge(context.Context, *dispatcherv1.NudgeRequest) (*dispatcherv1.NudgeResponse, error) {
	select {
	case d.wake <- struct{}{}:
	default: // a pass is already due
	}
	return &dispatcherv1.NudgeResponse{}, nil
}

// Run passes when nudged, when the earliest waiting record comes within the horizon (or its claim
// expires), and at least every interval (which recovers lost nudges and records written by other
// dispatchers' peers), until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) error {
	timer := time.NewTimer(d.interval)
	defer timer.Stop()
	for {
		wait, err := d.pass(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("dispatch pass failed", zap.Error(err))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-d.wake:
		}
	}
}

// Pass publishes every record due within the horizon, batch by batch, and records the time it
// completed.
func (d *Dispatcher) Pass(ctx context.Context) error {
	_, err := d.pass(ctx)
	return err
}

// pass is Pass, also answering the wait before the next one: until the earliest waiting record
// becomes claimable (horizon before it is due), as the last claim statement measured it on the
// database's clock, less the time since on this host's; at least 1 ms, at most the interval. After
// an error, the interval.
func (d *Dispatcher) pass(ctx context.Context) (time.Duration, error) {
	for {
		b, err := d.batch(ctx)
		if err != nil {
			return d.interval, err
		}
		if b.claimed < d.batchSize {
			lastPass.SetToCurrentTime()
			return d.untilNext(b), nil
		}
	}
}

// untilNext is the wait after the pass's last batch b.
func (d *Dispatcher) untilNext(b batchResult) time.Duration {
	switch {
	case b.released:
		// Records given back unpublished are claimable at once (as before the claim answered).
		return time.Millisecond
	case b.nextIn == nil:
		return d.interval
	}
	return min(max(*b.nextIn-time.Since(b.measured), time.Millisecond), d.interval)
}

// batchResult is what one claim-and-publish did.
type batchResult struct {
	claimed  int
	released bool           // some records were given back unpublished
	nextIn   *time.Duration // the claim's answer: see store.Claim.NextIn
	measured time.Time      // this host's time just before the claim statement
}

// releaseTimeout bounds giving up the claim on records that were not published.
const releaseTimeout = 2 * time.Second

// claimTimeout bounds the claim statement, which runs apart from the pass's context (see batch).
const claimTimeout = 5 * time.Second

func (d *Dispatcher) batch(ctx context.Context) (batchResult, error) {
	start := time.Now()
	// The claim runs whatever the stop: a claim statement cancelled as it ran can still commit in
	// Postgres, and its rows then waited out the whole claim (30 s) with nobody to publish or
	// release them — a rolling restart of the dispatcher delayed a few executions by 30 s (e2e
	// TestRollingRestartSpendsNoAttempt). Claimed, they are published, or released if the pass
	// was stopped meanwhile.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	claim, err := d.store.DispatchClaim(cctx, d.batchSize, d.claimTTL, d.horizon)
	cancel()
	if err != nil {
		return batchResult{}, err
	}
	res := batchResult{claimed: len(claim.Dispatches), nextIn: claim.NextIn, measured: start}
	claimed := claim.Dispatches
	if len(claimed) == 0 {
		return res, nil
	}
	if ctx.Err() != nil {
		ids := make([]int64, len(claimed))
		for i, c := range claimed {
			ids[i] = c.ID
		}
		d.release(ctx, ids, claimed[0].ClaimedUntil)
		return batchResult{}, ctx.Err()
	}
	// How far ahead each record is due, on the database's clock (which wrote due_at), less the time
	// since the claim was asked for: an overestimate of the time passed, so a message is never
	// published into a level that outlasts its due time by more than the route's delay tolerance.
	// That underestimate of the delay — a retry written due in 1 m comes out a few ms short of it —
	// is what the tolerance absorbs: it still goes into the 1 m level (one holding-queue hop)
	// rather than the 30 s one and down the shorter levels by deferrals.
	since := time.Since(start)
	msgs := make([]mq.Outgoing, len(claimed))
	delays := make([]time.Duration, len(claimed))
	// One span per dispatch, in its execution's trace (the accept's, from the row), not one for
	// the batch: each message carries its own span's context (docs/decisions.md, Tracing).
	spans := make([]trace.Span, len(claimed))
	defer func() {
		for _, span := range spans {
			if span != nil {
				span.End()
			}
		}
	}()
	for i, c := range claimed {
		_, spans[i] = telemetry.Start(telemetry.WithTraceparent(ctx, c.Traceparent, c.Tracestate), "dispatch",
			trace.SpanKindProducer, telemetry.ExecutionID(c.ExecutionID), telemetry.Attempt(c.Attempt))
		delays[i] = c.DueAt.Sub(c.ClaimedAt) - since
		body, err := proto.Marshal(&queuev1.ExecutionDispatch{
			ExecutionId: c.ExecutionID, Attempt: c.Attempt, DueTime: timestamppb.New(c.DueAt),
		})
		if err != nil {
			return batchResult{}, fmt.Errorf("encode dispatch %d: %w", c.ID, err)
		}
		// The message id names the attempt, so every copy of one attempt's dispatch has the same
		// identity.
		msgs[i] = mq.Outgoing{ID: fmt.Sprintf("%s:%d", c.ExecutionID, c.Attempt), Body: body, SpanContext: spans[i].SpanContext()}
	}
	// The message carries the due time: one that arrives early by the tolerance or more (a level
	// shorter than its delay) is deferred again by the consumer, without spending an attempt.
	errs := d.pub.PublishAfter(ctx, routes.Executions.Name, msgs, delays)
	var done, failed []int64
	for i, err := range errs {
		if err != nil {
			telemetry.Fail(spans[i], err)
			publishFailures.Inc()
			d.log.Warn("dispatch publish not confirmed", plog.ExecutionID(claimed[i].ExecutionID),
				plog.Attempt(claimed[i].Attempt), zap.Error(err))
			failed = append(failed, claimed[i].ID)
			continue
		}
		done = append(done, claimed[i].ID)
		// How late after its due time the dispatch went out, on the database's clock (0 for
		// one published ahead into a holding queue).
		dispatchLag.Observe(max(0, (claimed[i].ClaimedAt.Sub(claimed[i].DueAt) + time.Since(start)).Seconds()))
	}
	if len(failed) > 0 {
		// Not published (or not known to be): give the claim up so that they go out with the next
		// pass rather than after the claim expires — a dispatcher stopped by a rolling deploy
		// between claim and confirm otherwise held them for the whole claim (30 s).
		d.release(ctx, failed, claimed[0].ClaimedUntil)
		res.released = true
	}
	if len(done) > 0 {
		// One claim statement gave every row the same claimed_until.
		deleted, err := d.store.DispatchDeletePublished(ctx, done, claimed[0].ClaimedUntil)
		if err != nil {
			// Published but not deleted: they are published again after the claim expires, and
			// the consumer's compare of status and attempt makes the duplicate harmless.
			return batchResult{}, err
		}
		published.Add(float64(deleted))
	}
	return res, nil
}

// release gives up the claim on records not published, so that the next pass (here or on
// another dispatcher) takes them. Done even when ctx ended with the stop; a failed release only
// leaves the claim to expire.
func (d *Dispatcher) release(ctx context.Context, ids []int64, claimedUntil time.Time) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if _, err := d.store.DispatchRelease(rctx, ids, claimedUntil); err != nil {
		d.log.Warn("unpublished dispatches not released; they wait for their claim to expire", zap.Int("records", len(ids)), zap.Error(err))
	}
}
