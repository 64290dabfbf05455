// Package ratelimit holds the gateway's rate limits per application (issue 11): a token bucket per
// application for invokes and another for reads, each replica holding its share of the limit —
// limit ÷ live replicas, counted from a heartbeat table — so that N replicas admit about the
// limit, not N times it, at no cost on accept (docs/decisions.md, "Rate limits (issue 11)").
package ratelimit

import (
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
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
	// RetryAfter is, when refused, when this replica's bucket has a token again.
	RetryAfter time.Duration
	// Limit is the application's whole limit (not this replica's share), for the message.
	Limit Limit
}

// Limiter holds the buckets of every application that called this replica. Their number is
// bounded by the catalog's applications (calls are counted after authentication), so buckets are
// never evicted.
type Limiter struct {
	limits   func(ctx context.Context, app string) (Limits, error)
	replicas func() int
	now      func() time.Time

	mu      sync.Mutex
	buckets map[bucketKey]*bucket
}

type bucketKey struct {
	app  string
	kind Kind
}

// bucket is one application's bucket of one kind, with the limit and replica count its rate was
// last set from, so that a change of either resizes it in place (keeping its tokens).
type bucket struct {
	lim      *rate.Limiter
	limit    Limit
	replicas int
}

// New returns a Limiter reading each application's limits with limits (cached by the caller: it
// is called on every call) and the number of live replicas with replicas (at least 1).
func New(limits func(ctx context.Context, app string) (Limits, error), replicas func() int) *Limiter {
	return &Limiter{limits: limits, replicas: replicas, now: time.Now, buckets: map[bucketKey]*bucket{}}
}

// Allow takes a token from the application's bucket of kind k, or says when to come back. An
// error is the limits' read failing.
func (l *Limiter) Allow(ctx context.Context, app string, k Kind) (Decision, error) {
	limits, err := l.limits(ctx, app)
	if err != nil {
		return Decision{}, err
	}
	limit := limits.Of(k)
	if limit.Unlimited() {
		return Decision{Allowed: true, Limit: limit}, nil
	}
	n := max(l.replicas(), 1)
	now := l.now()

	l.mu.Lock()
	key := bucketKey{app, k}
	b := l.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(share(limit, n)), limit: limit, replicas: n}
		l.buckets[key] = b
	} else if b.limit != limit || b.replicas != n {
		r, burst := share(limit, n)
		b.lim.SetLimitAt(now, r)
		b.lim.SetBurstAt(now, burst)
		b.limit, b.replicas = limit, n
	}
	lim := b.lim
	l.mu.Unlock()

	res := lim.ReserveN(now, 1)
	if !res.OK() { // cannot happen: every share's burst is at least 1
		return Decision{Limit: limit, RetryAfter: time.Second}, nil
	}
	if delay := res.DelayFrom(now); delay > 0 {
		res.CancelAt(now)
		return Decision{Limit: limit, RetryAfter: delay}, nil
	}
	return Decision{Allowed: true, Limit: limit}, nil
}

// share is one replica's part of limit when n replicas serve: the rate and the burst divided
// (the burst rounded up, at least one token, so that a small limit still admits calls).
func share(limit Limit, n int) (rate.Limit, int) {
	burst := max(limit.Burst, 1)
	return rate.Limit(limit.PerSecond / float64(n)), max(int(math.Ceil(float64(burst)/float64(n))), 1)
}
