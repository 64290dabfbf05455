package mq

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// ErrInvalidName is wrapped by every error about a scope, route or queue name that RabbitMQ (or our
// naming scheme) would not accept.
var ErrInvalidName = errors.New("invalid name")

// namePattern is the character set every queue name is held to. AMQP itself allows more, but the
// same names travel through other brokers' naming rules and log queries, so we keep to the
// intersection.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9_\-.:]+$`)

// maxNameLen is AMQP's limit on a queue name (a short string).
const maxNameLen = 255

// ValidateName reports whether name can be used as (part of) a queue name: [a-zA-Z0-9_\-.:]+ and at
// most 255 bytes. The error names the offending name and wraps ErrInvalidName.
func ValidateName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("mq: name %q must match [a-zA-Z0-9_\\-.:]+: %w", name, ErrInvalidName)
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("mq: name %q is %d bytes, over the AMQP limit of %d: %w", name, len(name), maxNameLen, ErrInvalidName)
	}
	return nil
}

// validateRoute also refuses route names that would collide with another route's holding queue or
// DLQ (route "a.dlq" would share a queue with route "a"'s dead letters).
func validateRoute(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if strings.HasSuffix(name, ".dlq") || strings.Contains(name, ".retry.") || strings.Contains(name, ".delay.") {
		return fmt.Errorf("mq: route name %q would collide with a DLQ or holding queue name: %w", name, ErrInvalidName)
	}
	return nil
}

// Queue arguments shared by every queue we declare.
const (
	// deliveryLimit is the broker-side backstop: a delivery that keeps coming back without being
	// settled (a consumer crashing on it, connections dropping) is dead-lettered after this many
	// deliveries instead of looping forever. It is well above any sane RetryPolicy because our own
	// retries republish (a fresh message) rather than redeliver.
	deliveryLimit   = 20
	defaultPrefetch = 32
)

// topology is a route resolved against the broker's scope and time scale: every queue name it
// needs, validated, and the retry plan.
type topology struct {
	route       string // the counters key and Message.Route
	queue       string
	dlq         string
	prefetch    int
	maxAttempts int
	// retryQueues[i] is the holding queue used before attempt i+2; its TTL is retryTTLs[i].
	retryQueues []string
	retryTTLs   []time.Duration
	// delayQueues[i] holds messages published (or deferred) for at least delayTTLs[i]; ascending,
	// one per distinct scaled level. Empty for a route without DelayLevels.
	delayQueues []string
	delayTTLs   []time.Duration
	// delayTolerance is how far short of a level a delay may fall and still wait in it (see
	// DelayTolerance); 0 without delay levels.
	delayTolerance time.Duration
	// handlerTimeout is Route.Timeout: the deadline of one handler call; 0: none.
	handlerTimeout time.Duration
}

// DelayTolerance is how much shorter than a delay level a delay may be and still wait in that
// level rather than the next shorter one — so a message may arrive up to this much after its due
// time — and, time-scaled, how early an arrival a handler can take as on time (see
// [Broker.DelayTolerance]).
// A publisher's delay is computed after the fact (a due time written a few milliseconds earlier,
// a claim, an encode), so a retry due in exactly one level's delay comes out a few milliseconds
// short of it. Without the tolerance it went to the next shorter level, arrived early, was
// deferred, and so on down the levels: a 1 m retry took ~10 holding-queue hops, a 2 h one 22. For
// choosing a level it is scaled with Config.TimeScale like the levels, but never below
// delayToleranceFloor: the milliseconds spent are real ones whatever the scale, and arriving that
// much late is harmless. It must stay far below the gaps between
// levels (it is a twentieth of the smallest default level, 1 s).
const DelayTolerance = 50 * time.Millisecond

// delayToleranceFloor is the least DelayTolerance scales down to.
const delayToleranceFloor = 5 * time.Millisecond

// scaledTolerance is DelayTolerance under timeScale.
func scaledTolerance(timeScale float64) time.Duration {
	return max(scaledTTL(DelayTolerance, timeScale), delayToleranceFloor)
}

// plan resolves a Route. It is pure so Declare can validate every route before touching the broker.
func plan(scope string, timeScale float64, r Route) (*topology, error) {
	if err := validateRoute(r.Name); err != nil {
		return nil, err
	}
	t := &topology{
		route:    r.Name,
		queue:    scope + "." + r.Name,
		prefetch: r.Prefetch,
	}
	t.dlq = t.queue + ".dlq"
	if t.prefetch <= 0 {
		t.prefetch = defaultPrefetch
	}
	if r.Timeout < 0 {
		return nil, fmt.Errorf("mq: route %q: negative timeout %v", r.Name, r.Timeout)
	}
	t.handlerTimeout = r.Timeout
	if r.Prefetch > 65535 {
		return nil, fmt.Errorf("mq: route %q: prefetch %d above the AMQP limit 65535", r.Name, r.Prefetch)
	}
	switch {
	case r.Retry.MaxAttempts < 0:
		return nil, fmt.Errorf("mq: route %q: negative MaxAttempts %d", r.Name, r.Retry.MaxAttempts)
	case r.Retry.MaxAttempts == 0:
		t.maxAttempts = len(r.Retry.Delays) + 1
	default:
		t.maxAttempts = r.Retry.MaxAttempts
	}
	if t.maxAttempts > 1 && len(r.Retry.Delays) == 0 {
		return nil, fmt.Errorf("mq: route %q: MaxAttempts %d needs at least one retry delay", r.Name, t.maxAttempts)
	}
	if r.Retry.Floor < 0 {
		return nil, fmt.Errorf("mq: route %q: negative retry floor %v", r.Name, r.Retry.Floor)
	}
	for i, d := range r.Retry.Delays {
		if d <= 0 {
			return nil, fmt.Errorf("mq: route %q: retry delay %d is %v, must be positive", r.Name, i, d)
		}
		ttl := max(scaledTTL(d, timeScale), min(d, r.Retry.Floor).Round(time.Millisecond))
		t.retryTTLs = append(t.retryTTLs, ttl)
		t.retryQueues = append(t.retryQueues, fmt.Sprintf("%s.retry.%dms", t.queue, ttl.Milliseconds()))
	}
	levels := make([]time.Duration, 0, len(r.DelayLevels))
	for i, d := range r.DelayLevels {
		if d <= 0 {
			return nil, fmt.Errorf("mq: route %q: delay level %d is %v, must be positive", r.Name, i, d)
		}
		levels = append(levels, scaledTTL(d, timeScale))
	}
	slices.Sort(levels)
	for _, ttl := range slices.Compact(levels) {
		t.delayTTLs = append(t.delayTTLs, ttl)
		t.delayQueues = append(t.delayQueues, delayQueueName(t.queue, ttl))
	}
	if len(t.delayTTLs) > 0 {
		t.delayTolerance = scaledTolerance(timeScale)
	}
	for _, n := range slices.Concat([]string{t.queue, t.dlq}, t.retryQueues, t.delayQueues) {
		if err := ValidateName(n); err != nil {
			return nil, fmt.Errorf("mq: route %q: %w", r.Name, err)
		}
	}
	return t, nil
}

// delayQueueName is the holding queue of a delay level on RabbitMQ.
func delayQueueName(queue string, ttl time.Duration) string {
	return fmt.Sprintf("%s.delay.%dms", queue, ttl.Milliseconds())
}

// scaledTTL is a holding queue's TTL for delay d: scaled, in whole milliseconds (that is what
// x-message-ttl takes), and at least 1 ms, so that a delay scaled below 1 ms keeps a queue of its
// own.
func scaledTTL(d time.Duration, timeScale float64) time.Duration {
	return max(time.Duration(float64(d)*timeScale).Round(time.Millisecond), time.Millisecond)
}

// RetryDelays are a route's retry delays as its holding queues apply them: scaled by timeScale,
// never below the policy's Floor, in whole milliseconds; one per retry after the first delivery
// (the last repeating up to MaxAttempts). Budget is their sum: how long after its first failure a
// message that keeps failing is dead-lettered, leaving out the handler's own time.
func RetryDelays(r Route, timeScale float64) (delays []time.Duration, budget time.Duration, err error) {
	t, err := plan("x", timeScale, r)
	if err != nil {
		return nil, 0, err
	}
	for attempt := 1; attempt < t.maxAttempts; attempt++ {
		d := t.retryTTLs[min(attempt-1, len(t.retryTTLs)-1)]
		delays = append(delays, d)
		budget += d
	}
	return delays, budget, nil
}

// delayQueue is the holding queue of the delay level a message due in d waits in, and its TTL:
// the level d reaches, or the next longer one when d falls short of it by no more than that
// level's slack (levelSlack) — the message then arrives at most that much late instead of early,
// to be deferred again down the shorter levels. A delay comes out short of the level it was meant
// for by the time between writing its due time and publishing it: milliseconds when idle, tens to
// a few hundred under load (a settlement batch's commit, the dispatcher's nudge and claim, a
// loaded machine's scheduling), which neither a fixed 50 ms nor a hundredth of a 1 s or 5 s level
// covered. ok is false when d is not positive (due already), when d is short of the smallest
// level by more than its slack, or when the route has no levels.
func (t *topology) delayQueue(d time.Duration) (queue string, ttl time.Duration, ok bool) {
	if len(t.delayTTLs) == 0 || d <= 0 {
		return "", 0, false
	}
	i, found := slices.BinarySearch(t.delayTTLs, d) // the first level not shorter than d
	if !found && (i == len(t.delayTTLs) || t.delayTTLs[i]-d > t.levelSlack(t.delayTTLs[i])) {
		i-- // the largest level shorter than d
	}
	if i < 0 {
		return "", 0, false
	}
	return t.delayQueues[i], t.delayTTLs[i], true
}

// levelLagCap is the most of a level's tenth that its slack takes (before the hundredth, which
// has no cap): a second covers any lag between writing a due time and publishing it that is not
// an outage.
const levelLagCap = time.Second

// levelSlack is how much longer than its delay a message may wait in level: a tenth of the level
// up to levelLagCap, a hundredth if more, never less than the route's delay tolerance. At the
// executions route's levels: 100 ms at 1 s, 500 ms at 5 s, 1 s from 10 s to 100 s, then 1 % (72 s
// at 2 h). The tenth is for the short levels, where the lag is a large part of the level; a
// message waits that much late in one hop rather than walking down the shorter levels by
// deferrals (each a holding-queue hop, or a worker held below the smallest level).
func (t *topology) levelSlack(level time.Duration) time.Duration {
	return max(t.delayTolerance, min(level/10, levelLagCap), level/100)
}

// retryQueue is the holding queue for a message whose attempt number `attempt` just failed.
func (t *topology) retryQueue(attempt int) string {
	i := min(max(attempt-1, 0), len(t.retryQueues)-1)
	return t.retryQueues[i]
}

// queues lists every queue of the route, for callers that clean up (tests, tooling).
func (t *topology) queues() []string {
	out := []string{t.queue, t.dlq}
	seen := map[string]bool{}
	for _, q := range t.retryQueues {
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	return append(out, t.delayQueues...)
}
