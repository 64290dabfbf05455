// Package server implements AdapterCallbackService: adapters renew leases, report progress and
// complete long-running work. Every call is checked, in order, for: the adapter's credential, an
// existing attempt, the adapter owning the execution, an async execution, the attempt's token,
// and the attempt still being the running one.
package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"strconv"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/store"
)

// Refusal reasons, each with its own gRPC code.
const (
	ReasonInvalid       = "INVALID_CALLBACK"     // UNAUTHENTICATED
	ReasonForeign       = "FOREIGN_EXECUTION"    // PERMISSION_DENIED
	ReasonNotApplicable = "NO_LONGER_APPLICABLE" // ABORTED
	ReasonSync          = "SYNC_EXECUTION"       // FAILED_PRECONDITION
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

// AuthInterceptor authenticates every callback with the adapter's credential.
func AuthInterceptor(st *store.Store) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := info.Server.(*Server); !ok {
			return handler(ctx, req)
		}
		cred, err := grpcx.BearerToken(ctx)
		if err != nil {
			return nil, err
		}
		id, err := st.AdapterIDByCredentialHash(ctx, secret.Hash(cred))
		if errors.Is(err, store.ErrNotFound) {
			return nil, apperr.Unauthenticated("unknown adapter credential")
		}
		if err != nil {
			return nil, err
		}
		return handler(context.WithValue(ctx, adapterKey{}, id), req)
	}
}

// check applies the refusal rules shared by every callback and returns the attempt.
func (s *Server) check(ctx context.Context, id string, n int32, token string) (*store.Attempt, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, apperr.Invalid("execution_id", "%q is not a UUID", id)
	}
	if n < 1 {
		return nil, apperr.Invalid("attempt", "must be at least 1")
	}
	invalid := apperr.New(apperr.KindUnauthenticated, ReasonInvalid, "unknown execution, attempt or callback token")
	a, err := s.store.AttemptGet(ctx, id, n)
	if errors.Is(err, store.ErrNotFound) {
		return nil, invalid
	}
	if err != nil {
		return nil, err
	}
	withState := func(e *apperr.Error) error {
		return e.With("status", a.Status).With("attempt", strconv.Itoa(int(a.Current)))
	}
	adapterID, _ := ctx.Value(adapterKey{}).(string)
	if a.AdapterID != adapterID {
		return nil, apperr.New(apperr.KindPermissionDenied, ReasonForeign, "execution belongs to another adapter")
	}
	if a.Mode == execution.ModeSync {
		return nil, withState(apperr.New(apperr.KindFailedPrecondition, ReasonSync, "sync executions are settled by the gateway only"))
	}
	if subtle.ConstantTimeCompare(secret.Hash(token), a.TokenHash) != 1 {
		return nil, invalid
	}
	if a.Current != n || a.Status != execution.StatusRunning {
		return nil, withState(apperr.New(apperr.KindAborted, ReasonNotApplicable, "attempt %d is no longer running", n))
	}
	return a, nil
}

// RenewLease implements AdapterCallbackService.RenewLease.
func (s *Server) RenewLease(ctx context.Context, req *adapterv1.RenewLeaseRequest) (*adapterv1.RenewLeaseResponse, error) {
	a, err := s.check(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken())
	if err != nil {
		return nil, err
	}
	lease := req.GetLease().AsDuration()
	if lease < 0 {
		return nil, apperr.Invalid("lease", "must not be negative")
	}
	if lease == 0 {
		lease = s.scale(a.Lease)
	}
	until, err := s.store.LeaseRenew(ctx, req.GetExecutionId(), req.GetAttempt(), lease)
	if errors.Is(err, store.ErrNotRunning) {
		return nil, apperr.New(apperr.KindAborted, ReasonNotApplicable, "attempt %d is no longer running or its lease expired", req.GetAttempt())
	}
	if err != nil {
		return nil, err
	}
	return &adapterv1.RenewLeaseResponse{LeaseExpireTime: timestamppb.New(until)}, nil
}

// ReportProgress implements AdapterCallbackService.ReportProgress.
func (s *Server) ReportProgress(ctx context.Context, req *adapterv1.ReportProgressRequest) (*adapterv1.ReportProgressResponse, error) {
	if _, err := s.check(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken()); err != nil {
		return nil, err
	}
	progress, err := execution.JSON(req.GetProgress())
	if err != nil || progress == nil {
		return nil, apperr.Invalid("progress", "required: a JSON object")
	}
	if len(progress) > 64<<10 {
		return nil, apperr.Invalid("progress", "%d bytes exceeds the limit of %d bytes", len(progress), 64<<10)
	}
	if err := s.store.ProgressSet(ctx, req.GetExecutionId(), req.GetAttempt(), progress); err != nil {
		if errors.Is(err, store.ErrNotRunning) {
			return nil, apperr.New(apperr.KindAborted, ReasonNotApplicable, "attempt %d is no longer running", req.GetAttempt())
		}
		return nil, err
	}
	return &adapterv1.ReportProgressResponse{}, nil
}

// Complete implements AdapterCallbackService.Complete: a success settles the execution; a
// failure goes to the retry schedule.
func (s *Server) Complete(ctx context.Context, req *adapterv1.CompleteRequest) (*adapterv1.CompleteResponse, error) {
	if _, err := s.check(ctx, req.GetExecutionId(), req.GetAttempt(), req.GetCallbackToken()); err != nil {
		return nil, err
	}
	var e *executionv1.Execution
	switch o := req.GetOutcome().(type) {
	case *adapterv1.CompleteRequest_Succeeded:
		resp, err := s.settlement.Settle(ctx, &settlementv1.SettleRequest{
			ExecutionId: req.GetExecutionId(), Attempt: req.GetAttempt(),
			FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
			Status:     executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, Result: o.Succeeded.GetResult(),
		})
		if err != nil {
			return nil, err
		}
		e = resp.GetExecution()
	case *adapterv1.CompleteRequest_Failed:
		out := adaptercall.FromFailed(o.Failed)
		resp, err := s.settlement.FailAttempt(ctx, &settlementv1.FailAttemptRequest{
			ExecutionId: req.GetExecutionId(), Attempt: req.GetAttempt(), Failure: out.Failure.Proto(),
			Retryable: out.Retryable, RetryAfter: durationpb.New(out.RetryAfter),
		})
		if err != nil {
			return nil, err
		}
		e = resp.GetExecution()
	default:
		return nil, apperr.Invalid("outcome", "required: succeeded or failed")
	}
	s.log.Info("attempt completed by callback", log.ExecutionID(req.GetExecutionId()), log.Attempt(req.GetAttempt()),
		zap.String("status", e.GetStatus().String()))
	return &adapterv1.CompleteResponse{Status: e.GetStatus()}, nil
}
