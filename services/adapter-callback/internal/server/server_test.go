package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/server"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/store"
)

// credential is the standard test catalog's adapter credential.
const credential = "test-credential-0123456789"

// fakeSettlement stands in for the settlement service, which this service reaches over gRPC; the
// callback service's own checks run against the real Postgres. onSettle, if set, answers Settle.
type fakeSettlement struct {
	settlementv1.SettlementServiceClient

	mu       sync.Mutex
	onSettle func(*settlementv1.SettleRequest) error
	settles  []*settlementv1.SettleRequest
	fails    []*settlementv1.FailAttemptRequest
}

func (f *fakeSettlement) Settle(_ context.Context, in *settlementv1.SettleRequest, _ ...grpc.CallOption) (*settlementv1.SettleResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settles = append(f.settles, in)
	if f.onSettle != nil {
		if err := f.onSettle(in); err != nil {
			return nil, err
		}
	}
	return &settlementv1.SettleResponse{Execution: &executionv1.Execution{Id: in.GetExecutionId(), Status: in.GetStatus()}}, nil
}

func (f *fakeSettlement) FailAttempt(_ context.Context, in *settlementv1.FailAttemptRequest, _ ...grpc.CallOption) (*settlementv1.FailAttemptResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fails = append(f.fails, in)
	return &settlementv1.FailAttemptResponse{Execution: &executionv1.Execution{Id: in.GetExecutionId(),
		Status: executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING}}, nil
}

func (f *fakeSettlement) calls() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.settles), len(f.fails)
}

type bundle struct {
	schema     *dbtest.Schema
	client     adapterv1.AdapterCallbackServiceClient
	conn       *grpc.ClientConn
	settlement *fakeSettlement
}

// setup serves the callback service in-process on a localhost listener, over a schema of its own
// with the standard test catalog plus a second adapter, "other", serving "other.cap".
func setup(t *testing.T) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	_, err := s.Pool.Exec(context.Background(), `
		INSERT INTO adapters (id, name, endpoint, credential_hash) VALUES ('other', 'other', '127.0.0.1:1', sha256('other-credential'));
		INSERT INTO capabilities (name, adapter_id, modes) VALUES ('other.cap', 'other', ARRAY['async'])`)
	require.NoError(t, err)

	fake := &fakeSettlement{}
	st := store.New(s.Pool)
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: zaptest.NewLogger(t), Interceptors: []grpc.UnaryServerInterceptor{server.AuthInterceptor(st)}})
	adapterv1.RegisterAdapterCallbackServiceServer(srv, server.New(st, fake, func(d time.Duration) time.Duration { return d }, zaptest.NewLogger(t)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpcx.Dial(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &bundle{schema: s, client: adapterv1.NewAdapterCallbackServiceClient(conn), conn: conn, settlement: fake}
}

// token is the callback token of attempt n whose hash dbtest.InsertAttempts stores by default.
func token(id string, n int32) string { return fmt.Sprintf("%s/%d", id, n) }

// insert inserts e with the rows of attempts 1..e.Attempt, all ended as failed but the current
// one, which is open while the execution runs and ended with endedAs otherwise.
func (b *bundle) insert(t *testing.T, e dbtest.Execution, endedAs execution.AttemptOutcome) string {
	t.Helper()
	id := b.schema.InsertExecution(t, e)
	for i := int32(1); i <= e.Attempt; i++ {
		a := dbtest.Attempt{N: i, Outcome: execution.AttemptFailed, FailureClass: execution.ClassTransient}
		if i == e.Attempt {
			a = dbtest.Attempt{N: i, Outcome: endedAs}
		}
		b.schema.InsertAttempts(t, id, a)
	}
	return id
}

func (b *bundle) running(t *testing.T) string {
	t.Helper()
	return b.insert(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1}, "")
}

// late reads attempt n's late outcome ("" if none, or if there is no such attempt) and whether
// its time is set.
func (b *bundle) late(t *testing.T, id string, n int32) (string, bool) {
	t.Helper()
	var outcome *string
	var at *time.Time
	err := b.schema.Pool.QueryRow(context.Background(),
		`SELECT late_outcome, late_at FROM execution_attempts WHERE execution_id = $1 AND n = $2`, id, n).Scan(&outcome, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false
	}
	require.NoError(t, err)
	if outcome == nil {
		require.Nil(t, at)
		return "", false
	}
	return *outcome, at != nil
}

func (b *bundle) status(t *testing.T, id string) string {
	t.Helper()
	var st string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT status FROM executions WHERE id = $1`, id).Scan(&st))
	return st
}

func authed(cred string) context.Context {
	ctx := context.Background()
	if cred != "" {
		ctx = grpcx.WithBearer(ctx, cred)
	}
	return ctx
}

func succeeded() *adapterv1.CompleteRequest_Succeeded {
	return &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{Result: &structpb.Struct{}}}
}

// requireRefusal checks err's code, ErrorInfo reason and metadata (nil: none at all).
func requireRefusal(t *testing.T, err error, code codes.Code, reason string, metadata map[string]string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err), "%v", err)
	info := rpcstatus.ErrorInfo(err)
	require.NotNil(t, info, "the refusal carries an ErrorInfo")
	require.Equal(t, reason, info.GetReason())
	require.Equal(t, grpcx.ErrorDomain, info.GetDomain())
	if metadata == nil {
		require.Empty(t, info.GetMetadata(), "the refusal tells nothing of the execution")
		return
	}
	require.Equal(t, metadata, info.GetMetadata())
}

func TestCompleteRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)

	tests := []struct {
		name  string
		setup func(t *testing.T) (id string, n int32, tok, cred string)
		code  codes.Code
		// reason and metadata of the ErrorInfo (nil metadata: none).
		reason   string
		metadata func(id string) map[string]string
		// wantLate: the outcome is recorded on attempt n for audit.
		wantLate bool
	}{
		{name: "unknown credential",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.running(t)
				return id, 1, token(id, 1), "not-a-credential"
			},
			code: codes.Unauthenticated, reason: errorsv1.ErrorReason_INVALID_CALLBACK.String()},
		{name: "no credential",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.running(t)
				return id, 1, token(id, 1), ""
			},
			code: codes.Unauthenticated, reason: errorsv1.ErrorReason_INVALID_CALLBACK.String()},
		{name: "wrong token",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.running(t)
				return id, 1, "cbt_wrong", credential
			},
			code: codes.Unauthenticated, reason: errorsv1.ErrorReason_INVALID_CALLBACK.String()},
		{name: "wrong token for a settled execution records nothing",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.insert(t, dbtest.Execution{Status: execution.StatusSucceeded, Attempt: 1}, execution.AttemptSucceeded)
				return id, 1, "cbt_wrong", credential
			},
			code: codes.Unauthenticated, reason: errorsv1.ErrorReason_INVALID_CALLBACK.String()},
		{name: "unknown attempt",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.running(t)
				return id, 2, token(id, 2), credential
			},
			code: codes.Unauthenticated, reason: errorsv1.ErrorReason_INVALID_CALLBACK.String()},
		{name: "another adapter's execution",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.insert(t, dbtest.Execution{Capability: "other.cap", Status: execution.StatusRunning, Attempt: 1}, "")
				return id, 1, token(id, 1), credential
			},
			code: codes.PermissionDenied, reason: errorsv1.ErrorReason_FOREIGN_EXECUTION.String()},
		{name: "sync execution",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.insert(t, dbtest.Execution{Mode: execution.ModeSync, MaxAttempts: 1, Status: execution.StatusRunning, Attempt: 1}, "")
				return id, 1, token(id, 1), credential
			},
			code: codes.FailedPrecondition, reason: errorsv1.ErrorReason_SYNC_EXECUTION.String(),
			metadata: func(string) map[string]string { return map[string]string{"status": "running", "attempt": "1"} }},
		{name: "sync execution with a wrong token",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.insert(t, dbtest.Execution{Mode: execution.ModeSync, MaxAttempts: 1, Status: execution.StatusRunning, Attempt: 1}, "")
				return id, 1, "cbt_wrong", credential
			},
			code: codes.FailedPrecondition, reason: errorsv1.ErrorReason_SYNC_EXECUTION.String()},
		{name: "attempt superseded",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.insert(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 2}, "")
				return id, 1, token(id, 1), credential
			},
			code: codes.Aborted, reason: errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(),
			metadata: func(string) map[string]string { return map[string]string{"status": "running", "attempt": "2"} },
			wantLate: true},
		{name: "execution settled",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.insert(t, dbtest.Execution{Status: execution.StatusFailed, Attempt: 1}, execution.AttemptFailed)
				return id, 1, token(id, 1), credential
			},
			code: codes.Aborted, reason: errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(),
			metadata: func(string) map[string]string { return map[string]string{"status": "failed", "attempt": "1"} },
			wantLate: true},
		{name: "lease expired and swept: the next attempt is scheduled",
			setup: func(t *testing.T) (string, int32, string, string) {
				id := b.insert(t, dbtest.Execution{Status: execution.StatusPending, Attempt: 1}, execution.AttemptTimeout)
				return id, 1, token(id, 1), credential
			},
			code: codes.Aborted, reason: errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(),
			metadata: func(string) map[string]string { return map[string]string{"status": "pending", "attempt": "1"} },
			wantLate: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id, n, tok, cred := tt.setup(t)
			before := b.status(t, id)

			_, err := b.client.Complete(authed(cred), &adapterv1.CompleteRequest{ExecutionId: id, Attempt: n, CallbackToken: tok, Outcome: succeeded()})

			var metadata map[string]string
			if tt.metadata != nil {
				metadata = tt.metadata(id)
			}
			requireRefusal(t, err, tt.code, tt.reason, metadata)
			outcome, hasTime := b.late(t, id, n)
			if tt.wantLate {
				require.EqualValues(t, execution.AttemptSucceeded, outcome, "the late outcome is recorded for audit")
				require.True(t, hasTime)
			} else {
				require.Empty(t, outcome, "nothing is recorded")
			}
			require.Equal(t, before, b.status(t, id), "a refused outcome is never applied")
		})
	}
	settles, fails := b.settlement.calls()
	require.Zero(t, settles, "a refused callback reaches no settlement")
	require.Zero(t, fails)
}

func TestCompleteApplies(t *testing.T) {
	t.Parallel()
	b := setup(t)

	ok := b.running(t)
	resp, err := b.client.Complete(authed(credential), &adapterv1.CompleteRequest{ExecutionId: ok, Attempt: 1, CallbackToken: token(ok, 1), Outcome: succeeded()})
	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, resp.GetStatus())

	failed := b.running(t)
	resp, err = b.client.Complete(authed(credential), &adapterv1.CompleteRequest{ExecutionId: failed, Attempt: 1, CallbackToken: token(failed, 1),
		Outcome: &adapterv1.CompleteRequest_Failed{Failed: &adapterv1.Failed{Class: execution.ClassTransient, Retryable: true}}})
	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING, resp.GetStatus())

	b.settlement.mu.Lock()
	defer b.settlement.mu.Unlock()
	require.Len(t, b.settlement.settles, 1)
	require.Equal(t, ok, b.settlement.settles[0].GetExecutionId())
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING, b.settlement.settles[0].GetFromStatus())
	require.Len(t, b.settlement.fails, 1)
	require.Equal(t, failed, b.settlement.fails[0].GetExecutionId())
	for _, id := range []string{ok, failed} {
		outcome, _ := b.late(t, id, 1)
		require.Empty(t, outcome, "an outcome applied is not a late one")
	}
}

// The attempt was running when checked, but the sweeper (or a cancellation) settled it before
// the settlement service got the outcome: the outcome is late.
func TestCompleteLosingTheRaceIsALateOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.running(t)
	b.settlement.onSettle = func(in *settlementv1.SettleRequest) error {
		_, err := b.schema.Pool.Exec(context.Background(), `
			UPDATE executions SET status = 'failed', failure_reason = 'lease_expired', lease_expires_at = NULL, settled_at = now()
			WHERE id = $1`, in.GetExecutionId())
		if err != nil {
			return err
		}
		return grpcx.ToStatus(apperr.New(apperr.KindFailedPrecondition, "ALREADY_SETTLED", "execution already settled failed").
			With("status", "failed").With("attempt", "1")).Err()
	}

	_, err := b.client.Complete(authed(credential), &adapterv1.CompleteRequest{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1), Outcome: succeeded()})

	requireRefusal(t, err, codes.Aborted, errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(), map[string]string{"status": "failed", "attempt": "1"})
	outcome, hasTime := b.late(t, id, 1)
	require.EqualValues(t, execution.AttemptSucceeded, outcome)
	require.True(t, hasTime)
}

func TestLateOutcomeKeepsTheFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, dbtest.Execution{Status: execution.StatusSucceeded, Attempt: 1}, execution.AttemptSucceeded)
	for _, o := range []*adapterv1.CompleteRequest{
		{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1), Outcome: &adapterv1.CompleteRequest_Failed{Failed: &adapterv1.Failed{Class: "permanent"}}},
		{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1), Outcome: succeeded()},
	} {
		_, err := b.client.Complete(authed(credential), o)
		requireRefusal(t, err, codes.Aborted, errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(), map[string]string{"status": "succeeded", "attempt": "1"})
	}
	outcome, _ := b.late(t, id, 1)
	require.EqualValues(t, execution.AttemptFailed, outcome)
}

func TestRenewLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const slack = 5 * time.Second

	tests := []struct {
		name     string
		deadline time.Duration // from now; 0: a day
		ask      time.Duration
		want     time.Duration // from now
	}{
		{name: "zero: the capability's lease", ask: 0, want: dbtest.TestLease},
		{name: "shorter than the capability's", ask: 30 * time.Second, want: 30 * time.Second},
		{name: "longer than the capability's is capped", ask: time.Hour, want: dbtest.TestLease},
		{name: "never past the deadline", deadline: 40 * time.Second, ask: time.Minute, want: 40 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := dbtest.Execution{Status: execution.StatusRunning, Attempt: 1}
			if tt.deadline > 0 {
				e.Deadline = time.Now().Add(tt.deadline)
			}
			id := b.insert(t, e, "")

			before := time.Now()
			resp, err := b.client.RenewLease(authed(credential), &adapterv1.RenewLeaseRequest{ExecutionId: id, Attempt: 1,
				CallbackToken: token(id, 1), Lease: durationpb.New(tt.ask)})
			require.NoError(t, err)

			until := resp.GetLeaseExpireTime().AsTime()
			require.WithinRange(t, until, before.Add(tt.want-slack), time.Now().Add(tt.want+slack))
			var stored time.Time
			require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT lease_expires_at FROM executions WHERE id = $1`, id).Scan(&stored))
			require.WithinDuration(t, until, stored, time.Millisecond)
			require.InDelta(t, tt.want.Seconds(), resp.GetLease().AsDuration().Seconds(), slack.Seconds(),
				"the lease granted, as a duration")
		})
	}

	t.Run("lease expired", func(t *testing.T) {
		t.Parallel()
		id := b.insert(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1, LeaseExpiresAt: time.Now().Add(-time.Second)}, "")
		_, err := b.client.RenewLease(authed(credential), &adapterv1.RenewLeaseRequest{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1)})
		requireRefusal(t, err, codes.Aborted, errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(), map[string]string{"status": "running", "attempt": "1"})
	})
	t.Run("deadline passed", func(t *testing.T) {
		t.Parallel()
		id := b.insert(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1, Deadline: time.Now().Add(-time.Second)}, "")
		_, err := b.client.RenewLease(authed(credential), &adapterv1.RenewLeaseRequest{ExecutionId: id, Attempt: 1, CallbackToken: token(id, 1)})
		requireRefusal(t, err, codes.Aborted, errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(), map[string]string{"status": "running", "attempt": "1"})
	})
	t.Run("negative", func(t *testing.T) {
		t.Parallel()
		id := b.running(t)
		_, err := b.client.RenewLease(authed(credential), &adapterv1.RenewLeaseRequest{ExecutionId: id, Attempt: 1,
			CallbackToken: token(id, 1), Lease: durationpb.New(-time.Second)})
		require.Equal(t, codes.InvalidArgument, status.Code(err))
	})
}

func TestReportProgressRefusedOnceSettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, dbtest.Execution{Status: execution.StatusCancelled, Attempt: 1}, execution.AttemptCancelled)
	progress, err := structpb.NewStruct(map[string]any{"percent": 50})
	require.NoError(t, err)

	_, err = b.client.ReportProgress(authed(credential), &adapterv1.ReportProgressRequest{ExecutionId: id, Attempt: 1,
		CallbackToken: token(id, 1), Progress: progress})

	requireRefusal(t, err, codes.Aborted, errorsv1.ErrorReason_NO_LONGER_APPLICABLE.String(), map[string]string{"status": "cancelled", "attempt": "1"})
	outcome, _ := b.late(t, id, 1)
	require.Empty(t, outcome, "progress is not an outcome")
}
