// Package attempt is the execution-consumer's handler: for each dispatch message, defer it if it
// arrived before its due time, start the attempt (or skip a duplicate), call the adapter, and hand
// the outcome to the settlement service — a success or final failure settles; a retryable failure
// schedules the next attempt.
package attempt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

// Handler runs attempts.
type Handler struct {
	store      *store.Store
	adapters   *adaptercall.Pool
	settlement settlementv1.SettlementServiceClient
	scale      func(time.Duration) time.Duration
	log        *zap.Logger
}

// New returns a Handler.
func New(st *store.Store, adapters *adaptercall.Pool, settlement settlementv1.SettlementServiceClient,
	scale func(time.Duration) time.Duration, log *zap.Logger) *Handler {
	return &Handler{store: st, adapters: adapters, settlement: settlement, scale: scale, log: log}
}

// Handle is the mq.Handler of the executions route.
func (h *Handler) Handle(ctx context.Context, m *mq.Message) mq.Result {
	var d queuev1.ExecutionDispatch
	if err := proto.Unmarshal(m.Body, &d); err != nil || d.GetExecutionId() == "" || d.GetAttempt() < 1 {
		return mq.Reject(fmt.Errorf("malformed dispatch message %s", m.ID))
	}
	logger := h.log.With(log.ExecutionID(d.GetExecutionId()), log.Attempt(d.GetAttempt()))
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
	if errors.Is(err, store.ErrNotStartable) {
		logger.Info("dispatch skipped: attempt already started or execution moved on")
		return mq.Ack()
	}
	if err != nil {
		return mq.Fail(err)
	}
	logger.Info("attempt started", zap.String("capability", started.Capability))

	payload, err := execution.Struct(started.Payload)
	if err != nil {
		return mq.Fail(fmt.Errorf("decode payload: %w", err))
	}
	// Bounded by what the database measured the lease and deadline to leave, not by their times
	// read on this host's clock.
	callCtx, cancel := context.WithTimeout(ctx, started.Remaining)
	out := h.adapters.Execute(callCtx, started.AdapterEndpoint, &adapterv1.ExecuteRequest{
		ExecutionId: started.ExecutionID, Attempt: started.Attempt, Capability: started.Capability,
		Payload: payload, DeadlineTime: timestamppb.New(started.Deadline), DeadlineIn: durationpb.New(started.DeadlineIn), CallbackToken: token,
		Mode: execution.ModeToProto(started.Mode),
	})
	cancel()
	if ctx.Err() != nil && out.Kind == adaptercall.Failed {
		// Our own shutdown cut the call short: that is not the adapter failing. The attempt stays
		// running and its lease decides what follows; redelivering the message could not start
		// it again.
		logger.Info("attempt interrupted by shutdown; its lease decides")
		return mq.Ack()
	}
	// An outcome in hand is recorded even while shutting down: losing it would make the work run
	// again after the lease expires.
	rctx, cancelRecord := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancelRecord()
	if err := h.record(rctx, logger, started, out); err != nil {
		// The attempt stays running; its lease expiry decides what follows. The message is done:
		// redelivering it could not start the attempt again.
		logger.Error("attempt outcome not recorded", zap.Error(err))
	}
	return mq.Ack()
}

// early handles a dispatch that arrived before its due time, by the database's clock: the
// dispatcher published it into the largest delay level not past that time, so it is early by the
// rest. It is deferred for what is left — through the route's shorter delay levels, and the last
// stretch below the smallest level held in the port's worker — without starting the attempt and
// without spending a port-level attempt. (A dispatch whose attempt can no longer start, e.g.
// cancelled while it waited, never comes here: AttemptStart answers ErrNotStartable for it, and it
// is dropped now rather than carried to its due time.)
func (h *Handler) early(logger *zap.Logger, early time.Duration) mq.Result {
	logger.Debug("dispatch arrived early; deferred", zap.Duration("early", early))
	return mq.Defer(early)
}

// recordTimeout bounds recording one outcome, retries included.
const recordTimeout = 10 * time.Second

// record hands the adapter's answer to the settlement service (or, for Accepted, stores the lease).
func (h *Handler) record(ctx context.Context, logger *zap.Logger, started *store.Started, out adaptercall.Outcome) error {
	switch out.Kind {
	case adaptercall.Completed:
		err := h.call(ctx, func(ctx context.Context) error {
			_, err := h.settlement.Settle(ctx, &settlementv1.SettleRequest{
				ExecutionId: started.ExecutionID, Attempt: started.Attempt,
				FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
				Status:     executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, Result: out.Result,
			})
			return err
		})
		if status.Code(err) != codes.InvalidArgument {
			return err
		}
		// The adapter answered a result the platform cannot store (e.g. NaN in it): that is the
		// adapter failing, permanently, not a success to drop.
		logger.Warn("adapter result refused", zap.Error(err))
		out = adaptercall.Outcome{Kind: adaptercall.Failed, Failure: execution.Failure{
			Class: execution.ClassProtocol, Message: safetext.Truncate("adapter result refused: "+status.Convert(err).Message(), 1024),
		}}
		fallthrough
	case adaptercall.Failed:
		logger.Info("attempt failed", zap.String("class", out.Failure.Class), zap.Bool("retryable", out.Retryable))
		return h.call(ctx, func(ctx context.Context) error {
			_, err := h.settlement.FailAttempt(ctx, &settlementv1.FailAttemptRequest{
				ExecutionId: started.ExecutionID, Attempt: started.Attempt, Failure: out.Failure.Proto(),
				Retryable: out.Retryable, RetryAfter: durationpb.New(out.RetryAfter),
			})
			return err
		})
	case adaptercall.Accepted:
		// The adapter may ask for less than the capability's lease, never more: a lease beyond it
		// would let a silent adapter hold the attempt until the budget ends instead of being
		// retried (the store also keeps the lease within the deadline).
		lease := out.Lease
		if lease <= 0 || lease > started.Lease {
			lease = started.Lease
		}
		logger.Info("attempt accepted as long-running work", zap.Duration("lease", lease))
		return h.store.AttemptAccepted(ctx, started.ExecutionID, started.Attempt, lease)
	}
	return fmt.Errorf("unknown outcome kind %d", out.Kind)
}

// call runs a settlement call, retrying while the service is unavailable or failing, until ctx
// ends. A refusal because the execution moved on (settled or a later attempt) is not an error
// here: someone else decided.
func (h *Handler) call(ctx context.Context, fn func(ctx context.Context) error) error {
	for i := 0; ; i++ {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := fn(callCtx)
		cancel()
		switch status.Code(err) {
		case codes.OK:
			return nil
		case codes.FailedPrecondition, codes.Aborted, codes.NotFound:
			h.log.Info("settlement refused: execution already moved on", zap.Error(err))
			return nil
		case codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Unknown:
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(time.Duration(100<<min(i, 5))*time.Millisecond, 2*time.Second)):
		}
	}
}
