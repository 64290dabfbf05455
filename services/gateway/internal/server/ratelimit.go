package server

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/apperr"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
)

// ReasonRateLimited is the ErrorInfo reason of a call refused by an application's rate limit;
// its metadata "limit" says which ("invoke" or "read").
const ReasonRateLimited = "RATE_LIMITED"

// RateLimitInterceptor counts every GatewayService call against its application's limits (issue
// 11): InvokeCapability, sync or async, against the invoke limit; every other call against the
// read limit — the reads proper (GetExecution, ListExecutions, GetEvent, ListEvents) and the
// management calls (CancelExecution, SetConsumer, RotateSigningSecret, RedeliverEvent,
// RedriveEvents), which are rare in normal use and so share the bucket; a method added later is
// limited as a read rather than not at all. A refusal is RESOURCE_EXHAUSTED with the bucket's
// delay in its RetryInfo (REST: 429 with Retry-After, whole seconds, at least 1). It runs after
// AuthInterceptor, whose application id it reads; health and reflection calls pass through.
//
// A call over the limit is held for hold (at most half its deadline) and tried once more before
// it is refused: a client that retries at once in a loop, ignoring Retry-After — the usual flood
// — then makes a call per hold per caller instead of as many as the gateway can refuse, whose
// cost (the transports', ~80 µs of CPU a refusal) fell on every application. A call whose token
// comes within the hold is admitted rather than refused. 0 refuses at once.
func RateLimitInterceptor(l *ratelimit.Limiter, hold time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		app := applicationID(ctx)
		if _, ok := info.Server.(*Server); !ok || app == "" {
			return handler(ctx, req)
		}
		kind := ratelimit.Read
		if info.FullMethod == gatewayv1.GatewayService_InvokeCapability_FullMethodName {
			kind = ratelimit.Invoke
		}
		d, err := l.Allow(ctx, app, kind)
		if err != nil {
			return nil, err
		}
		if !d.Allowed && hold > 0 && wait(ctx, hold) {
			if d, err = l.Allow(ctx, app, kind); err != nil {
				return nil, err
			}
		}
		if !d.Allowed {
			return nil, RateLimited(kind, d)
		}
		return handler(ctx, req)
	}
}

// wait waits for d, or half of what is left of ctx's deadline if that is less, and reports
// whether the call is still wanted.
func wait(ctx context.Context, d time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/2)
	}
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
	e := apperr.New(apperr.KindResourceExhausted, ReasonRateLimited,
		"%s rate limit of %s/s for this application exceeded, retry later", kind,
		strconv.FormatFloat(d.Limit.PerSecond, 'g', -1, 64)).With("limit", kind.String())
	e.RetryAfter = d.RetryAfter
	return e
}
