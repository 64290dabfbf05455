package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/freeport"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// fakeSettlement stands in for the settlement service: it records each Settle and answers the
// queued errors first, then success.
type fakeSettlement struct {
	settlementv1.SettlementServiceClient

	mu      sync.Mutex
	errs    []error
	settles []*settlementv1.SettleRequest
	// onSettle, if set, runs before each answer (with the lock held).
	onSettle func(*settlementv1.SettleRequest)
	// downUntil, if set, makes every call fail UNAVAILABLE until then (as a stopped service).
	downUntil time.Time
	failures  []*settlementv1.FailAttemptRequest
	// recorded counts the settlements and attempt failures answered with success.
	recorded int
}

func (f *fakeSettlement) FailAttempt(_ context.Context, in *settlementv1.FailAttemptRequest, _ ...grpc.CallOption) (*settlementv1.FailAttemptResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Now().Before(f.downUntil) {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	f.failures = append(f.failures, in)
	f.recorded++
	return &settlementv1.FailAttemptResponse{Execution: &executionv1.Execution{Id: in.GetExecutionId(),
		Status: executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED, Attempt: in.GetAttempt(), Failure: in.GetFailure()}}, nil
}

func (f *fakeSettlement) Settle(_ context.Context, in *settlementv1.SettleRequest, _ ...grpc.CallOption) (*settlementv1.SettleResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settles = append(f.settles, in)
	if time.Now().Before(f.downUntil) {
		return nil, status.Error(codes.Unavailable, "dial tcp 127.0.0.1:9094: connection refused")
	}
	if f.onSettle != nil {
		f.onSettle(in)
	}
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return nil, err
	}
	f.recorded++
	return &settlementv1.SettleResponse{
		Execution: &executionv1.Execution{Id: in.GetExecutionId(), Status: in.GetStatus(), Attempt: in.GetAttempt(), Failure: in.GetFailure()},
		EventId:   "event-1",
	}, nil
}

func (f *fakeSettlement) requests() []*settlementv1.SettleRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*settlementv1.SettleRequest(nil), f.settles...)
}

// fakeAdapter completes every Execute and records the Cancel calls it gets.
type fakeAdapter struct {
	adapterv1.UnimplementedAdapterServiceServer
	mu      sync.Mutex
	cancels []*adapterv1.CancelRequest
}

func (f *fakeAdapter) Execute(context.Context, *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Completed{Completed: &adapterv1.Completed{}}}, nil
}

func (f *fakeAdapter) Cancel(_ context.Context, in *adapterv1.CancelRequest) (*adapterv1.CancelResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancels = append(f.cancels, in)
	return &adapterv1.CancelResponse{Stopped: true}, nil
}

func (f *fakeAdapter) requests() []*adapterv1.CancelRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*adapterv1.CancelRequest(nil), f.cancels...)
}

type bundle struct {
	schema     *dbtest.Schema
	server     *Server
	box        *secret.Box
	settlement *fakeSettlement
	adapter    *fakeAdapter
	ctx        context.Context // authenticated as dbtest.TestApp
}

func setup(t *testing.T) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)

	adapter := &fakeAdapter{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	adapterv1.RegisterAdapterServiceServer(srv, adapter)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	_, err = s.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, lis.Addr().String())
	require.NoError(t, err)

	pool := adaptercall.NewPool()
	t.Cleanup(func() { _ = pool.Close() })
	settlement := &fakeSettlement{}
	key := make([]byte, 32)
	_, err = rand.Read(key)
	require.NoError(t, err)
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", base64.StdEncoding.EncodeToString(key))
	require.NoError(t, err)
	server := New(store.New(s.Pool), pool, nil, settlement, box,
		Options{MaxPayloadBytes: 1 << 20, Scale: func(d time.Duration) time.Duration { return d },
			SecretRotationOverlap: testRotationOverlap}, zaptest.NewLogger(t))
	return &bundle{schema: s, server: server, box: box, settlement: settlement, adapter: adapter,
		ctx: context.WithValue(context.Background(), applicationKey{}, dbtest.TestApp)}
}

// code and reason are what a client would see of err.
func code(err error) (codes.Code, string) {
	st := grpcx.ToStatus(err)
	return st.Code(), rpcstatus.Reason(st.Err())
}

func TestCancelExecution(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  execution.Status
		attempt int32
		// wantStop: the adapter is asked to stop the attempt.
		wantStop bool
	}{
		{name: "pending before its first attempt", status: execution.StatusPending},
		{name: "pending between attempts", status: execution.StatusPending, attempt: 2},
		{name: "running", status: execution.StatusRunning, attempt: 2, wantStop: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.schema.InsertExecution(t, dbtest.Execution{Status: tt.status, Attempt: tt.attempt})

			resp, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})

			require.NoError(t, err)
			require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED, resp.GetExecution().GetStatus())
			settles := b.settlement.requests()
			require.Len(t, settles, 1)
			got := settles[0]
			require.Equal(t, id, got.GetExecutionId())
			require.Equal(t, tt.attempt, got.GetAttempt(), "settled at the attempt read")
			require.Equal(t, execution.StatusToProto(tt.status), got.GetFromStatus(), "settled from the status read")
			require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED, got.GetStatus())
			require.Equal(t, execution.ReasonCancelled, got.GetFailure().GetReason())

			cancels := b.adapter.requests()
			if !tt.wantStop {
				require.Empty(t, cancels)
				return
			}
			require.Len(t, cancels, 1)
			require.Equal(t, id, cancels[0].GetExecutionId())
			require.Equal(t, tt.attempt, cancels[0].GetAttempt())
		})
	}
}

func TestCancelExecutionRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.schema.Pool.Exec(context.Background(),
		`INSERT INTO applications (id, name, api_key_hash) VALUES ('other', 'other', sha256('other-key'))`)
	require.NoError(t, err)

	t.Run("already settled", func(t *testing.T) {
		t.Parallel()
		id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusSucceeded, Attempt: 2})
		_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})
		c, reason := code(err)
		require.Equal(t, codes.FailedPrecondition, c)
		require.Equal(t, errorsv1.ErrorReason_ALREADY_SETTLED.String(), reason)
		info := rpcstatus.ErrorInfo(grpcx.ToStatus(err).Err())
		require.Equal(t, map[string]string{"status": string(execution.StatusSucceeded), "attempt": "2"}, info.GetMetadata())
	})
	t.Run("another application's execution", func(t *testing.T) {
		t.Parallel()
		id := b.schema.InsertExecution(t, dbtest.Execution{Application: "other"})
		_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})
		c, _ := code(err)
		require.Equal(t, codes.NotFound, c)
	})
	t.Run("not an id", func(t *testing.T) {
		t.Parallel()
		_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: "nope"})
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c)
	})
}

func TestCancelExecutionLosingToACompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1})
	lost := grpcx.ToStatus(apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_ALREADY_SETTLED.String(), "execution already settled succeeded").
		With("status", string(execution.StatusSucceeded)).With("attempt", "1")).Err()
	b.settlement.errs = []error{lost}

	_, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})

	c, reason := code(err)
	require.Equal(t, codes.FailedPrecondition, c)
	require.Equal(t, errorsv1.ErrorReason_ALREADY_SETTLED.String(), reason, "the settlement service's refusal becomes the gateway's own")
	require.EqualValues(t, execution.StatusSucceeded, rpcstatus.ErrorInfo(grpcx.ToStatus(err).Err()).GetMetadata()["status"])
	require.Empty(t, b.adapter.requests(), "a cancellation that lost asks no adapter to stop")
}

func TestCancelExecutionReadsAgainWhenTheExecutionMoved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusPending})
	// Between the read and the settlement, attempt 1 started.
	moved := grpcx.ToStatus(apperr.New(apperr.KindAborted, errorsv1.ErrorReason_STALE_ATTEMPT.String(), "attempt 0 is not current")).Err()
	b.settlement.errs = []error{moved}
	_, err := b.schema.Pool.Exec(context.Background(), `UPDATE executions SET status = 'running', attempt = 1 WHERE id = $1`, id)
	require.NoError(t, err)

	_, err = b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})

	require.NoError(t, err)
	settles := b.settlement.requests()
	require.Len(t, settles, 2)
	require.Equal(t, int32(1), settles[1].GetAttempt())
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING, settles[1].GetFromStatus())
	require.Len(t, b.adapter.requests(), 1)
}

func TestCancelExecutionSettlesEvenIfTheAdapterIsGone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: 1})
	// Nothing listens there: the adapter cannot be told, which does not undo the cancellation.
	addr, err := freeport.Addr() // outside the ephemeral range: a closed port there can connect to itself
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, addr)
	require.NoError(t, err)

	resp, err := b.server.CancelExecution(b.ctx, &gatewayv1.CancelExecutionRequest{Id: id})

	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED, resp.GetExecution().GetStatus())
}

func TestGetExecutionShowsALateOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusFailed, Attempt: 1})
	b.schema.InsertAttempts(t, id, dbtest.Attempt{N: 1, Outcome: execution.AttemptTimeout, FailureClass: execution.ClassTimeout})
	_, err := b.schema.Pool.Exec(context.Background(),
		`UPDATE execution_attempts SET late_outcome = 'succeeded', late_at = now() WHERE execution_id = $1`, id)
	require.NoError(t, err)

	resp, err := b.server.GetExecution(b.ctx, &gatewayv1.GetExecutionRequest{Id: id})

	require.NoError(t, err)
	attempts := resp.GetExecution().GetAttempts()
	require.Len(t, attempts, 1)
	require.EqualValues(t, execution.AttemptTimeout, attempts[0].GetOutcome())
	require.EqualValues(t, execution.AttemptSucceeded, attempts[0].GetLateOutcome())
	require.NotNil(t, attempts[0].GetLateTime())
}

// A sync execution settled by someone else while its attempt ran (cancelled, or swept when its
// deadline passed): the caller gets the execution as settled, not an error.
func TestInvokeSyncSettledMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.schema.Pool.Exec(context.Background(), `UPDATE capabilities SET modes = ARRAY['async', 'sync']`)
	require.NoError(t, err)
	b.settlement.onSettle = func(in *settlementv1.SettleRequest) {
		_, err := b.schema.Pool.Exec(context.Background(), `
			UPDATE executions SET status = 'cancelled', failure_reason = 'cancelled', lease_expires_at = NULL, settled_at = now()
			WHERE id = $1`, in.GetExecutionId())
		require.NoError(t, err)
	}
	b.settlement.errs = []error{grpcx.ToStatus(apperr.New(apperr.KindFailedPrecondition, errorsv1.ErrorReason_ALREADY_SETTLED.String(),
		"execution already settled cancelled")).Err()}

	resp, err := b.server.InvokeCapability(b.ctx, &gatewayv1.InvokeCapabilityRequest{
		Capability: dbtest.TestCapability, Mode: executionv1.Mode_MODE_SYNC})

	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED, resp.GetExecution().GetStatus())
	require.Equal(t, execution.ReasonCancelled, resp.GetExecution().GetFailure().GetReason())
}

// TestSetConsumerWithUnreadableSecret: a signing secret sealed with a key this deployment does not
// hold (another environment's database, a key rotated out) is refused with a reason and a way
// out, not an internal error; rotating issues a readable one.
func TestSetConsumerWithUnreadableSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := make([]byte, 32)
	_, err := rand.Read(other)
	require.NoError(t, err)
	foreignBox, err := secret.NewBox("OTHER_KEY", base64.StdEncoding.EncodeToString(other))
	require.NoError(t, err)
	sealed, err := foreignBox.Seal([]byte("whsec_c29tZXRoaW5n"))
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(context.Background(), `UPDATE applications SET signing_secret_enc = $1 WHERE id = $2`, sealed, dbtest.TestApp)
	require.NoError(t, err)

	req := &gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Webhook{
		Webhook: &gatewayv1.WebhookConsumer{Url: "https://hooks.example.com/in"}}}
	_, err = b.server.SetConsumer(b.ctx, req)
	c, reason := code(err)
	require.Equal(t, codes.FailedPrecondition, c, "%v", err)
	require.Equal(t, "SIGNING_SECRET_UNREADABLE", reason)
	require.Contains(t, err.Error(), "rotate-secret")

	_, err = b.server.RotateSigningSecret(b.ctx, &gatewayv1.RotateSigningSecretRequest{})
	require.NoError(t, err)
	resp, err := b.server.SetConsumer(b.ctx, req)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(resp.GetSigningSecret(), "whsec_"))
}
