// Package server implements SettlementService.
package server

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/nudge"
	"github.com/integrations-platform/integrations/services/settlement/internal/store"
)

// Server is the SettlementService.
type Server struct {
	settlementv1.UnimplementedSettlementServiceServer
	store *store.Store
	nudge func()
	scale func(time.Duration) time.Duration
	log   *zap.Logger
}

// New returns a Server. scale shrinks retry delays (INTEGRATIONS_TIME_SCALE).
func New(st *store.Store, dispatcher dispatcherv1.DispatcherServiceClient, scale func(time.Duration) time.Duration, log *zap.Logger) *Server {
	return &Server{store: st, nudge: nudge.Dispatcher(dispatcher, log), scale: scale, log: log}
}

// Nudge tells the dispatcher a record was scheduled, without waiting; a lost nudge only delays
// the attempt until the dispatcher's next scheduled pass. The sweeper uses it too.
func (s *Server) Nudge() { s.nudge() }

// Settle implements SettlementService.Settle.
func (s *Server) Settle(ctx context.Context, req *settlementv1.SettleRequest) (*settlementv1.SettleResponse, error) {
	o, err := outcome(req)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	settled, err := s.store.ExecutionSettle(ctx, o)
	settleSeconds.WithLabelValues("settle", resultLabel(err)).Observe(time.Since(start).Seconds())
	var conflict *store.ConflictError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, apperr.NotFound("execution %s not found", o.ExecutionID)
	case errors.As(err, &conflict):
		s.log.Info("settlement lost", log.ExecutionID(o.ExecutionID), log.Attempt(o.Attempt),
			zap.String("status", string(conflict.Status)), zap.Int32("current_attempt", conflict.Attempt))
		return nil, conflictError(o, conflict.Conflict)
	case err != nil:
		return nil, err
	}
	s.log.Info("execution settled", log.ExecutionID(o.ExecutionID), log.Attempt(o.Attempt),
		zap.String("status", string(o.Status)), zap.String("reason", o.Failure.Reason), log.EventID(settled.EventID))
	e, err := settled.Execution.Proto(false)
	if err != nil {
		return nil, err
	}
	return &settlementv1.SettleResponse{Execution: e, EventId: settled.EventID}, nil
}

// FailAttempt implements SettlementService.FailAttempt.
func (s *Server) FailAttempt(ctx context.Context, req *settlementv1.FailAttemptRequest) (*settlementv1.FailAttemptResponse, error) {
	if _, err := uuid.Parse(req.GetExecutionId()); err != nil {
		return nil, apperr.Invalid("execution_id", "%s is not a UUID", jsonbound.Quote(req.GetExecutionId()))
	}
	if req.GetAttempt() < 1 {
		return nil, apperr.Invalid("attempt", "must be at least 1")
	}
	if req.GetFailure().GetClass() == "" {
		return nil, apperr.Invalid("failure.class", "required")
	}
	if err := checkFailure(req.GetFailure()); err != nil {
		return nil, err
	}
	if req.GetRetryAfter().AsDuration() < 0 {
		return nil, apperr.Invalid("retry_after", "must not be negative")
	}
	a := store.AttemptFailure{
		ExecutionID: req.GetExecutionId(), Attempt: req.GetAttempt(),
		Failure:   execution.Failure{Class: req.GetFailure().GetClass(), Code: req.GetFailure().GetCode(), Message: req.GetFailure().GetMessage()},
		Retryable: req.GetRetryable(), RetryAfter: req.GetRetryAfter().AsDuration(), Scale: s.scale,
	}
	start := time.Now()
	res, err := s.store.AttemptFail(ctx, a)
	settleSeconds.WithLabelValues("fail_attempt", resultLabel(err)).Observe(time.Since(start).Seconds())
	var conflict *store.ConflictError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, apperr.NotFound("execution %s not found", a.ExecutionID)
	case errors.As(err, &conflict):
		s.log.Info("attempt failure not applicable", log.ExecutionID(a.ExecutionID), log.Attempt(a.Attempt),
			zap.String("status", string(conflict.Status)), zap.Int32("current_attempt", conflict.Attempt))
		return nil, conflictError(store.Outcome{Attempt: a.Attempt, FromStatus: execution.StatusRunning}, conflict.Conflict)
	case err != nil:
		return nil, err
	}
	e, err := res.Execution.Proto(false)
	if err != nil {
		return nil, err
	}
	resp := &settlementv1.FailAttemptResponse{Execution: e, EventId: res.EventID}
	if res.NextAttemptAt != nil {
		resp.NextAttemptTime = timestamppb.New(*res.NextAttemptAt)
		s.Nudge()
		s.log.Info("attempt failed, next scheduled", log.ExecutionID(a.ExecutionID), log.Attempt(a.Attempt),
			zap.String("class", a.Failure.Class), zap.Time("next_attempt_at", *res.NextAttemptAt))
	} else {
		s.log.Info("execution settled", log.ExecutionID(a.ExecutionID), log.Attempt(a.Attempt),
			zap.String("status", string(res.Execution.Status)), zap.String("class", a.Failure.Class),
			zap.String("reason", str(res.Execution.FailureReason)), log.EventID(res.EventID))
	}
	return resp, nil
}

func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func conflictError(o store.Outcome, c store.Conflict) error {
	var e *apperr.Error
	switch {
	case c.Status.IsFinal():
		e = apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_ALREADY_SETTLED.String(), "execution already settled %s", c.Status)
	case c.Attempt != o.Attempt:
		e = apperr.New(apperr.KindAborted, errorsv1.ErrorReason_STALE_ATTEMPT.String(), "attempt %d is not current; the execution is at attempt %d", o.Attempt, c.Attempt)
	default:
		e = apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_STATUS_MISMATCH.String(), "execution is %s, not %s", c.Status, o.FromStatus)
	}
	return e.With("status", string(c.Status)).With("attempt", strconv.Itoa(int(c.Attempt)))
}

func outcome(req *settlementv1.SettleRequest) (store.Outcome, error) {
	if _, err := uuid.Parse(req.GetExecutionId()); err != nil {
		return store.Outcome{}, apperr.Invalid("execution_id", "%s is not a UUID", jsonbound.Quote(req.GetExecutionId()))
	}
	if req.GetAttempt() < 0 {
		return store.Outcome{}, apperr.Invalid("attempt", "must not be negative")
	}
	from := execution.StatusFromProto(req.GetFromStatus())
	if from != execution.StatusPending && from != execution.StatusRunning {
		return store.Outcome{}, apperr.Invalid("from_status", "must be PENDING or RUNNING")
	}
	to := execution.StatusFromProto(req.GetStatus())
	if !to.IsFinal() {
		return store.Outcome{}, apperr.Invalid("status", "must be SUCCEEDED, FAILED or CANCELLED")
	}
	if from == execution.StatusPending && to != execution.StatusCancelled && req.GetStatus() != executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED {
		return store.Outcome{}, apperr.Invalid("from_status", "only a cancellation or a failure settles a pending execution")
	}
	o := store.Outcome{ExecutionID: req.GetExecutionId(), Attempt: req.GetAttempt(), FromStatus: from, Status: to, Failure: execution.FailureFromProto(req.GetFailure())}
	switch to {
	case execution.StatusSucceeded:
		// A result Postgres cannot store (NUL, invalid UTF-8) or that could not be read back
		// (nested past 64) is refused naming "result": the reporter (sdk/go/outcome) then records
		// the adapter's protocol failure instead of retrying until the lease ends.
		if err := jsonbound.Struct("result", req.GetResult()); err != nil {
			return store.Outcome{}, err
		}
		result, err := execution.JSON(req.GetResult())
		if err != nil {
			return store.Outcome{}, apperr.Invalid("result", "not a JSON object: %v", err)
		}
		if result == nil {
			result = []byte("{}")
		}
		o.Result = result
		o.Failure = execution.Failure{}
	case execution.StatusFailed, execution.StatusCancelled:
		if o.Failure.Reason == "" {
			return store.Outcome{}, apperr.Invalid("failure.reason", "required for a %s settlement", to)
		}
		if err := checkFailure(req.GetFailure()); err != nil {
			return store.Outcome{}, err
		}
	}
	return o, nil
}

// checkFailure refuses a failure whose texts Postgres cannot store. The platform's reporters
// clean adapters' texts before they get here (adaptercall); this is the guard behind them.
func checkFailure(f *executionv1.Failure) error {
	for _, t := range []struct{ field, v string }{
		{"failure.class", f.GetClass()}, {"failure.reason", f.GetReason()},
		{"failure.code", f.GetCode()}, {"failure.message", f.GetMessage()},
	} {
		if err := jsonbound.Text(t.field, t.v); err != nil {
			return err
		}
	}
	return nil
}
