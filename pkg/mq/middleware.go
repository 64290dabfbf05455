package mq

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	plog "github.com/integrations-platform/integrations/pkg/log"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/metrics"
)

// middleware wraps a Handler, in the shape of Watermill's router middleware: what every handler
// of a route gets — its trace context, a per-route deadline, its duration, panic recovery — is
// written once, apart from the handler and from the rules that settle its Result. Consume wraps
// each handler in the port's chain (handlerChain).
type middleware func(Handler) Handler

// chain wraps h in mws, the first outermost.
func chain(h Handler, mws ...middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// handlerChain is what Consume runs for each delivery of a route: the duration outermost, so that
// it times the whole call and sees a panic as the recoverer's Result; then recovery, so that a
// panic anywhere below is a requeue; then the route's deadline; then the delivery's trace
// context, innermost, for the handler.
func (p *port) handlerChain(h Handler, top *topology, log *zap.Logger) Handler {
	return chain(h, timed(p.handlerSeconds, top.route), recoverer(log), deadline(top.handlerTimeout), traced)
}

// recoverer turns a handler's panic into the panicked Result: logged with its stack, counted
// Panicked, and the delivery returned to the broker as for the zero Result (rules.handle).
func recoverer(log *zap.Logger) middleware {
	return func(h Handler) Handler {
		return func(ctx context.Context, m *Message) (res Result) {
			defer func() {
				if p := recover(); p != nil {
					log.Error("mq handler panicked; requeueing", zap.String("message_id", m.ID),
						plog.Deliveries(m.Attempt), zap.String("panic", fmt.Sprint(p)),
						zap.ByteString("stack", debug.Stack()))
					res = Result{outcome: outcomePanicked}
				}
			}()
			return h(ctx, m)
		}
	}
}

// timed observes each handler call's duration in integrations_mq_handler_seconds, by route and
// result (ack, fail, reject, defer, none, panic).
func timed(hist *prometheus.HistogramVec, route string) middleware {
	return func(h Handler) Handler {
		return func(ctx context.Context, m *Message) (res Result) {
			start := time.Now()
			res = h(ctx, m)
			hist.WithLabelValues(route, res.kind()).Observe(time.Since(start).Seconds())
			return res
		}
	}
}

// deadline bounds a handler call with the route's Timeout: its context ends after d. A handler cut
// off returns what it returns (a Fail with the context's error is retried, as any Fail); the
// deadline is the handler's, not the consumer's, so the rules apply its Result as usual. 0: none.
func deadline(d time.Duration) middleware {
	if d <= 0 {
		return func(h Handler) Handler { return h }
	}
	return func(h Handler) Handler {
		return func(ctx context.Context, m *Message) Result {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return h(ctx, m)
		}
	}
}

// traced gives the handler a context carrying the delivery's trace context (trace.go), so that
// the spans it starts continue the publisher's trace. The port starts no span of its own: a
// handler knows what the message is about (an execution, an event) and names its span for it.
func traced(h Handler) Handler {
	return func(ctx context.Context, m *Message) Result {
		return h(extractTrace(ctx, m.Headers), m)
	}
}

// newHandlerSeconds is the integrations_mq_handler_seconds histogram vec, registered with reg when
// given (shared with a Broker that registered it first). Its series are made on first
// observation, so a process that consumes nothing shows none.
func newHandlerSeconds(reg prometheus.Registerer) (*prometheus.HistogramVec, error) {
	return registerShared(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "integrations_mq_handler_seconds",
		Help:    "Time a message port handler took, by route and result.",
		Buckets: metrics.LatencyBuckets(),
	}, []string{"route", "result"}))
}
