package server

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/apperr"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// MaxHeldPerApplication bounds the calls of one application held at once before their refusal
// (see RateGate.Interceptor): past it, a call over the limit is refused at once.
const MaxHeldPerApplication = 64

// RateGate applies the rate limits: Interceptor's on gRPC calls, and Precheck's on REST requests
// before they are proxied. The two share the count of calls held per application.
type RateGate struct {
	l       *ratelimit.Limiter
	hold    time.Duration
	maxHeld int
	held    sync.Map // application id → *atomic.Int64, the calls held now
}

// NewRateGate returns a gate on l holding refused calls for hold, at most maxHeld per
// application at once (see Interceptor).
func NewRateGate(l *ratelimit.Limiter, hold time.Duration, maxHeld int) *RateGate {
	return &RateGate{l: l, hold: hold, maxHeld: maxHeld}
}

// Interceptor counts every GatewayService call against its application's limits (issue
// 11): InvokeCapability, sync or async, against the invoke limit; every other call against the
// read limit — the reads proper (GetExecution, ListExecutions, GetEvent, ListEvents) and the
// management calls (CancelExecution, SetConsumer, RotateSigningSecret, RedeliverEvent,
// RedriveEvents), which are rare in normal use and so share the bucket; a method added later is
// limited as a read rather than not at all. A refusal is RESOURCE_EXHAUSTED with the bucket's
// delay in its RetryInfo (REST: 429 with Retry-After, whole seconds, at least 1). It runs after
// AuthInterceptor, whose application id it reads; health and reflection calls pass through.
//
// hold (at most half the call's deadline) is how long a call may wait on its limit. A call whose
// token comes within it reserves that token and waits exactly until it — so traffic at the limit
// is paced, not refused, and the calls waiting are at most rate × hold. A call beyond it is held
// for hold and then refused: a client that retries at once in a loop, ignoring Retry-After — the
// usual flood — then makes a call per hold per caller instead of as many as the gateway can
// refuse, whose cost (the transports', ~80 µs of CPU a refusal) fell on every application. Each
// held call keeps its goroutine and request, so at most maxHeld of an application's are held at
// once; the others are refused at once. 0 refuses at once.
func (g *RateGate) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		app := applicationID(ctx)
		if _, ok := info.Server.(*Server); !ok || app == "" {
			return handler(ctx, req)
		}
		kind := ratelimit.Read
		if info.FullMethod == gatewayv1.GatewayService_InvokeCapability_FullMethodName {
			kind = ratelimit.Invoke
		}
		hold := holdFor(ctx, g.hold)
		d, err := g.l.Take(ctx, app, kind, hold)
		if err != nil {
			return nil, err
		}
		if d.Allowed {
			if !wait(ctx, d.Wait) {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return handler(ctx, req)
		}
		return nil, g.refuse(ctx, app, kind, hold, d)
	}
}

// refuse holds a refused call for hold (unless maxHeld of its application's are held already)
// and returns its refusal.
func (g *RateGate) refuse(ctx context.Context, app string, kind ratelimit.Kind, hold time.Duration, d ratelimit.Decision) error {
	if hold > 0 {
		v, _ := g.held.LoadOrStore(app, new(atomic.Int64))
		n := v.(*atomic.Int64)
		if n.Add(1) <= int64(g.maxHeld) {
			start := time.Now()
			wait(ctx, hold)
			d.RetryAfter = max(d.RetryAfter-time.Since(start), time.Millisecond)
		}
		n.Add(-1)
	}
	return RateLimited(kind, d)
}

// Precheck returns the REST server's check of a request before it is proxied to the gRPC server:
// a request whose key is valid and whose application's bucket would refuse it is refused there —
// held and answered as the gRPC server would, without the hop, whose cost (the proxy's client
// call, the gRPC server's, the error's rendering back) was most of what a flood of REST calls
// cost the gateway. It takes no token: a request it lets through meets the interceptor's Take as
// any other. A token it cannot authenticate, or limits it cannot read, it lets through, for the
// gRPC server to refuse in its own words.
//
// A request whose source address or key id failed authentication too often (fails, nil: not
// limited) is refused first, without its token being verified: the interceptor would refuse it
// the same, after the precheck's lookup the limit exists to spare.
func (g *RateGate) Precheck(st *store.Store, fails *ratelimit.Failures) func(ctx context.Context, token string, invoke bool) error {
	return func(ctx context.Context, token string, invoke bool) error {
		if err := fails.Check(ratelimit.SourceOf(ctx), token); err != nil {
			return err
		}
		app, err := authenticate(ctx, st, token)
		if err != nil {
			return nil
		}
		kind := ratelimit.Read
		if invoke {
			kind = ratelimit.Invoke
		}
		hold := holdFor(ctx, g.hold)
		d, err := g.l.Peek(ctx, app, kind, hold)
		if err != nil || d.Allowed {
			return nil
		}
		return g.refuse(ctx, app, kind, hold, d)
	}
}

// holdFor is d, or half of what is left of ctx's deadline if that is less.
func holdFor(ctx context.Context, d time.Duration) time.Duration {
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/2)
	}
	return max(d, 0)
}

// wait waits for d and reports whether the call is still wanted.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// RateLimited is the refusal of a call over its application's limit: it names the limit (the
// application's whole limit, whatever this replica's share) and advises the bucket's delay.
func RateLimited(kind ratelimit.Kind, d ratelimit.Decision) *apperr.Error {
	e := apperr.New(apperr.KindResourceExhausted, errorsv1.ErrorReason_RATE_LIMITED.String(),
		"%s rate limit of %s/s for this application exceeded, retry later", kind,
		strconv.FormatFloat(d.Limit.PerSecond, 'g', -1, 64)).With("limit", kind.String())
	e.RetryAfter = d.RetryAfter
	return e
}
