package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
)

// lifecycleCapabilities adds capabilities with other schedules to the dev catalog: dummy.fast
// retries every minute (60 ms time-scaled) up to the default ceiling of 10, so the ceiling binds
// before the budget; dummy.tight has a one-minute budget shorter than its retry delay; dummy.long
// allows leases of an hour (3.6 s scaled), so that renewals on a loaded machine have slack.
func lifecycleCapabilities(s *stack) string {
	return fmt.Sprintf(`
adapters:
  - id: dummy
    endpoint: %s
    credential: %s
capabilities:
  - name: dummy.fast
    adapter: dummy
    modes: [async]
    max_attempts: 10
    retry_delays: [1m]
  - name: dummy.tight
    adapter: dummy
    modes: [async]
    async_budget: 1m
    retry_delays: [2m]
  - name: dummy.long
    adapter: dummy
    modes: [async]
    lease: 1h
`, s.Addrs["dummy-adapter"], s.AdapterCredential)
}

func (s *stack) invoke(t *testing.T, capability, body string) string {
	t.Helper()
	code, resp := s.call(http.MethodPost, "/v1/capabilities/"+capability+":invoke", s.APIKey, []byte(body))
	require.Contains(t, []int{http.StatusOK, http.StatusAccepted}, code, "%v", resp)
	return execution(resp)["id"].(string)
}

// publishDispatch puts a dispatch message on the stack's executions queue, as the dispatcher
// does.
func (s *stack) publishDispatch(t *testing.T, executionID string, attempt int32, copies int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := mq.Dial(ctx, s.BrokerConfig())
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Declare(ctx, routes.Executions))
	body, err := proto.Marshal(&queuev1.ExecutionDispatch{ExecutionId: executionID, Attempt: attempt, DueTime: timestamppb.Now()})
	require.NoError(t, err)
	msgs := make([]mq.Outgoing, copies)
	for i := range msgs {
		msgs[i] = mq.Outgoing{ID: fmt.Sprintf("%s:%d", executionID, attempt), Body: body}
	}
	for _, err := range b.PublishAll(ctx, routes.Executions.Name, msgs) {
		require.NoError(t, err)
	}
}

// TestLifecycle proves the flow card's evidence for the execution lifecycle, each subtest named
// after it, on six service processes.
func TestLifecycle(t *testing.T) {
	s := newStack(t)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	r := newReceiver(t)
	r.register(t, s)

	t.Run("settles an execution whose next attempt is the eleventh failed, with the last class and retry_exhausted.attempt_limit", func(t *testing.T) {
		id := s.invoke(t, "dummy.fast", `{"mode": "MODE_ASYNC", "payload": {"dummy": {"fail_transient": 100}}}`)
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "failed", data["status"])
		assert.EqualValues(t, 10, data["attempt"])
		failure, _ := data["failure"].(map[string]any)
		assert.Equal(t, "transient", failure["class"], "the last attempt's class")
		assert.Equal(t, "retry_exhausted.attempt_limit", failure["reason"])
		assert.Equal(t, 10, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id))
		// ... and the ten attempts ran at the scheduled delay (1m, time-scaled to 60 ms).
		var shortest float64
		require.NoError(t, s.schema.Pool.QueryRow(context.Background(), `
			SELECT min(extract(epoch FROM next.started_at - prev.ended_at))
			FROM execution_attempts prev JOIN execution_attempts next
				ON next.execution_id = prev.execution_id AND next.n = prev.n + 1
			WHERE prev.execution_id = $1`, id).Scan(&shortest))
		// The consumer starts an arrival early by less than its tolerance (issue 13: a retry costs
		// one holding-queue hop), so an attempt may start a hair before its delay is over (measured
		// 29 µs early once); what must hold is that no attempt skipped its delay.
		assert.GreaterOrEqual(t, shortest, 0.055)
		assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM dispatches WHERE execution_id = $1`, id), "no eleventh attempt scheduled")
	})

	t.Run("budget exhaustion settles retry_exhausted.budget", func(t *testing.T) {
		id := s.invoke(t, "dummy.tight", `{"mode": "MODE_ASYNC", "payload": {"dummy": {"fail_transient": 5}}}`)
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "failed", data["status"])
		assert.EqualValues(t, 1, data["attempt"], "the retry would start past the deadline")
		failure, _ := data["failure"].(map[string]any)
		assert.Equal(t, "retry_exhausted.budget", failure["reason"])
		assert.Equal(t, "transient", failure["class"])
	})

	callbackConn := s.dialAs("adapter-callback", "")
	callbacks := adapterv1.NewAdapterCallbackServiceClient(callbackConn)

	t.Run("refuses a sync execution, which only the gateway settles", func(t *testing.T) {
		id := s.invoke(t, "dummy.echo", `{"mode": "MODE_SYNC", "payload": {"a": 1}}`)
		ctx := grpcx.WithBearer(context.Background(), s.AdapterCredential)
		_, err := callbacks.Complete(ctx, &adapterv1.CompleteRequest{
			ExecutionId: id, Attempt: 1, CallbackToken: "cbt_any",
			Outcome: &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{}},
		})
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		assert.Equal(t, "SYNC_EXECUTION", rpcstatus.Reason(err))

		_, err = callbacks.Complete(grpcx.WithBearer(context.Background(), "not-the-credential"), &adapterv1.CompleteRequest{
			ExecutionId: id, Attempt: 1, CallbackToken: "cbt_any"})
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "an unknown adapter credential")
	})

	t.Run("is written once for two settlements that both read the execution running, the loser moving nothing", func(t *testing.T) {
		s.startInstance("settlement-2", "settlement")
		var clients []settlementv1.SettlementServiceClient
		for _, name := range []string{"settlement", "settlement-2"} {
			conn := s.dialAs(name, "execution-consumer") // settling as the consumer would
			clients = append(clients, settlementv1.NewSettlementServiceClient(conn))
		}
		result, err := structpb.NewStruct(map[string]any{"from": "process"})
		require.NoError(t, err)
		wins := map[int]int{}
		for range 10 {
			id := s.schema.InsertExecution(t, dbtest.Execution{Application: "dev-app", Capability: "dummy.echo", Status: "running", Attempt: 1, MaxAttempts: 10})
			s.schema.InsertAttempts(t, id, dbtest.Attempt{N: 1})
			requests := []*settlementv1.SettleRequest{
				{ExecutionId: id, Attempt: 1, FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
					Status: executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, Result: result},
				{ExecutionId: id, Attempt: 1, FromStatus: executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
					Status:  executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED,
					Failure: &executionv1.Failure{Class: "permanent", Reason: "adapter.permanent"}},
			}
			errs := make([]error, 2)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, errs[i] = clients[i].Settle(context.Background(), requests[i])
				}()
			}
			close(start)
			wg.Wait()
			winner := -1
			for i, err := range errs {
				if err == nil {
					require.Equal(t, -1, winner, "two winners for %s", id)
					winner = i
					continue
				}
				assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
				assert.Equal(t, "ALREADY_SETTLED", rpcstatus.Reason(err), "the loser is told who won")
			}
			require.NotEqual(t, -1, winner, "no winner for %s: %v", id, errs)
			wins[winner]++
			assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id), "one completion event")
			want := []string{"succeeded", "failed"}[winner]
			assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM executions WHERE id = $1 AND status = $2`, id, want), "the winner's outcome")
		}
		t.Logf("wins by process: %v", wins)
	})

	t.Run("a duplicate or replayed execution message never starts an already claimed attempt", func(t *testing.T) {
		id := s.schema.InsertExecution(t, dbtest.Execution{Application: "dev-app", Capability: "dummy.echo", MaxAttempts: 10, Payload: `{"copy": true}`})
		s.publishDispatch(t, id, 1, 3)
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		require.Eventually(t, func() bool {
			return strings.Count(s.Log("execution-consumer"), `"execution_id":"`+id+`"`) >= 3
		}, 10*time.Second, 20*time.Millisecond, "all three copies were handled")
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id), "exactly one attempt")
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, id))
	})

	t.Run("publish followed by a failed dispatch-row delete causes no second attempt", func(t *testing.T) {
		id := s.schema.InsertExecution(t, dbtest.Execution{Application: "dev-app", Capability: "dummy.echo", MaxAttempts: 10, Payload: `{"twice": true}`})
		// The dispatcher published attempt 1, then failed to delete its row: the row is still
		// there and will be published again.
		s.publishDispatch(t, id, 1, 1)
		_, err := s.schema.Pool.Exec(context.Background(), `INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, 1, now())`, id)
		require.NoError(t, err)
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		require.Eventually(t, func() bool {
			return s.count(t, `SELECT count(*) FROM dispatches WHERE execution_id = $1`, id) == 0
		}, 10*time.Second, 20*time.Millisecond, "the leftover row is published again and deleted")
		require.Eventually(t, func() bool {
			return strings.Count(s.Log("execution-consumer"), `"execution_id":"`+id+`"`) >= 2
		}, 10*time.Second, 20*time.Millisecond, "the second copy reached the consumer")
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id), "one attempt")
	})

	t.Run("long-running work: accepted, leases renewed, progress visible, completed by callback, event delivered", func(t *testing.T) {
		// Renewed every 300 ms under a 900 ms lease for 2 s: a renewal may be 600 ms late on a
		// loaded machine before the lease would expire.
		id := s.invoke(t, "dummy.long", `{"mode": "MODE_ASYNC", "payload": {"export": "all", "dummy": {"complete_later_ms": 2000, "lease_ms": 900}}}`)
		require.Eventually(t, func() bool {
			_, body := s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
			p, _ := execution(body)["progress"].(map[string]any)
			return p["percent"] == float64(50) && execution(body)["status"] == "EXECUTION_STATUS_RUNNING"
		}, 10*time.Second, 20*time.Millisecond, "progress is visible while the work runs")
		data := r.await(t, id).Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		assert.EqualValues(t, 1, data["attempt"])
		renewals := strings.Count(s.Log("adapter-callback"), "AdapterCallbackService/RenewLease")
		assert.GreaterOrEqual(t, renewals, 3, "a 2 s task under a 900 ms lease is renewed")
	})
}
