// Package attempt is the execution-consumer's handler: for each dispatch message, defer it if it
// arrived before its due time, start the attempt (or skip a duplicate), call the adapter, and hand
// the outcome to the settlement service — a success or final failure settles; a retryable failure
// schedules the next attempt.
package attempt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/settle"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/sdk/go/outcome"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

// Handler runs attempts.
type Handler struct {
	store      *store.Store
	adapters   *adaptercall.Pool
	settlement settlementv1.SettlementServiceClient
	scale      func(time.Duration) time.Duration
	log        *zap.Logger
	// nudge wakes the dispatcher after a dispatch record was written (see unreachable).
	nudge func()
}

// New returns a Handler.
func New(st *store.Store, adapters *adaptercall.Pool, settlement settlementv1.SettlementServiceClient,
	scale func(time.Duration) time.Duration, log *zap.Logger) *Handler {
	return &Handler{store: st, adapters: adapters, settlement: settlement, scale: scale, log: log, nudge: func() {}}
}

// WithNudge sets what wakes the dispatcher after the handler wrote a dispatch record (a hint: a
// lost nudge only waits for the dispatcher's next scheduled pass).
func (h *Handler) WithNudge(nudge func()) *Handler {
	if nudge != nil {
		h.nudge = nudge
	}
	return h
}

// Handle is the mq.Handler of the executions route.
func (h *Handler) Handle(ctx context.Context, m *mq.Message) mq.Result {
	var d queuev1.ExecutionDispatch
	if err := proto.Unmarshal(m.Body, &d); err != nil || d.GetExecutionId() == "" || d.GetAttempt() < 1 {
		return mq.Reject(fmt.Errorf("malformed dispatch message %s", m.ID))
	}
	logger := h.log.With(log.ExecutionID(d.GetExecutionId()), log.Attempt(d.GetAttempt()))
	// The attempt's span continues the dispatch's trace (the message's headers, through the
	// port); the adapter call and the outcome's report are its children, over gRPC.
	ctx, span := telemetry.Start(ctx, "attempt", trace.SpanKindConsumer,
		telemetry.ExecutionID(d.GetExecutionId()), telemetry.Attempt(d.GetAttempt()))
	defer span.End()
	token, tokenHash, err := secret.NewToken("cbt_")
	if err != nil {
		return mq.Fail(err)
	}
	// The due time is the database's, and AttemptStart compares it with the database's now(): the
	// consumer's clock plays no part in whether the dispatch is early.
	var due time.Time
	if d.GetDueTime() != nil {
		due = d.GetDueTime().AsTime()
	}
	started, err := h.store.AttemptStart(ctx, d.GetExecutionId(), d.GetAttempt(), tokenHash, h.scale, due)
	var early *store.EarlyError
	if errors.As(err, &early) {
		return h.early(logger, early.By)
	}
	var past *store.PastDeadlineError
	if errors.As(err, &past) {
		return h.pastDeadline(ctx, logger, d.GetExecutionId(), d.GetAttempt(), past.Class)
	}
	if errors.Is(err, store.ErrNotStartable) {
		logger.Info("dispatch skipped: attempt already started or execution moved on")
		return mq.Ack()
	}
	if err != nil {
		return mq.Fail(err)
	}
	logger.Info("attempt started", zap.String("capability", started.Capability))
	queueWaitSeconds.Observe(started.Overdue.Seconds())

	payload, err := execution.Struct(started.Payload)
	if err != nil {
		return mq.Fail(fmt.Errorf("decode payload: %w", err))
	}
	// Bounded by what the database measured the lease and deadline to leave, not by their times
	// read on this host's clock.
	callCtx, cancel := context.WithDeadline(ctx, started.LocalCallDeadline())
	callStart := time.Now()
	out := h.adapters.Execute(callCtx, adaptercall.Adapter{ID: started.AdapterID, Endpoint: started.AdapterEndpoint}, &adapterv1.ExecuteRequest{
		ExecutionId: started.ExecutionID, Attempt: started.Attempt, Capability: started.Capability,
		Payload: payload, DeadlineTime: timestamppb.New(started.Deadline), DeadlineIn: durationpb.New(time.Until(started.LocalDeadline())), CallbackToken: token,
		Mode: execution.ModeToProto(started.Mode),
	})
	cancel()
	adapterCallSeconds.WithLabelValues(callOutcome(out)).Observe(time.Since(callStart).Seconds())
	if out.Replayed {
		// Not a configuration fault: this call's token was used by someone before it arrived.
		logger.Error("possible attack: the adapter saw this call's platform token used before; attempt spent",
			zap.String("adapter_id", started.AdapterID), zap.Error(out.Cause))
	}
	if out.MalformedRefusal != "" {
		// The adapter meant to refuse the platform's token and got the marker wrong: its author must
		// hear of it (docs/adapter-protocol.md, "The refusal marker").
		logger.Warn("adapter answered a malformed token-refusal marker", zap.String("adapter_id", started.AdapterID),
			zap.String("problem", out.MalformedRefusal), zap.Bool("attempt_spent", !out.NotSent))
	}
	if out.NotSent {
		return h.unreachable(ctx, logger, started, out)
	}
	if ctx.Err() != nil && out.Kind == execution.OutcomeFailed {
		// Our own shutdown cut the call short: that is not the adapter failing. The attempt stays
		// running and its lease decides what follows; redelivering the message could not start
		// it again.
		logger.Info("attempt interrupted by shutdown; its lease decides")
		return mq.Ack()
	}
	// An outcome in hand is recorded even while shutting down: losing it would make the work run
	// again after the lease expires.
	if err := h.record(context.WithoutCancel(ctx), logger, started, out); err != nil {
		// The attempt stays running; its lease expiry decides what follows. The message is done:
		// redelivering it could not start the attempt again.
		logger.Error("attempt outcome not recorded", zap.Error(err))
	}
	return mq.Ack()
}

// Delays of a dispatch rescheduled because the adapter was unreachable: a quarter of how long the
// execution has waited for the attempt, so that a long outage is polled less often, within these
// bounds.
const (
	unreachableMinDelay = time.Second
	unreachableMaxDelay = 30 * time.Second
)

// unreachable handles an attempt whose adapter could not be reached, nothing of the request having
// gone out: the start is undone (the attempt is not spent) and, in the same statement, the attempt
// is scheduled again as a dispatch record due after a delay, until the execution's deadline; the
// message is then acked. The retry lives in Postgres, not in a deferred copy of the message: a
// copy cannot be published once the subscription died (broker connection closed, or drain grace
// over), and a redelivered message would meanwhile have found the attempt running and been
// dropped — the execution left pending with neither record nor message until its deadline. At the
// deadline there is no time for another try: the failure is reported as any other, and settles
// the execution failed with retry_exhausted.budget.
func (h *Handler) unreachable(ctx context.Context, logger *zap.Logger, started *store.Started, out execution.Outcome) mq.Result {
	// A refused token is a configuration fault (signing key, public keys or adapter id disagree),
	// not an outage: said at error level on each branch, with what became of the attempt.
	refused := func(msg string, fields ...zap.Field) {
		if out.Refused {
			logger.Error("adapter refused the platform's token; "+msg,
				append(fields, zap.String("adapter_id", started.AdapterID), zap.Error(out.Cause))...)
		}
	}
	left := time.Until(started.LocalDeadline())
	if left <= unreachableMinDelay {
		refused("at the deadline: attempt spent, failure reported")
		logger.Info("adapter unreachable at the deadline; reporting the failure")
		if err := h.record(context.WithoutCancel(ctx), logger, started, out); err != nil {
			logger.Error("attempt outcome not recorded", zap.Error(err))
		}
		return mq.Ack()
	}
	// How long the execution has waited for this attempt, as the database measured it at the
	// start, plus the time since on this host's monotonic clock. (The dispatch's own due time is
	// no measure of an outage's length: each reschedule writes a new one.) For a retry that
	// includes the retry's backoff, so its first reschedule may wait longer than the minimum.
	waited := max(started.Overdue, started.PendingFor) + time.Since(started.Measured)
	delay := min(max(waited/4, unreachableMinDelay), unreachableMaxDelay, left)
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordFloor)
	defer cancel()
	undone, err := outcome.Do(uctx, outcome.Options{Log: logger, What: "attempt_undo", Classify: classifyDB},
		func(ctx context.Context) error {
			ok, err := h.store.AttemptUndo(ctx, started.ExecutionID, started.Attempt, delay)
			if err == nil && !ok {
				return errMovedOn
			}
			return err
		})
	switch {
	case err != nil:
		// The attempt stays running: its lease decides, as for any attempt whose outcome is lost.
		refused("start not undone: the attempt's lease decides")
		logger.Error("start of an attempt that sent nothing not undone", zap.Error(err))
		return mq.Ack()
	case undone == outcome.MovedOn:
		// The execution moved on — or an earlier try of the undo committed but its answer was
		// lost, in which case its dispatch record is written.
		refused("the execution moved on: dispatch dropped")
		logger.Info("dispatch dropped: the execution moved on while the adapter was unreachable")
		return mq.Ack()
	}
	refused("attempt not spent, dispatch rescheduled", zap.Duration("delay", delay))
	h.nudge()
	logger.Info("adapter unreachable, nothing sent; attempt not spent, dispatch rescheduled",
		zap.Duration("delay", delay), zap.String("code", out.Failure.Code))
	return mq.Ack()
}

// errMovedOn is how AttemptUndo's "not the running attempt" reaches the reporter.
var errMovedOn = errors.New("attempt no longer running")

// early handles a dispatch that arrived before its due time by the route's delay tolerance or
// more, by the database's clock (one early by less starts: see store.WithEarlyTolerance): the
// dispatcher published it into the largest delay level not past that time (plus the tolerance),
// so it is early by the rest. It is deferred for what is left — through the route's shorter delay levels, and the last
// stretch below the smallest level held in the port's worker — without starting the attempt and
// without spending a port-level attempt. (A dispatch whose attempt can no longer start, e.g.
// cancelled while it waited, never comes here: AttemptStart answers ErrNotStartable for it, and it
// is dropped now rather than carried to its due time.)
func (h *Handler) early(logger *zap.Logger, early time.Duration) mq.Result {
	logger.Debug("dispatch arrived early; deferred", zap.Duration("early", early))
	return mq.Defer(early)
}

// settleTimeout bounds the settlement of an execution whose deadline passed before its attempt.
const settleTimeout = 10 * time.Second

// pastDeadline handles a dispatch whose execution's deadline has passed before attempt n could
// start: no adapter is called (it could not finish in time, and its work would be discarded), and
// the execution is settled failed with retry_exhausted.budget now, through the settlement
// service's Settle from PENDING at attempt n-1 — what its sweeper does for a stranded execution,
// without waiting for the sweeper's grace. A settlement that lost (the execution settled or moved
// on meanwhile) is done; one that could not be made is retried through the port (mq.Fail), and
// past the port's budget the sweeper still settles it (no dispatch record waits).
func (h *Handler) pastDeadline(ctx context.Context, logger *zap.Logger, id string, n int32, class string) mq.Result {
	class = cmp.Or(class, execution.ClassTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_, err := h.settlement.Settle(sctx, &settlementv1.SettleRequest{
		ExecutionId: id, Attempt: n - 1,
		FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING,
		Status:     executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED,
		Failure: &executionv1.Failure{Class: class, Reason: execution.ReasonBudget,
			Message: fmt.Sprintf("the deadline passed before attempt %d could start", n)},
	})
	switch status.Code(err) {
	case codes.OK:
		logger.Info("deadline passed before the attempt; execution settled failed", zap.String("reason", execution.ReasonBudget))
		return mq.Ack()
	case codes.FailedPrecondition, codes.Aborted, codes.NotFound:
		logger.Info("deadline passed before the attempt; the execution had moved on", zap.Error(err))
		return mq.Ack()
	}
	return mq.Fail(fmt.Errorf("settle execution past its deadline: %w", err))
}

// recordFloor is the least time an outcome is retried for when the adapter answered at (or past)
// the lease's end: the sweeper waits its grace after the lease before it ends the attempt, and
// an outcome that lands in between is still taken.
const recordFloor = 10 * time.Second

// record hands the adapter's answer to the settlement service (or, for Accepted, stores the
// lease), through the one outcome reporter: retried until the attempt's lease (at least
// recordFloor from now), a refused result reported as a protocol failure, and an attempt that
// moved on meanwhile left as it is.
func (h *Handler) record(ctx context.Context, logger *zap.Logger, started *store.Started, out execution.Outcome) error {
	until := started.LocalLeaseEnd()
	if floor := time.Now().Add(recordFloor); until.Before(floor) {
		until = floor
	}
	a := settle.Attempt{ExecutionID: started.ExecutionID, Attempt: started.Attempt, Until: until}
	switch out.Kind {
	case execution.OutcomeCompleted, execution.OutcomeFailed:
		if out.Kind == execution.OutcomeFailed {
			logger.Info("attempt failed", zap.String("class", out.Failure.Class), zap.Bool("retryable", out.Retryable), zap.NamedError("transport", out.Cause))
		}
		_, v, err := settle.Settler{Client: h.settlement, Log: logger}.Report(ctx, a, out)
		logger.Debug("attempt outcome reported", zap.Stringer("verdict", v))
		return err
	case execution.OutcomeAccepted:
		// The adapter may ask for less than the capability's lease, never more: a lease beyond it
		// would let a silent adapter hold the attempt until the budget ends instead of being
		// retried (the store also keeps the lease within the deadline).
		lease := out.Lease
		if lease <= 0 || lease > started.Lease {
			lease = started.Lease
		}
		logger.Info("attempt accepted as long-running work", zap.Duration("lease", lease))
		// Until the attempt's first lease ends: past it the sweeper retries the attempt anyway.
		_, err := outcome.Do(ctx, outcome.Options{Until: until, Log: logger, What: "attempt_accepted", Classify: classifyDB},
			func(ctx context.Context) error {
				return h.store.AttemptAccepted(ctx, started.ExecutionID, started.Attempt, lease)
			})
		return err
	}
	return fmt.Errorf("unknown outcome kind %d", out.Kind)
}

// classifyDB applies the reporter's rules to a database error: one of the connection
// (db.ErrConnection), one refused for the moment (db.ErrTransient), or no answer from the server
// at all (the call timed out) is retried; anything else the server answered is final.
func classifyDB(err error) outcome.Class {
	if errors.Is(err, errMovedOn) {
		return outcome.ClassMovedOn
	}
	switch db.Classify(err) {
	case db.ErrRow, db.ErrStatement:
		return outcome.ClassRefused
	}
	return outcome.Retry
}
