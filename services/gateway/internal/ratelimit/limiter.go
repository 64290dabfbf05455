// Package ratelimit holds the gateway's rate limits per application (issue 11): a token bucket per
// application for invokes and another for reads, each replica holding its share of the limit —
// limit ÷ live replicas, counted from a heartbeat table — so that N replicas admit about the
// limit, not N times it, at no cost on accept (docs/decisions.md, "Rate limits per application (issue 11)").
package ratelimit

import (
	"context"
	"math"
	"sync"
	"time"
)

// Kind is what a call counts against: an application's invokes and its reads are limited apart,
// so that a client polling its executions cannot starve its own invokes, nor the reverse.
type Kind int

// The kinds of call.
const (
	Invoke Kind = iota
	Read
)

// String names the kind as the refusal message does ("invoke rate limit of ...").
func (k Kind) String() string {
	if k == Invoke {
		return "invoke"
	}
	return "read"
}

// Limit is a token bucket: PerSecond tokens a second, up to Burst at once. A PerSecond of 0 is
// no limit.
type Limit struct {
	PerSecond float64
	Burst     int
}

// Unlimited reports whether the limit admits everything.
func (l Limit) Unlimited() bool { return l.PerSecond <= 0 }

// Limits are an application's limits.
type Limits struct {
	Invoke, Read Limit
}

// Of returns the limit of kind k.
func (l Limits) Of(k Kind) Limit {
	if k == Invoke {
		return l.Invoke
	}
	return l.Read
}

// Decision is the answer to one call.
type Decision struct {
	Allowed bool
	// Wait is, when allowed, how long the call must wait for the token reserved for it (0: the
	// token is there now). Only Take with a positive within reserves.
	Wait time.Duration
	// RetryAfter is, when refused, when this replica's bucket has a token again (at most
	// MaxRetryAfter).
	RetryAfter time.Duration
	// Limit is the application's whole limit (not this replica's share), for the message.
	Limit Limit
}

// MaxRetryAfter caps the delay a refusal advises: a tiny rate's next token can be days away,
// and a client told to come back in a day is better told an hour and refused again.
const MaxRetryAfter = time.Hour

// sweepEvery is how often, at most, idle buckets are dropped. A bucket is dropped once full — idle for at
// least the time it takes to refill — since a new bucket starts full: dropping it changes nothing
// but the memory held by applications that stopped calling.
const sweepEvery = time.Minute

// Limiter holds the buckets of every application that called this replica recently. Their
// number is bounded by the catalog's applications (calls are counted after authentication), and
// full buckets are dropped by a sweep that runs when a bucket is made, at most every sweepEvery
// (the memory held grows only as buckets are made).
type Limiter struct {
	limits   func(ctx context.Context, app string) (Limits, error)
	replicas func() int
	now      func() time.Time

	buckets table[bucketKey]
}

type bucketKey struct {
	app  string
	kind Kind
}

// New returns a Limiter reading each application's limits with limits (cached by the caller: it
// is called on every call) and the number of live replicas with replicas (at least 1).
func New(limits func(ctx context.Context, app string) (Limits, error), replicas func() int) *Limiter {
	return &Limiter{limits: limits, replicas: replicas, now: time.Now, buckets: newTable[bucketKey]()}
}

// Take takes a token from the application's bucket of kind k, or says when to come back; when the
// bucket's next token comes within within, it reserves it for the call: the call is admitted with
// Wait, the time until then, and must wait it before it runs. The tokens reserved at once are
// bounded by rate × within, so the callers waiting are too. An error is the limits' read failing.
func (l *Limiter) Take(ctx context.Context, app string, k Kind, within time.Duration) (Decision, error) {
	return l.decide(ctx, app, k, within, true)
}

// Peek is the decision Take would make now, with nothing taken or reserved: for a refusal ahead
// of the call's own Take (the REST server's, before its hop to the gRPC server). Calls admitted by
// Peek can still be refused by their Take.
func (l *Limiter) Peek(ctx context.Context, app string, k Kind, within time.Duration) (Decision, error) {
	return l.decide(ctx, app, k, within, false)
}

func (l *Limiter) decide(ctx context.Context, app string, k Kind, within time.Duration, take bool) (Decision, error) {
	limits, err := l.limits(ctx, app)
	if err != nil {
		return Decision{}, err
	}
	limit := limits.Of(k)
	if limit.Unlimited() {
		return Decision{Allowed: true, Limit: limit}, nil
	}
	n := max(l.replicas(), 1)
	for {
		b := l.buckets.get(bucketKey{app, k}, l.now)
		// The clock is read under the bucket's lock, so that the calls on a bucket see time
		// in the order they take its tokens.
		b.mu.Lock()
		if b.dropped { // swept between the lookup and the lock: take from its successor
			b.mu.Unlock()
			continue
		}
		var d Decision
		if take {
			d = b.take(l.now(), limit, n, within)
		} else {
			probe := b.state // a copy: deciding on it changes nothing
			d = probe.take(l.now(), limit, n, within)
		}
		b.mu.Unlock()
		d.Limit = limit
		return d, nil
	}
}

// bucket is one application's token bucket of one kind: tokens at last, refilled at rate a
// second up to burst — this replica's share of limit over replicas, resized in place (keeping its
// tokens) when either changes. tokens below 0 are tokens reserved for calls waiting for them.
// A hand-written bucket rather than x/time/rate's: its clock is read outside its lock, and a
// refusal's ReserveN then CancelAt are two acquisitions that interleaved calls turned into
// tokens minted or leaked.
type bucket struct {
	mu      sync.Mutex
	dropped bool
	// held and settled are the failed-authentication limiter's (Failures): the attempts in
	// flight, each holding a token until it is known to have failed (kept) or succeeded (given
	// back), and a channel closed when one of them settles, for attempts waiting on them.
	held    int
	settled chan struct{}
	state
}

// state is a bucket's tokens and the limit they are counted against.
type state struct {
	limit    Limit
	replicas int
	rate     float64
	burst    float64
	tokens   float64
	last     time.Time
}

// advance refills the bucket to now. A now before last (a clock read late) adds nothing: time
// never runs backwards for a bucket, so it can never earn the same interval twice.
func (b *state) advance(now time.Time) {
	if now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
}

// take decides one call at now; b.mu is held.
func (b *state) take(now time.Time, limit Limit, n int, within time.Duration) Decision {
	switch {
	case b.last.IsZero(): // new: full
		b.limit, b.replicas = limit, n
		b.rate, b.burst = share(limit, n)
		b.tokens, b.last = b.burst, now
	case b.limit != limit || b.replicas != n:
		b.advance(now) // the time until now at the old rate
		b.limit, b.replicas = limit, n
		b.rate, b.burst = share(limit, n)
		b.tokens = min(b.tokens, b.burst)
	default:
		b.advance(now)
	}
	// The slack absorbs the floating point error of refills that add up to a whole token.
	if b.tokens >= 1-1e-9 {
		b.tokens--
		return Decision{Allowed: true}
	}
	wait := b.until(1)
	if within > 0 && wait <= within {
		b.tokens--
		return Decision{Allowed: true, Wait: wait}
	}
	return Decision{RetryAfter: min(wait, MaxRetryAfter)}
}

// until is how long after b.last the bucket holds tokens tokens.
func (b *state) until(tokens float64) time.Duration {
	secs := (tokens - b.tokens) / b.rate
	if secs >= MaxRetryAfter.Seconds() {
		return MaxRetryAfter
	}
	return time.Duration(math.Round(secs * float64(time.Second)))
}

// share is one replica's part of limit when n replicas serve: the rate and the burst divided
// (the burst rounded up, at least one token, so that a small limit still admits calls).
func share(limit Limit, n int) (float64, float64) {
	burst := max(limit.Burst, 1)
	return limit.PerSecond / float64(n), float64(max(int(math.Ceil(float64(burst)/float64(n))), 1))
}
