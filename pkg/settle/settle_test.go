package settle_test

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/settle"
	"github.com/integrations-platform/integrations/sdk/go/outcome"
)

// TestPlatformStatusesClassify: the statuses the platform's services answer (grpcx.ToStatus of
// their typed errors) mean to the outcome reporter what the adapter protocol says they mean.
func TestPlatformStatusesClassify(t *testing.T) {
	t.Parallel()
	st := func(e *apperr.Error) error { return grpcx.ToStatus(e).Err() }
	for _, tt := range []struct {
		name string
		err  error
		want outcome.Class
	}{
		{"already settled", st(apperr.New(apperr.KindFailedPrecondition, "ALREADY_SETTLED", "settled")), outcome.ClassMovedOn},
		{"stale attempt", st(apperr.New(apperr.KindAborted, "STALE_ATTEMPT", "stale")), outcome.ClassMovedOn},
		{"not found", st(apperr.NotFound("gone")), outcome.ClassMovedOn},
		{"no longer applicable", st(apperr.New(apperr.KindFailedPrecondition, "NO_LONGER_APPLICABLE", "ended")), outcome.ClassMovedOn},
		{"result refused", st(apperr.Invalid("result", "not a JSON object: NaN")), outcome.ClassResultRefused},
		{"other field refused", st(apperr.Invalid("execution_id", "not a UUID")), outcome.ClassRefused},
		{"unauthenticated", st(apperr.Unauthenticated("bad token")), outcome.ClassRefused},
		{"unavailable", st(apperr.New(apperr.KindUnavailable, errorsv1.ErrorReason_UNAVAILABLE.String(), "down")), outcome.Retry},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, outcome.Classify(tt.err))
		})
	}
}

// fakeSettlement answers scripted errors, then records what it is asked.
type fakeSettlement struct {
	settlementv1.UnimplementedSettlementServiceServer
	mu       sync.Mutex
	settle   []error // errors answered to the first Settle calls, in order
	fail     []error
	settled  []*settlementv1.SettleRequest
	failures []*settlementv1.FailAttemptRequest
}

func (f *fakeSettlement) Settle(_ context.Context, r *settlementv1.SettleRequest) (*settlementv1.SettleResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.settle) > 0 {
		err := f.settle[0]
		f.settle = f.settle[1:]
		return nil, err
	}
	if _, err := execution.JSON(r.GetResult()); err != nil {
		return nil, grpcx.ToStatus(apperr.Invalid("result", "not a JSON object: %v", err)).Err()
	}
	f.settled = append(f.settled, r)
	return &settlementv1.SettleResponse{Execution: &executionv1.Execution{Id: r.GetExecutionId(), Status: r.GetStatus()}}, nil
}

func (f *fakeSettlement) FailAttempt(_ context.Context, r *settlementv1.FailAttemptRequest) (*settlementv1.FailAttemptResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.fail) > 0 {
		err := f.fail[0]
		f.fail = f.fail[1:]
		return nil, err
	}
	f.failures = append(f.failures, r)
	return &settlementv1.FailAttemptResponse{Execution: &executionv1.Execution{Id: r.GetExecutionId(), Status: executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED}}, nil
}

func serve(t *testing.T, f *fakeSettlement) settlementv1.SettlementServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}))
	settlementv1.RegisterSettlementServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return settlementv1.NewSettlementServiceClient(conn)
}

const execID = "0190a0e0-0000-7000-8000-000000000001"

func TestSettlerRetriesASettlementOutage(t *testing.T) {
	t.Parallel()
	f := &fakeSettlement{settle: []error{status.Error(codes.Unavailable, "dial tcp 127.0.0.1:9094: connection refused"), status.Error(codes.Internal, "transport is closing")}}
	s := settle.Settler{Client: serve(t, f)}
	result, err := structpb.NewStruct(map[string]any{"ok": true})
	require.NoError(t, err)
	e, v, err := s.Report(context.Background(), settle.Attempt{ExecutionID: execID, Attempt: 1, Until: time.Now().Add(5 * time.Second)},
		execution.Outcome{Kind: execution.OutcomeCompleted, Result: result})
	require.NoError(t, err)
	require.Equal(t, outcome.Recorded, v)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, e.GetStatus())
	require.Len(t, f.settled, 1)
	require.Empty(t, f.failures)
}

func TestSettlerTurnsARefusedResultIntoAProtocolFailure(t *testing.T) {
	t.Parallel()
	f := &fakeSettlement{fail: []error{status.Error(codes.Unavailable, "down")}}
	s := settle.Settler{Client: serve(t, f)}
	result := &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewNumberValue(math.NaN())}}
	e, v, err := s.Report(context.Background(), settle.Attempt{ExecutionID: execID, Attempt: 2, Until: time.Now().Add(5 * time.Second)},
		execution.Outcome{Kind: execution.OutcomeCompleted, Result: result})
	require.NoError(t, err)
	require.Equal(t, outcome.Recorded, v)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED, e.GetStatus())
	require.Empty(t, f.settled)
	require.Len(t, f.failures, 1, "the protocol failure is retried through the outage too")
	got := f.failures[0]
	require.Equal(t, execution.ClassProtocol, got.GetFailure().GetClass())
	require.False(t, got.GetRetryable())
	require.Contains(t, got.GetFailure().GetMessage(), "adapter result refused")
}

func TestSettlerMovedOnIsFinalNotAnError(t *testing.T) {
	t.Parallel()
	f := &fakeSettlement{fail: []error{grpcx.ToStatus(apperr.New(apperr.KindAborted, "STALE_ATTEMPT", "attempt 1 is not current")).Err()}}
	s := settle.Settler{Client: serve(t, f)}
	e, v, err := s.Report(context.Background(), settle.Attempt{ExecutionID: execID, Attempt: 1, Until: time.Now().Add(5 * time.Second)},
		execution.Outcome{Kind: execution.OutcomeFailed, Retryable: true, Failure: execution.Failure{Class: execution.ClassTransient}})
	require.NoError(t, err)
	require.Equal(t, outcome.MovedOn, v)
	require.Nil(t, e)
	require.Empty(t, f.failures, "nothing is sent again after a moved-on answer")
}

func TestSettlerGivesUpAtTheLease(t *testing.T) {
	t.Parallel()
	f := &fakeSettlement{}
	for range 1000 {
		f.settle = append(f.settle, status.Error(codes.Unavailable, "down"))
	}
	s := settle.Settler{Client: serve(t, f)}
	until := time.Now().Add(300 * time.Millisecond)
	_, v, err := s.Report(context.Background(), settle.Attempt{ExecutionID: execID, Attempt: 1, Until: until},
		execution.Outcome{Kind: execution.OutcomeCompleted, Result: &structpb.Struct{}})
	require.Equal(t, outcome.Expired, v)
	// The last error is the service's answer, or the lease's end cutting the last try short.
	require.Contains(t, []codes.Code{codes.Unavailable, codes.DeadlineExceeded}, status.Code(errors.Unwrap(err)), "%v", err)
	// As in TestDoRetriesUntilTheDeadlineThenExpires: tight below (not giving up early), loose
	// above (a loaded machine runs the last try late).
	now := time.Now()
	require.False(t, now.Before(until.Add(-300*time.Millisecond)), "retried up to the lease, not fewer times")
	require.True(t, now.Before(until.Add(10*time.Second)), "and gave up at it")
}
