package adapter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/sdk/go/outcome"
)

// ErrAttemptGone is the context.Cause of Later work cancelled because the platform refused a
// lease renewal for good: the attempt is no longer current, the execution settled, or the
// credential or token is not accepted. Its outcome would be refused as well, so none is sent.
var ErrAttemptGone = errors.New("adapter: the attempt is no longer open for callbacks")

// ErrCancelled is the context.Cause of work stopped because the platform cancelled the
// execution (AdapterService.Cancel). The execution is settled, so no outcome is sent.
var ErrCancelled = errors.New("adapter: the execution was cancelled")

// deliverFloor is the least time a Later outcome is retried for, when the lease is about to end
// or already over: the platform sweeps an attempt only some grace after its lease, and an outcome
// that lands meanwhile is still taken (one that comes too late is refused as no longer
// applicable, which ends the delivery).
const deliverFloor = 10 * time.Second

// Callbacks lets Later work talk to the platform about its attempt. It is bound to one
// execution, attempt and callback token, and sends the adapter's credential on every call.
// Errors are gRPC status errors (wrapped), so status.Code tells a refusal from an outage.
type Callbacks struct {
	client      adapterv1.AdapterCallbackServiceClient
	credential  string
	executionID string
	attempt     int32
	token       string
	// inline marks Later work run within a sync call, where the platform refuses callbacks.
	inline bool
	// lease is the lease the automatic renewal asks for, in nanoseconds.
	lease atomic.Int64
	// granted is the lease the platform last granted, in nanoseconds (0: none yet). It may be
	// shorter than asked: the platform caps a lease at the capability's and at the deadline.
	granted atomic.Int64
	// leaseEnd is when the lease in force ends, in Unix nanoseconds: from Accepted, then from
	// each renewal's answer. The outcome is delivered until then.
	leaseEnd atomic.Int64
	// span is the background work's span (in the trace of the Execute call that accepted it):
	// every callback continues it, the outcome's delivery too, which runs on a context of its own.
	span trace.SpanContext
}

// ExecutionID is the execution the callbacks are for.
func (c *Callbacks) ExecutionID() string { return c.executionID }

// Attempt is the attempt the callbacks are for.
func (c *Callbacks) Attempt() int32 { return c.attempt }

// ReportProgress stores progress on the execution, where clients can read it. progress must be
// representable as JSON. Within a sync call it does nothing.
func (c *Callbacks) ReportProgress(ctx context.Context, progress map[string]any) error {
	if c.inline {
		return nil
	}
	st, err := toStruct(progress)
	if err != nil {
		return fmt.Errorf("report progress: %w", err)
	}
	_, err = c.client.ReportProgress(c.outgoing(ctx), &adapterv1.ReportProgressRequest{
		ExecutionId: c.executionID, Attempt: c.attempt, CallbackToken: c.token, Progress: st,
	})
	if err != nil {
		return fmt.Errorf("report progress: %w", err)
	}
	return nil
}

// RenewLease extends the attempt's lease to d from now (zero: the capability's default). The
// SDK already renews every third of the lease while the work runs; call this to change the
// lease, which the automatic renewal then keeps. Within a sync call it does nothing.
func (c *Callbacks) RenewLease(ctx context.Context, d time.Duration) error {
	if c.inline {
		return nil
	}
	if d > 0 {
		c.lease.Store(int64(d))
	}
	return c.renew(ctx, d)
}

func (c *Callbacks) renew(ctx context.Context, d time.Duration) error {
	// Before the call: the platform grants the lease from its now, which is no earlier, so a lease
	// end counted from here on this host's clock is no later than the platform's.
	asked := time.Now()
	resp, err := c.client.RenewLease(c.outgoing(ctx), &adapterv1.RenewLeaseRequest{
		ExecutionId: c.executionID, Attempt: c.attempt, CallbackToken: c.token, Lease: durationpb.New(d),
	})
	if err != nil {
		return fmt.Errorf("renew lease: %w", err)
	}
	// The granted lease as a duration, measured by the platform; the expiry time is on the
	// platform's clock, which this host's may not agree with (an older platform sends only that).
	switch {
	case resp.GetLease() != nil:
		granted := resp.GetLease().AsDuration()
		c.granted.Store(int64(granted))
		c.leaseEnd.Store(asked.Add(granted).UnixNano())
	case resp.GetLeaseExpireTime() != nil:
		c.granted.Store(int64(time.Until(resp.GetLeaseExpireTime().AsTime())))
		c.leaseEnd.Store(resp.GetLeaseExpireTime().AsTime().UnixNano())
	}
	return nil
}

// minRenewEvery bounds how often the automatic renewal runs, as a granted lease shrinks towards
// the deadline.
const minRenewEvery = 10 * time.Millisecond

// renewEvery is the time to the next automatic renewal: a third of the lease asked for, or of the
// one granted if that is shorter.
func (c *Callbacks) renewEvery() time.Duration {
	lease := time.Duration(c.lease.Load())
	if granted := time.Duration(c.granted.Load()); granted > 0 && granted < lease {
		lease = granted
	}
	return max(lease/3, minRenewEvery)
}

// outgoing is ctx for a callback: it continues the work's trace (traceparent, W3C) and carries
// the adapter's credential.
func (c *Callbacks) outgoing(ctx context.Context) context.Context {
	if c.span.IsValid() && !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, c.span)
	}
	ctx = withTraceparent(ctx)
	if c.credential == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.credential)
}

// background runs Later work to its end and delivers its outcome. It owns one unit of the
// Server's work count. ctx is the work's own, cancellable with a cause: ErrAttemptGone (by the
// renewal loop) or ErrCancelled (by Cancel).
func (s *Server) background(ctx context.Context, cancel context.CancelCauseFunc, log *zap.Logger, deadline time.Time, cb *Callbacks, fn func(context.Context, *Callbacks) Result) {
	defer s.endWork()
	// The work's span runs from the Accepted answer to the outcome's delivery: the platform's
	// attempt waits on it, and the callbacks it makes are its children.
	ctx, span := startWork(ctx, cb.executionID, cb.attempt)
	defer span.End()
	cb.span = span.SpanContext()
	if !deadline.IsZero() {
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, deadline)
		defer cancelDeadline()
	}

	renewCtx, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		s.renewLoop(renewCtx, log, cb, cancel)
	}()
	res := s.run(ctx, log, func(ctx context.Context) Result { return fn(ctx, cb) })
	// Renewal stops before the outcome goes out, so that no renewal follows the completion.
	stopRenewing()
	<-renewed

	if res.kind == kindLater {
		res = invalidResult(log, "Later work returned Later")
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrAttemptGone):
		log.Warn("background work abandoned: the attempt is no longer open")
		return
	case errors.Is(cause, ErrCancelled):
		log.Info("background work stopped: the execution was cancelled")
		return
	}
	s.deliver(ctx, log, cb, res)
}

// renewLoop renews the lease every third of it (of the lease granted, if shorter than asked),
// so that two renewals in a row may fail before it expires. A refusal (as opposed to an outage)
// means the attempt is over: the work is cancelled with ErrAttemptGone.
//
// The first renewal goes out at once: the platform may grant less than the lease asked for in
// Accepted (at most the capability's lease), and the SDK learns the granted lease only from a
// renewal's answer.
func (s *Server) renewLoop(ctx context.Context, log *zap.Logger, cb *Callbacks, cancelWork context.CancelCauseFunc) {
	for first := true; ; first = false {
		every := cb.renewEvery()
		if first {
			every = minRenewEvery
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		lease := time.Duration(cb.lease.Load())
		rctx, cancel := context.WithTimeout(ctx, lease/3)
		err := cb.renew(rctx, lease)
		cancel()
		switch {
		case err == nil:
			log.Debug("lease renewed", zap.Duration("lease", lease))
		case ctx.Err() != nil:
			return
		case attemptGone(err):
			log.Warn("lease renewal refused; cancelling background work", zap.String("code", status.Code(err).String()), zap.Error(err))
			cancelWork(ErrAttemptGone)
			return
		default:
			log.Warn("lease renewal failed", zap.String("code", status.Code(err).String()), zap.Error(err))
		}
	}
}

// attemptGone tells the callback service's refusals (invalid, foreign, no longer applicable,
// sync: the adapter protocol's callback refusals) from failures that a later call may not meet.
func attemptGone(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied,
		codes.NotFound, codes.FailedPrecondition, codes.Aborted:
		return true
	}
	return false
}

// deliver sends a Later outcome through Complete with the platform's one outcome reporter
// (sdk/go/outcome): retried with backoff on every retryable answer (UNAVAILABLE, INTERNAL, ...) until
// the attempt's lease ends (at least deliverFloor from now); an attempt that has moved on ends it
// without an error; a result the platform refuses (e.g. NaN in it) is delivered instead as a
// permanent protocol failure, so the attempt ends now rather than at its lease. It runs on its own
// context: work cancelled by shutdown still reports how it ended, until shutdownGrace after
// Shutdown's ctx ended. It also gives up when the work is cancelled (Cancel) between two tries.
func (s *Server) deliver(work context.Context, log *zap.Logger, cb *Callbacks, res Result) {
	req := &adapterv1.CompleteRequest{ExecutionId: cb.executionID, Attempt: cb.attempt, CallbackToken: cb.token}
	if res.kind == kindCompleted {
		st, err := toStruct(res.result)
		if err != nil {
			log.Error("adapter result is not representable as JSON", zap.Error(err))
			res = Fail(ClassPermanent, CodeInvalidResult, "adapter result is not representable as JSON", false)
		} else {
			req.Outcome = &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{Result: st}}
		}
	}
	if res.kind == kindFailed {
		req.Outcome = &adapterv1.CompleteRequest_Failed{Failed: toFailed(res)}
	}
	until := time.Unix(0, cb.leaseEnd.Load())
	if floor := time.Now().Add(deliverFloor); until.Before(floor) {
		until = floor
	}
	for {
		name := "succeeded"
		if _, failed := req.Outcome.(*adapterv1.CompleteRequest_Failed); failed {
			name = "failed"
		}
		tries := 0
		v, err := outcome.Do(s.delivering, outcome.Options{Until: until, Log: log, What: "complete", Classify: classifyDelivery},
			func(ctx context.Context) error {
				if errors.Is(context.Cause(work), ErrCancelled) {
					return ErrCancelled
				}
				tries++
				_, err := cb.client.Complete(cb.outgoing(ctx), req)
				return err
			})
		switch {
		case errors.Is(context.Cause(work), ErrCancelled):
			log.Info("outcome not delivered: the execution was cancelled", zap.String("outcome", name), zap.Int("tries", tries))
		case v == outcome.Recorded:
			log.Info("outcome delivered", zap.String("outcome", name), zap.Int("tries", tries))
		case s.delivering.Err() != nil:
			// Shutdown's grace is over: the platform's lease decides the attempt, as for an adapter
			// that died.
			log.Error("outcome not delivered: the adapter shut down first; the attempt's lease decides",
				zap.String("outcome", name), zap.Int("tries", tries), zap.String("code", status.Code(err).String()))
		case v == outcome.MovedOn:
			log.Info("outcome not applied: the attempt had already ended", zap.String("outcome", name), zap.Int("tries", tries))
		case v == outcome.ResultRefused && name == "succeeded":
			log.Warn("adapter result refused by the platform; delivering a protocol failure", zap.String("code", status.Code(err).String()))
			req.Outcome = &adapterv1.CompleteRequest_Failed{Failed: toFailed(Fail(ClassProtocol, CodeInvalidResult,
				"adapter result refused: "+truncate(status.Convert(err).Message(), 512), false))}
			continue
		default:
			log.Error("outcome not delivered", zap.String("outcome", name), zap.Int("tries", tries),
				zap.Stringer("verdict", v), zap.String("code", status.Code(err).String()), zap.Error(err))
		}
		return
	}
}

// classifyDelivery is outcome.Classify, with the work's cancellation ending the delivery.
func classifyDelivery(err error) outcome.Class {
	if errors.Is(err, ErrCancelled) {
		return outcome.ClassMovedOn
	}
	return outcome.Classify(err)
}
