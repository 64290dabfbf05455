// Package server implements AdapterCallbackService: adapters renew leases, report progress and
// complete long-running work. Every call is checked, in order, for: the adapter's credential, an
// existing attempt, the adapter owning the execution, an async execution, the attempt's token,
// and the attempt still being the running one. Refusals carry an ErrorInfo with their reason;
// those given to the owning adapter with a valid token (NO_LONGER_APPLICABLE, SYNC_EXECUTION)
// also carry the execution's current status and attempt, the others nothing about it.
package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/store"
)

type adapterKey struct{}

// Server is the AdapterCallbackService.
type Server struct {
	adapterv1.UnimplementedAdapterCallbackServiceServer
	store      *store.Store
	settlement settlementv1.SettlementServiceClient
	scale      func(time.Duration) time.Duration
	log        *zap.Logger
}

// New returns a Server.
func New(st *store.Store, settlement settlementv1.SettlementServiceClient, scale func(time.Duration) time.Duration, log *zap.Logger) *Server {
	return &Server{store: st, settlement: settlement, scale: scale, log: log}
}

// AuthInterceptor authenticates every callback with the adapter's credential. A missing or
// unknown credential is an invalid callback (UNAUTHENTICATED, INVALID_CALLBACK).
func AuthInterceptor(st *store.Store) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := info.Server.(*Server); !ok {
			return handler(ctx, req)
		}
		cred, err := grpcx.BearerToken(ctx)
		if err != nil {
			return nil, apperr.New(apperr.KindUnauthenticated, errorsv1.ErrorReason_INVALID_CALLBACK.String(), "%s", bearerProblem(err))
		}
		id, err := st.AdapterIDByCredentialHash(ctx, secret.Hash(cred))
		if errors.Is(err, store.ErrNotFound) {
			return nil, apperr.New(apperr.KindUnauthenticated, errorsv1.ErrorReason_INVALID_CALLBACK.String(), "unknown adapter credential")
		}
		if err != nil {
			return nil, err
		}
		return handler(context.WithValue(ctx, adapterKey{}, id), req)
	}
}

func bearerProblem(err error) string {
	if e, ok := apperr.As(err); ok {
		return e.Message
	}
	return "missing or malformed authorization"
}

// withState adds the execution's current status and attempt to a refusal, for callers entitled to
// see them: the owning adapter with a valid token.
func withState(e *apperr.Error, status execution.Status, attempt int32) error {
	return e.With("status", string(status)).With("attempt", strconv.Itoa(int(attempt)))
}

func notApplicable(status execution.Status, current, n int32, why string) error {
	return withState(apperr.New(apperr.KindAborted, errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(), "attempt %d is no longer applicable: %s", n, why), status, current)
}

// authorize applies the refusals that do not depend on the attempt still running, and returns
// the attempt. An unknown attempt, a wrong token and another adapter's execution are refused
// alike whatever the execution's state, and the refusal tells nothing about it.
func (s *Server) authorize(ctx context.Context, id string, n int32, token string) (*store.Attempt, error) {
	if err := checkAttemptRef(id, n); err != nil {
		return nil, err
	}
	invalid := apperr.New(apperr.KindUnauthenticated, errorsv1.ErrorReason_INVALID_CALLBACK.String(), "unknown execution, attempt or callback token")
	a, err := s.store.AttemptGet(ctx, id, n)
	if errors.Is(err, store.ErrNotFound) {
		return nil, invalid
	}
	if err != nil {
		return nil, err
	}
	adapterID, _ := ctx.Value(adapterKey{}).(string)
	if a.AdapterID != adapterID {
		return nil, apperr.New(apperr.KindPermissionDenied, errorsv1.ErrorReason_FOREIGN_EXECUTION.String(), "execution belongs to another adapter")
	}
	tokenOK := subtle.ConstantTimeCompare(secret.Hash(token), a.TokenHash) == 1
	if a.Mode == execution.ModeSync {
		// Refused whatever the token, since no callback could apply to it; the execution's
		// state is told only to a caller that proves the attempt's token.
		refusal := apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_SYNC_EXECUTION.String(), "sync executions are settled by the gateway only")
		if !tokenOK {
			return nil, refusal
		}
		return nil, withState(refusal, a.Status, a.Current)
	}
	if !tokenOK {
		return nil, invalid
	}
	return a, nil
}

// checkAttemptRef refuses an execution id or attempt number that cannot name an attempt.
func checkAttemptRef(id string, n int32) error {
	if _, err := uuid.Parse(id); err != nil {
		return apperr.Invalid("execution_id", "%s is not a UUID", jsonbound.Quote(id))
	}
	if n < 1 {
		return apperr.Invalid("attempt", "must be at least 1")
	}
	return nil
}

// maxProgressBytes bounds a progress report's JSON.
const maxProgressBytes = 64 << 10

// progressJSON is a progress report's JSON as stored, or its refusal: required, storable
// (jsonbound), at most maxProgressBytes.
func progressJSON(req *adapterv1.ReportProgressRequest) ([]byte, error) {
	if req.GetProgress() == nil {
		return nil, apperr.Invalid("progress", "required: a JSON object")
	}
	if err := jsonbound.Struct("progress", req.GetProgress()); err != nil {
		return nil, err
	}
	progress, err := execution.JSON(req.GetProgress())
	if err != nil {
		return nil, apperr.Invalid("progress", "required: a JSON object")
	}
	if len(progress) > maxProgressBytes {
		return nil, apperr.Invalid("progress", "%d bytes exceeds the limit of %d bytes", len(progress), maxProgressBytes)
	}
	return progress, nil
}

// checkResult refuses a success whose result Postgres could not store, here, in this service's
// words, rather than by settlement. The refusal is recorded as the attempt's protocol failure
// (invalidResult): this service does not rely on the adapter's SDK to report one.
func checkResult(req *adapterv1.CompleteRequest) error {
	return jsonbound.Struct("succeeded.result", req.GetSucceeded().GetResult())
}

// AcceptsUndecodable implements grpcx.UndecodableAcceptor: a Complete that could not be decoded
// reaches Complete, which records it on the attempt. Refused before the handler, the adapter
// got an INVALID_ARGUMENT naming no result, its SDK gave up, and the attempt ran until its lease
// ended — the provider work then ran again. A progress report that cannot be decoded is refused
// naming progress, as one that cannot be stored: the work goes on.
func (s *Server) AcceptsUndecodable(method string) bool {
	return method == adapterv1.AdapterCallbackService_Complete_FullMethodName
}

// undecodableOutcome is the outcome ("succeeded", "failed") whose field of a Complete could not
// be decoded, or "" when it is another field (the attempt's ids, its token).
func undecodableOutcome(err error) execution.AttemptOutcome {
	e, ok := apperr.As(err)
	if !ok {
		return ""
	}
	field, _, _ := strings.Cut(e.Field, ".")
	switch field {
	case "succeeded":
		return execution.AttemptSucceeded
	case "failed":
		return execution.AttemptFailed
	}
	return ""
}

// invalidResult records an adapter's outcome the platform cannot take — a result it cannot
// decode or store, a failure it cannot decode — as the attempt's permanent protocol failure
// (adapter.invalid_result) through settlement's FailAttempt, as the direct path does
// (sdk/go/outcome), and answers refusal, which names the adapter's field. Left to the adapter's
// SDK, an adapter without it (or an SDK that gave up) left the attempt running until its lease
// ended, and the work ran again.
func (s *Server) invalidResult(ctx context.Context, req *adapterv1.CompleteRequest, outcome execution.AttemptOutcome, refusal error) error {
	why, field := "the platform cannot store it", ""
	if e, ok := apperr.As(refusal); ok {
		why, field = e.Field+": "+e.Message, e.Field
	}
	out := adaptercall.InvalidResult(why)
	_, err := s.settlement.FailAttempt(ctx, &settlementv1.FailAttemptRequest{
		ExecutionId: req.GetExecutionId(), Attempt: req.GetAttempt(), Failure: out.Failure.Proto(),
	})
	if err != nil {
		return s.settlementRefused(ctx, req, outcome, err)
	}
	s.log.Warn("adapter outcome refused; recorded as the attempt's protocol failure", log.ExecutionID(req.GetExecutionId()),
		log.Attempt(req.GetAttempt()), zap.String("outcome", string(outcome)), zap.String("field", field))
	return refusal
}

// running reports whether attempt n is the execution's running attempt.
func running(a *store.Attempt, n int32) bool {
	return a.Current == n && a.Status == execution.StatusRunning
}

// check applies every refusal and returns the attempt, which is running.
func (s *Server) check(ctx context.Context, id string, n int32, token string) (*store.Attempt, error) {
	a, err := s.authorize(ctx, id, n, token)
	if err != nil {
		return nil, err
	}
	if !running(a, n) {
		return nil, notApplicable(a.Status, a.Current, n, "it is no longer running")
	}
	return a, nil
}

// stopped is the refusal of a callback whose attempt stopped running between the check and the
// write (it was settled, superseded, or its lease or deadline passed): it reads the execution's
// state again for the refusal's details.
func (s *Server) stopped(ctx context.Context, id string, n int32) error {
	a, err := s.store.AttemptGet(ctx, id, n)
	if err != nil {
		return err
	}
	why := "its lease or the execution's deadline has passed"
	if !running(a, n) {
		why = "it is no longer running"
	}
	return notApplicable(a.Status, a.Current, n, why)
}

// RenewLease implements AdapterCallbackService.RenewLease. The lease is at most the capability's
// (scaled) lease, whatever the adapter asks, and never runs past the execution's deadline: the
// answer says until when it runs (on the database's clock) and for how long (a duration, which an
// adapter on a clock of its own can go by).
func (s *Server) RenewLease(ctx context.Context, req *adapterv1.RenewLeaseRequest) (*adapterv1.RenewLeaseResponse, error) {
	a, err := s.check(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken())
	if err != nil {
		return nil, err
	}
	lease := req.GetLease().AsDuration()
	if lease < 0 {
		return nil, apperr.Invalid("lease", "must not be negative")
	}
	if most := s.scale(a.Lease); lease == 0 || lease > most {
		lease = most
	}
	until, granted, err := s.store.LeaseRenew(ctx, req.GetExecutionId(), req.GetAttempt(), lease)
	if errors.Is(err, store.ErrNotRunning) {
		return nil, s.stopped(ctx, req.GetExecutionId(), req.GetAttempt())
	}
	if err != nil {
		return nil, err
	}
	return &adapterv1.RenewLeaseResponse{LeaseExpireTime: timestamppb.New(until), Lease: durationpb.New(granted)}, nil
}

// ReportProgress implements AdapterCallbackService.ReportProgress.
func (s *Server) ReportProgress(ctx context.Context, req *adapterv1.ReportProgressRequest) (*adapterv1.ReportProgressResponse, error) {
	if _, err := s.check(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken()); err != nil {
		return nil, err
	}
	progress, err := progressJSON(req)
	if err != nil {
		return nil, err
	}
	ev, err := s.store.ProgressSet(ctx, req.GetExecutionId(), req.GetAttempt(), progress)
	if err != nil {
		if errors.Is(err, store.ErrNotRunning) {
			return nil, s.stopped(ctx, req.GetExecutionId(), req.GetAttempt())
		}
		return nil, err
	}
	if ev.ID != "" {
		s.log.Debug("progress event written", log.ExecutionID(req.GetExecutionId()), log.Attempt(req.GetAttempt()),
			log.EventID(ev.ID), zap.Int32("sequence", ev.Sequence), zap.Bool("replaced", ev.Replaced))
	}
	return &adapterv1.ReportProgressResponse{}, nil
}

// The settlement service's reasons for a settlement that changed nothing: the attempt is over.
var settlementLost = map[errorsv1.ErrorReason]bool{
	errorsv1.ErrorReason_ALREADY_SETTLED: true, errorsv1.ErrorReason_STALE_ATTEMPT: true, errorsv1.ErrorReason_STATUS_MISMATCH: true,
}

// Complete implements AdapterCallbackService.Complete: a success settles the execution; a
// failure goes to the retry schedule. An outcome for an attempt that is over — the execution
// settled, a later attempt started, or the lease expired and the sweeper ended the attempt — is
// refused (NO_LONGER_APPLICABLE) and recorded on the attempt for audit, never applied.
func (s *Server) Complete(ctx context.Context, req *adapterv1.CompleteRequest) (*adapterv1.CompleteResponse, error) {
	undecodable := grpcx.Undecodable(ctx)
	if undecodable != nil && undecodableOutcome(undecodable) == "" {
		return nil, undecodable // the attempt's ids or token: nothing to record it on
	}
	a, err := s.authorize(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken())
	if err != nil {
		return nil, err
	}
	if undecodable != nil {
		outcome := undecodableOutcome(undecodable)
		if !running(a, req.GetAttempt()) {
			return nil, s.late(ctx, req, outcome, a.Status, a.Current)
		}
		return nil, s.invalidResult(ctx, req, outcome, undecodable)
	}
	var outcome execution.AttemptOutcome
	switch req.GetOutcome().(type) {
	case *adapterv1.CompleteRequest_Succeeded:
		outcome = execution.AttemptSucceeded
	case *adapterv1.CompleteRequest_Failed:
		outcome = execution.AttemptFailed
	default:
		return nil, apperr.Invalid("outcome", "required: succeeded or failed")
	}
	if !running(a, req.GetAttempt()) {
		return nil, s.late(ctx, req, outcome, a.Status, a.Current)
	}
	if err := checkResult(req); err != nil {
		return nil, s.invalidResult(ctx, req, outcome, err)
	}
	var e *executionv1.Execution
	switch o := req.GetOutcome().(type) {
	case *adapterv1.CompleteRequest_Succeeded:
		resp, err := s.settlement.Settle(ctx, &settlementv1.SettleRequest{
			ExecutionId: req.GetExecutionId(), Attempt: req.GetAttempt(),
			FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
			Status:     executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, Result: o.Succeeded.GetResult(),
		})
		if err != nil && status.Code(err) == codes.InvalidArgument && !settlementLost[rpcstatus.ErrorReason(err)] {
			// Settlement refused the result itself: the adapter's protocol failure too.
			return nil, s.invalidResult(ctx, req, outcome, apperr.Invalid("succeeded.result", "refused: must be a JSON object").Wrap(err))
		}
		if err != nil {
			return nil, s.settlementRefused(ctx, req, outcome, err)
		}
		e = resp.GetExecution()
	case *adapterv1.CompleteRequest_Failed:
		out := adaptercall.FromFailed(o.Failed)
		resp, err := s.settlement.FailAttempt(ctx, &settlementv1.FailAttemptRequest{
			ExecutionId: req.GetExecutionId(), Attempt: req.GetAttempt(), Failure: out.Failure.Proto(),
			Retryable: out.Retryable, RetryAfter: durationpb.New(out.RetryAfter),
		})
		if err != nil {
			return nil, s.settlementRefused(ctx, req, outcome, err)
		}
		e = resp.GetExecution()
	}
	s.log.Info("attempt completed by callback", log.ExecutionID(req.GetExecutionId()), log.Attempt(req.GetAttempt()),
		zap.String("status", e.GetStatus().String()))
	return &adapterv1.CompleteResponse{Status: e.GetStatus()}, nil
}

// settlementRefused turns the settlement service's refusal of a Complete that lost a race (the
// sweeper, a cancellation or another outcome got there first) into a late outcome; other errors
// become answers of this service's own (settlementError).
func (s *Server) settlementRefused(ctx context.Context, req *adapterv1.CompleteRequest, outcome execution.AttemptOutcome, err error) error {
	if !settlementLost[rpcstatus.ErrorReason(err)] {
		return settlementError(ctx, outcome, err)
	}
	a, rerr := s.store.AttemptGet(ctx, req.GetExecutionId(), req.GetAttempt())
	if rerr != nil {
		return rerr
	}
	return s.late(ctx, req, outcome, a.Status, a.Current)
}

// settlementError answers the adapter in this service's words when settlement did not take its
// outcome: settlement unreachable is UNAVAILABLE "settlement unavailable, retry" (the adapter
// retries it); a refusal of the outcome itself names the adapter's own field (succeeded.result
// or failed), not settlement's; anything else is our INTERNAL, logged with settlement's answer.
func settlementError(ctx context.Context, outcome execution.AttemptOutcome, err error) error {
	if status.Code(err) == codes.InvalidArgument {
		if outcome == execution.AttemptSucceeded {
			return apperr.Invalid("succeeded.result", "refused: must be a JSON object").Wrap(err)
		}
		return apperr.Invalid("failed", "refused: not a failure the platform can record").Wrap(err)
	}
	return grpcx.Downstream(ctx, "settlement", err)
}

// late records an outcome that came after its attempt ended and answers the refusal.
func (s *Server) late(ctx context.Context, req *adapterv1.CompleteRequest, outcome execution.AttemptOutcome, status execution.Status, current int32) error {
	fields := []zap.Field{log.ExecutionID(req.GetExecutionId()), log.Attempt(req.GetAttempt()), zap.String("outcome", string(outcome)),
		zap.String("status", string(status)), zap.Int32("current_attempt", current)}
	// The refusal is the answer whether or not the audit record could be written.
	if err := s.store.AttemptLateOutcomeSet(ctx, req.GetExecutionId(), req.GetAttempt(), outcome); err != nil {
		s.log.Error("late outcome not recorded", append(fields, zap.Error(err))...)
	} else {
		s.log.Info("late outcome recorded, not applied", fields...)
	}
	return notApplicable(status, current, req.GetAttempt(), "the attempt has ended")
}
