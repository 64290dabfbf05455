// Package deliver delivers events to each application's consumer — a webhook signed per the
// Standard Webhooks convention, or a gRPC EventConsumerService — recording every attempt.
//
// Two levels of retry are kept apart (docs/architecture.md §6, "Two levels of retry"). The
// delivery schedule is counted on the event row: after a failed attempt the deliverer records
// when the next one is due and returns mq.Defer, so the notice waits in the events route's delay
// levels without spending a port attempt; after the last attempt the event is dead and the notice
// acked. The route's own short
// Fail budget covers only the deliverer failing to do its own work (Postgres unreachable).
//
// One application cannot hold up another's deliveries: at most PerApp deliveries per application
// are in flight in one deliverer; a notice for an application at its bound waits a moment
// (BusyPatience) for a slot, then is deferred by the route's smallest delay level instead of
// occupying a worker (docs/decisions.md).
package deliver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/execution"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

const (
	// maxErrorLen bounds a stored attempt error.
	maxErrorLen = 512
	// maxStoredBody bounds the start of a consumer's answer kept with its attempt.
	maxStoredBody = 1 << 10
	// claimMargin is added to the timeout for an attempt's claim: time to record the attempt.
	claimMargin = 5 * time.Second
	// claimPoll is how often a notice of an event claimed by another delivery looks again.
	claimPoll = time.Second
)

// Config is how the deliverer delivers.
type Config struct {
	// Delays is the schedule, already time-scaled: attempt n+1 is due Delays[n-1] after attempt n
	// failed. There are 1+len(Delays) attempts in all.
	Delays []time.Duration
	// Timeout bounds one attempt: connection, request and the (bounded) answer.
	Timeout time.Duration
	// AllowPrivate lets consumers be reached at private, loopback and link-local addresses
	// (webhook.Policy; the policy's syntactic checks apply whatever it says).
	AllowPrivate bool
	// Deny lists ranges never reached, whatever AllowPrivate says (INTEGRATIONS_WEBHOOK_DENY_CIDRS).
	Deny []netip.Prefix
	// Resolver resolves consumer host names (nil: the system's); tests inject one.
	Resolver *net.Resolver
	// PerApp is the most deliveries of one application in flight at once in this deliverer.
	PerApp int
	// Busy is how long a notice for an application at its bound is deferred: the route's smallest
	// delay level, so that the copy waits in the broker rather than in a worker.
	Busy time.Duration
	// BusyPatience is how long a notice waits for a slot of its application before it is
	// deferred by Busy (0: not at all).
	BusyPatience time.Duration
	// TimeScale shrinks a consumer's Retry-After as the schedule is shrunk (INTEGRATIONS_TIME_SCALE).
	TimeScale float64
}

// Deliverer delivers events.
type Deliverer struct {
	store   *store.Store
	box     *secret.Box
	cfg     Config
	limiter *limiter
	webhook *webhookClient
	grpc    *grpcClients
	log     *zap.Logger
}

// New returns a Deliverer. Every endpoint is checked against the address policy before an
// attempt, and every connection after name resolution: unless cfg.AllowPrivate, private, loopback
// and link-local addresses are refused, so a consumer endpoint cannot reach inside the cluster.
func New(st *store.Store, box *secret.Box, cfg Config, log *zap.Logger) *Deliverer {
	if cfg.TimeScale <= 0 {
		cfg.TimeScale = 1
	}
	// http or https: which scheme a tenant may register is the gateway's decision
	// (INTEGRATIONS_WEBHOOK_ALLOW_HTTP); what may be reached is this policy's.
	policy := webhook.Policy{AllowPrivate: cfg.AllowPrivate, AllowHTTP: true, Deny: cfg.Deny}
	return &Deliverer{
		store: st, box: box, cfg: cfg, log: log,
		limiter: newLimiter(max(cfg.PerApp, 1), cfg.BusyPatience),
		webhook: newWebhookClient(cfg.Timeout, policy, cfg.Resolver),
		grpc:    newGRPCClients(policy, cfg.Resolver),
	}
}

// Close closes the deliverer's cached consumer connections.
func (d *Deliverer) Close() error { return d.grpc.close() }

// maxAttempts is the number of delivery attempts an event gets.
func (d *Deliverer) maxAttempts() int { return 1 + len(d.cfg.Delays) }

// result is what one attempt found.
type result struct {
	statusCode int    // the webhook's HTTP status, 0 if none
	body       string // the start of the answer, truncated and cleaned
	err        error  // nil: delivered; its text goes to the log only
	// category is what the tenant is shown of err (webhook.Category*), set whenever err is.
	category string
	// retryAfter is a 429 or 503 answer's Retry-After, time-scaled; 0 if none.
	retryAfter time.Duration
}

// Handle is the mq.Handler of the events route.
func (d *Deliverer) Handle(ctx context.Context, m *mq.Message) mq.Result {
	var n queuev1.EventNotice
	if err := proto.Unmarshal(m.Body, &n); err != nil || n.GetEventId() == "" {
		return mq.Reject(fmt.Errorf("malformed event notice %s", m.ID))
	}
	logger := d.log.With(log.EventID(n.GetEventId()), log.ApplicationID(n.GetApplicationId()))

	// The bound is taken before anything else, so a notice of a busy application costs no query.
	// A notice without an application (none today) shares the "" bound.
	if !d.limiter.acquire(ctx, n.GetApplicationId()) {
		return mq.Defer(d.cfg.Busy)
	}
	defer d.limiter.release(n.GetApplicationId())

	ev, err := d.store.DeliveryClaim(ctx, n.GetEventId(), d.cfg.Timeout+claimMargin)
	if errors.Is(err, store.ErrNotFound) {
		return mq.Reject(err)
	}
	if err != nil {
		return mq.Fail(err)
	}
	switch {
	case ev.Status != "pending":
		return mq.Ack() // a duplicate notice of a delivered or dead event
	case ev.Held:
		// An earlier event of its execution is pending (redelivered after this one was relayed):
		// the claim gave this one back to the relay, which sends it after that one.
		logger.Debug("event held behind an earlier event of its execution; given back to the relay")
		return mq.Ack()
	case ev.Wait > 0:
		// Early: the next attempt is not due yet (a notice handed out again after a restart, or a
		// second copy). Come back when it is.
		return mq.Defer(ev.Wait)
	case ev.ClaimWait > 0:
		// Another delivery of this event is in flight (a duplicate notice), or its deliverer died
		// holding the claim. Look again soon rather than when the claim would expire: the usual
		// case is the other delivery finishing, and then this notice is acked.
		return mq.Defer(min(ev.ClaimWait, max(d.cfg.Busy, claimPoll)))
	}

	return d.deliverClaimed(ctx, ev, logger).result()
}

// verdictKind is what became of a claimed event's delivery.
type verdictKind uint8

const (
	// verdictDone: delivered, dead, or moved on meanwhile; nothing follows.
	verdictDone verdictKind = iota
	// verdictDefer: its next attempt is due after delay; a notice must wait for it.
	verdictDefer
	// verdictFail: the attempt was made but not recorded (err); the claim holds until it expires.
	verdictFail
	// verdictStopped: stopped mid-attempt; nothing recorded, the claim released.
	verdictStopped
)

// verdict is the outcome of deliverClaimed, which Handle turns into the notice's mq.Result and
// the in-process deliverer into a notice of its own when one is needed.
type verdict struct {
	kind  verdictKind
	delay time.Duration
	err   error
}

func (v verdict) result() mq.Result {
	switch v.kind {
	case verdictDefer:
		return mq.Defer(v.delay)
	case verdictFail:
		return mq.Fail(v.err)
	case verdictStopped:
		return mq.Result{}
	default:
		return mq.Ack()
	}
}

// deliverClaimed makes one attempt of ev, which this deliverer has claimed (ev.Claim) and holds
// its application's slot for, and records it.
func (d *Deliverer) deliverClaimed(ctx context.Context, ev *store.Delivery, logger *zap.Logger) verdict {
	// The delivery continues the notice's trace (the relay's span, through the message's
	// headers) or, handed over in process or noticed without one, the event's own.
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = telemetry.WithTraceparent(ctx, ev.Traceparent, ev.Tracestate)
	}
	ctx, span := telemetry.Start(ctx, "deliver", trace.SpanKindClient, telemetry.ExecutionID(ev.ExecutionID),
		telemetry.EventID(ev.EventID), attribute.Int("integrations.delivery_attempt", int(ev.Attempts)+1))
	defer span.End()
	start := time.Now()
	res := d.attempt(ctx, ev)
	elapsed := time.Since(start)
	if res.statusCode != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", res.statusCode))
	}
	telemetry.Fail(span, res.err)
	if ctx.Err() != nil {
		// Stopped mid-attempt: nothing is recorded, and the broker hands the notice out again.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := d.store.DeliveryRelease(rctx, ev.EventID, ev.Claim); err != nil {
			logger.Warn("event claim not released; it expires by itself", zap.Error(err))
		}
		return verdict{kind: verdictStopped}
	}

	deliveryResult := "delivered"
	if res.err != nil {
		deliveryResult = "failed"
	}
	deliverySeconds.WithLabelValues(deliveryResult).Observe(elapsed.Seconds())

	a := store.Attempt{StatusCode: res.statusCode, Duration: elapsed, ResponseBody: res.body, Outcome: "delivered",
		Claim: ev.Claim, Attempts: ev.Attempts}
	attempt := int(ev.Attempts) + 1 // the event's own count, not the message's
	// The raw error, bounded and without URLs, is for the log only; the tenant sees its category.
	var logErr string
	if res.err != nil {
		logErr = safetext.Error(res.err, maxErrorLen)
		a.Err = cmp.Or(webhook.PublicCategory(res.category), webhook.CategoryOther)
		a.Outcome = "dead"
		if attempt < d.maxAttempts() {
			a.Outcome = "pending"
			a.NextIn = nextDelay(d.cfg.Delays, attempt, res.retryAfter)
		}
	}
	recorded, err := d.store.DeliveryRecord(ctx, ev.EventID, a)
	if err != nil {
		// The attempt happened but is not recorded; the port retries the notice shortly, and it
		// waits for the claim to expire before delivering again (at least once).
		return verdict{kind: verdictFail, err: err}
	}
	fields := []zap.Field{log.DeliveryAttempt(attempt), zap.Int("status_code", res.statusCode), zap.Duration("duration", elapsed)}
	switch {
	case !recorded:
		// Settled, redelivered or taken over meanwhile: whoever did that owns what follows (a
		// redelivery published its own notice).
		logger.Info("event moved on during the attempt; attempt kept in the history only", fields...)
		return verdict{kind: verdictDone}
	case a.Outcome == "delivered":
		if ev.Type == execution.EventTypeExecutionComplete {
			endToEndSeconds.Observe(metrics.Since(ev.ExecutionCreatedAt))
		}
		logger.Info("event delivered", fields...)
		return verdict{kind: verdictDone}
	case a.Outcome == "dead":
		logger.Warn("event dead after its last delivery attempt",
			append(fields, zap.String("category", a.Err), zap.String("error", logErr))...)
		return verdict{kind: verdictDone}
	default:
		logger.Info("event delivery failed; next attempt scheduled",
			append(fields, zap.String("category", a.Err), zap.String("error", logErr), zap.Duration("next_in", a.NextIn))...)
		return verdict{kind: verdictDefer, delay: a.NextIn}
	}
}

// nextDelay is the wait after failed attempt n (from 1, below the last) of the schedule delays.
//
// "Honouring Retry-After on 429/503 up to the next level" is read as: the consumer may ask us to
// wait longer than the schedule's delay, and we do, but never longer than the level after it
// would have made us wait. So the delay is max(delays[n-1], retryAfter), capped at delays[n]; for
// the last gap, which has no level after it, the schedule's own delay stands. A Retry-After
// shorter than the schedule never brings an attempt forward: the schedule is what keeps a
// struggling consumer from being hammered.
func nextDelay(delays []time.Duration, n int, retryAfter time.Duration) time.Duration {
	base := delays[n-1]
	if retryAfter <= base {
		return base
	}
	limit := base
	if n < len(delays) {
		limit = delays[n]
	}
	return min(retryAfter, limit)
}

// attempt delivers ev once to its application's consumer.
func (d *Deliverer) attempt(ctx context.Context, ev *store.Delivery) result {
	if ev.ConsumerKind == nil || ev.Endpoint == nil {
		return result{err: errors.New("application has no consumer registered"), category: webhook.CategoryNoConsumer}
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	// Either kind is signed with the same secrets, per the Standard Webhooks convention.
	secrets, err := d.secrets(ev)
	if err != nil {
		return result{err: err, category: webhook.CategoryOther}
	}
	switch *ev.ConsumerKind {
	case "webhook":
		return d.webhook.post(ctx, *ev.Endpoint, secrets, ev, d.cfg.TimeScale)
	case "grpc":
		return d.grpc.deliver(ctx, grpcTargetOf(ev), secrets, ev)
	default:
		return result{err: fmt.Errorf("consumer kind %q is not supported", *ev.ConsumerKind), category: webhook.CategoryOther}
	}
}

// secrets opens the application's signing secrets: the current one, then the previous one while
// its overlap lasts.
func (d *Deliverer) secrets(ev *store.Delivery) ([]string, error) {
	if ev.SealedSecret == nil {
		return nil, errors.New("application has no signing secret")
	}
	current, err := d.box.Open(ev.SealedSecret)
	if err != nil {
		return nil, fmt.Errorf("open signing secret: %w", err)
	}
	out := []string{string(current)}
	if ev.PrevSealedSecret != nil {
		// The previous secret only eases a receiver's switch; if it cannot be opened (its key
		// was dropped from INTEGRATIONS_SECRET_KEY_PREVIOUS early), sign with the current one.
		if prev, err := d.box.Open(ev.PrevSealedSecret); err != nil {
			d.log.Warn("previous signing secret unreadable; signing with the current one only",
				log.ApplicationID(ev.ApplicationID), zap.Error(err))
		} else {
			out = append(out, string(prev))
		}
	}
	return out, nil
}
