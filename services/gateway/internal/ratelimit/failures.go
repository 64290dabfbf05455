package ratelimit

import (
	"cmp"
	"context"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/peer"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/apperr"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
)

// Failures limits failed authentications (issue 23) — of the gRPC and REST APIs, the console's
// sign-in and the operator endpoints, which all authenticate through Guard — per source address
// and per presented key id: a token bucket of burst failures refilled over window, each
// replica holding its share (as Limiter's buckets: rate ÷ replicas, ⌈burst ÷ replicas⌉), so that
// a flood spread over the replicas gains nothing. See docs/decisions.md, "Failed authentications
// are limited (issue 23)".
//
// An attempt holds one of its source's tokens while it is verified: a failure keeps it, a
// success gives it back. So concurrent attempts never verify more guesses than the source has
// tokens left; an attempt finding every token held by attempts in flight waits for one to
// settle (a busy client with the right key waits microseconds: its attempts give their tokens
// back as they succeed).
//
// A key id (of a generated key, pkg/apikey) over its limit refuses, without verifying, only
// attempts from sources that failed themselves lately: a flood of wrong secrets for one key id
// from many addresses cannot lock out its owner, whose addresses have not failed.
type Failures struct {
	limit    Limit
	replicas func() int
	now      func() time.Time
	log      *zap.Logger
	sources  table[netip.Prefix]
	keys     table[string]
}

// NewFailures limits each source address and key id to burst failed authentications at once,
// refilled at burst per window, across replicas (replicas counts the live ones, at least 1).
func NewFailures(burst int, window time.Duration, replicas func() int, log *zap.Logger) *Failures {
	log = cmp.Or(log, zap.NewNop())
	return &Failures{
		limit:    Limit{PerSecond: float64(burst) / window.Seconds(), Burst: burst},
		replicas: replicas, now: time.Now, log: log,
		sources: newTable[netip.Prefix](), keys: newTable[string](),
	}
}

// Guard runs auth, the verification of token presented from src, unless src or the token's key
// id failed too often: then it returns the refusal (RESOURCE_EXHAUSTED, reason
// TOO_MANY_AUTH_FAILURES with metadata "limit": "source" or "key", RetryAfter: when a token is
// back) without calling auth. auth's error is a failure when it is apperr.KindUnauthenticated;
// any other error (Postgres unreachable, a token right but for another use) counts as nothing. A
// nil Failures runs auth.
func (f *Failures) Guard(ctx context.Context, src netip.Addr, token string, auth func() error) error {
	if f == nil {
		return auth()
	}
	n := max(f.replicas(), 1)
	srcKey := sourceKey(src)
	s, refusal := f.reserveSource(ctx, srcKey, n)
	if refusal != nil {
		return refusal
	}
	var k *bucket
	if id := keyID(token); id != "" {
		var keyRefusal *apperr.Error
		k, keyRefusal = f.reserveKey(id, n, s.failedBefore)
		if keyRefusal != nil {
			settle(s.b, false)
			return keyRefusal
		}
	}
	err := auth()
	failed := false
	if e, ok := apperr.As(err); ok && e.Kind == apperr.KindUnauthenticated {
		failed = true
	}
	if settle(s.b, failed) && failed {
		f.log.Warn("authentication failures limited: source address", zap.String("source", srcKey.String()))
	}
	if k != nil && settle(k, failed) && failed {
		f.log.Warn("authentication failures limited: key id", zap.String("key_id", keyID(token)))
	}
	return err
}

// Check is the refusal Guard would answer now for token from src, or nil, with nothing taken: for
// the REST server's precheck, which must not verify a token its source may not try.
func (f *Failures) Check(src netip.Addr, token string) error {
	if f == nil {
		return nil
	}
	n := max(f.replicas(), 1)
	now := f.now()
	failedBefore := false
	if b := f.sources.lookup(sourceKey(src)); b != nil {
		d, dirty := peek(b, now, f.limit, n)
		if !d.Allowed {
			return authLimited("source", d.RetryAfter)
		}
		failedBefore = dirty
	}
	if id := keyID(token); id != "" && failedBefore {
		if b := f.keys.lookup(id); b != nil {
			if d, _ := peek(b, now, f.limit, n); !d.Allowed {
				return authLimited("key", d.RetryAfter)
			}
		}
	}
	return nil
}

// reservation is a token held by an attempt in flight.
type reservation struct {
	b *bucket
	// failedBefore: the bucket had failures not yet refilled before this attempt (attempts in
	// flight aside).
	failedBefore bool
}

// reserveSource takes a token of src's bucket for an attempt, waiting while the only tokens left
// are held by attempts in flight, or returns the refusal.
func (f *Failures) reserveSource(ctx context.Context, src netip.Prefix, n int) (reservation, *apperr.Error) {
	for {
		b := f.sources.get(src, f.now)
		b.mu.Lock()
		if b.dropped { // swept between the lookup and the lock: its successor
			b.mu.Unlock()
			continue
		}
		d := b.take(f.now(), f.limit, n, 0)
		if d.Allowed {
			r := reservation{b: b, failedBefore: b.tokens+1+float64(b.held) < b.burst-1e-9}
			b.held++
			b.mu.Unlock()
			return r, nil
		}
		if b.tokens+float64(b.held) < 1-1e-9 { // even if every attempt in flight succeeds
			b.mu.Unlock()
			return reservation{}, authLimited("source", d.RetryAfter)
		}
		if b.settled == nil {
			b.settled = make(chan struct{})
		}
		ch := b.settled
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return reservation{}, authLimited("source", d.RetryAfter)
		}
	}
}

// reserveKey takes a token of the key id's bucket, if it has one free. Without one, an attempt
// from a source that failed lately is refused; one from a source that did not goes on, holding
// no key token (nil): it is verified, and its failure will count against its source.
func (f *Failures) reserveKey(id string, n int, sourceFailed bool) (*bucket, *apperr.Error) {
	for {
		b := f.keys.get(id, f.now)
		b.mu.Lock()
		if b.dropped {
			b.mu.Unlock()
			continue
		}
		d := b.take(f.now(), f.limit, n, 0)
		if d.Allowed {
			b.held++
			b.mu.Unlock()
			return b, nil
		}
		b.mu.Unlock()
		if sourceFailed {
			return nil, authLimited("key", d.RetryAfter)
		}
		return nil, nil
	}
}

// settle ends an attempt holding a token of b: a failure keeps it, anything else gives it back.
// It reports whether the bucket is now empty (this failure reached the limit).
func settle(b *bucket, failed bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held--
	if !failed {
		b.tokens = min(b.burst, b.tokens+1)
	}
	if b.settled != nil {
		close(b.settled)
		b.settled = nil
	}
	return b.tokens+float64(b.held) < 1-1e-9
}

// peek is the decision an attempt's reservation would get from b at now, with nothing taken, and
// whether b holds failures not yet refilled.
func peek(b *bucket, now time.Time, limit Limit, n int) (Decision, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped {
		return Decision{Allowed: true}, false
	}
	probe := b.state
	d := probe.take(now, limit, n, 0)
	level := probe.tokens + float64(b.held)
	if d.Allowed {
		level++
	}
	return d, level < probe.burst-1e-9
}

// authLimited is the refusal of an attempt whose source ("source") or key id ("key") failed too
// often.
func authLimited(limit string, retryAfter time.Duration) *apperr.Error {
	msg := "too many failed authentications from this address, retry later"
	if limit == "key" {
		msg = "too many failed authentications with this API key's id from addresses that failed, retry later"
	}
	e := apperr.New(apperr.KindResourceExhausted, errorsv1.ErrorReason_TOO_MANY_AUTH_FAILURES.String(), "%s", msg).With("limit", limit)
	e.RetryAfter = max(retryAfter, time.Millisecond)
	return e
}

// sourceKey is the bucket an address counts against: an IPv4 address alone, an IPv6 address
// with its /64 (one host usually holds a whole /64, so counting addresses would give it 2^64
// budgets). An invalid address (a caller with no TCP peer: in-process, a pipe) counts against one
// shared bucket.
func sourceKey(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return netip.Prefix{}
	case a.Is4():
		return netip.PrefixFrom(a, 32)
	default:
		p, _ := a.WithZone("").Prefix(64)
		return p
	}
}

// keyID is the public key id of a well-formed generated key, or "".
func keyID(token string) string {
	k, err := apikey.Parse(token)
	if err != nil {
		return ""
	}
	return k.ID
}

// SourceOf is the source address of a call: its TCP peer (never a header a client sets). The REST
// server gives its in-process calls the HTTP connection's peer (WithSource).
func SourceOf(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		return tcp.AddrPort().Addr().Unmap()
	}
	return AddrOf(p.Addr.String())
}

// AddrOf is the address of an "ip:port" (an http.Request's RemoteAddr), or the invalid address.
func AddrOf(remoteAddr string) netip.Addr {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// WithSource is ctx carrying remoteAddr (an http.Request's RemoteAddr) as its peer, for a call the
// REST server makes in process: SourceOf then reads it as a gRPC call's.
func WithSource(ctx context.Context, remoteAddr string) context.Context {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return ctx
	}
	return peer.NewContext(ctx, &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap)})
}

// SourceOfRequest is the source address of an HTTP request: its connection's peer.
func SourceOfRequest(r *http.Request) netip.Addr {
	if a := SourceOf(r.Context()); a.IsValid() {
		return a
	}
	return AddrOf(r.RemoteAddr)
}

// RetryAfterSeconds is d as a Retry-After header's value: whole seconds, rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	return strconv.Itoa(max(int(math.Ceil(d.Seconds())), 1))
}
