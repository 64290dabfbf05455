package store

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// insertRunningAs inserts e running at attempt n, with the rows of attempts 1..n as insertRunning
// does, and returns its id.
func (b *bundle) insertRunningAs(t *testing.T, n int32, e dbtest.Execution) string {
	t.Helper()
	e.Status, e.Attempt = execution.StatusRunning, n
	id := b.schema.InsertExecution(t, e)
	for i := int32(1); i <= n; i++ {
		a := dbtest.Attempt{N: i}
		if i < n {
			a.Outcome, a.FailureClass = "failed", execution.ClassTransient
		}
		b.schema.InsertAttempts(t, id, a)
	}
	return id
}

func expired() time.Time { return time.Now().Add(-time.Second) }

func TestExecutionSweepSchedulesTheNextAttemptOfAnExpiredLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertRunningAs(t, 1, dbtest.Execution{LeaseExpiresAt: expired()})

	before := time.Now()
	swept, err := b.store.ExecutionSweep(context.Background(), 10, 0, identity)
	after := time.Now()
	require.NoError(t, err)

	require.Len(t, swept, 1)
	sw := swept[0]
	require.NoError(t, sw.Err)
	require.Equal(t, id, sw.ExecutionID)
	require.Equal(t, int32(1), sw.Attempt)
	require.Equal(t, SweptLeaseExpired, sw.Cause)
	require.NotNil(t, sw.Result.NextAttemptAt)

	row := b.execution(t, id)
	require.Equal(t, execution.StatusPending, row.Status)
	require.Equal(t, execution.ClassTimeout, *row.FailureClass)
	require.Nil(t, row.FailureReason)
	require.Nil(t, row.LeaseExpiresAt)
	att := b.attempts(t, id)
	require.Len(t, att, 1)
	require.NotNil(t, att[0].EndedAt)
	require.Equal(t, execution.AttemptTimeout, *att[0].Outcome)
	require.Equal(t, execution.ClassTimeout, *att[0].FailureClass)

	ds := b.dispatches(t, id)
	require.Len(t, ds, 1, "one dispatch record, for attempt 2")
	require.Equal(t, int32(2), ds[0].Attempt)
	delay := dbtest.TestRetryDelays()[0]
	require.WithinRange(t, ds[0].DueAt, before.Add(delay-5*time.Second), after.Add(delay+5*time.Second))
	require.Empty(t, b.events(t, id))

	again, err := b.store.ExecutionSweep(context.Background(), 10, 0, identity)
	require.NoError(t, err)
	require.Empty(t, again, "a swept execution is not swept again")
}

func TestExecutionSweepSettlesWhenNoRetryIsLeft(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		attempt    int32
		execution  dbtest.Execution
		wantCause  string
		wantReason string
	}{
		{name: "expired lease at the attempt ceiling", attempt: maxAttempts,
			execution: dbtest.Execution{LeaseExpiresAt: expired()},
			wantCause: SweptLeaseExpired, wantReason: execution.ReasonLeaseExpired},
		{name: "expired lease with the next attempt past the deadline", attempt: 1,
			execution: dbtest.Execution{LeaseExpiresAt: expired(), Deadline: time.Now().Add(30 * time.Second)},
			wantCause: SweptLeaseExpired, wantReason: execution.ReasonLeaseExpired},
		{name: "deadline passed under a live lease", attempt: 1,
			execution: dbtest.Execution{Deadline: expired()},
			wantCause: SweptDeadlinePassed, wantReason: execution.ReasonBudget},
		{name: "deadline passed at the attempt ceiling", attempt: maxAttempts,
			execution: dbtest.Execution{Deadline: expired(), LeaseExpiresAt: expired()},
			wantCause: SweptDeadlinePassed, wantReason: execution.ReasonBudget},
		{name: "sync execution past its lease, which is its deadline", attempt: 1,
			execution: dbtest.Execution{Mode: execution.ModeSync, MaxAttempts: 1, Deadline: expired(), LeaseExpiresAt: expired()},
			wantCause: SweptLeaseExpired, wantReason: execution.ReasonLeaseExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.insertRunningAs(t, tt.attempt, tt.execution)

			swept, err := b.store.ExecutionSweep(context.Background(), 10, 0, identity)
			require.NoError(t, err)

			require.Len(t, swept, 1)
			sw := swept[0]
			require.NoError(t, sw.Err)
			require.Equal(t, tt.wantCause, sw.Cause)
			require.Nil(t, sw.Result.NextAttemptAt)
			require.NotEmpty(t, sw.Result.EventID)

			row := b.execution(t, id)
			require.Equal(t, execution.StatusFailed, row.Status)
			require.Equal(t, execution.ClassTimeout, *row.FailureClass)
			require.Equal(t, tt.wantReason, *row.FailureReason)
			require.NotNil(t, row.SettledAt)
			require.Nil(t, row.LeaseExpiresAt)
			att := b.attempts(t, id)
			require.Len(t, att, int(tt.attempt))
			require.Equal(t, execution.AttemptTimeout, *att[len(att)-1].Outcome)
			require.NotNil(t, att[len(att)-1].EndedAt)
			require.Empty(t, b.dispatches(t, id))

			evs := b.events(t, id)
			require.Len(t, evs, 1, "exactly one completion event")
			require.Equal(t, sw.Result.EventID, evs[0].ID)
			var payload struct {
				Data struct {
					Status  string `json:"status"`
					Failure struct {
						Class  string `json:"class"`
						Reason string `json:"reason"`
					} `json:"failure"`
				} `json:"data"`
			}
			require.NoError(t, json.Unmarshal(evs[0].Payload, &payload))
			require.EqualValues(t, execution.StatusFailed, payload.Data.Status)
			require.Equal(t, execution.ClassTimeout, payload.Data.Failure.Class)
			require.Equal(t, tt.wantReason, payload.Data.Failure.Reason)
		})
	}
}

func TestExecutionSweepLeavesLiveWorkAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	running := b.insertRunningAs(t, 1, dbtest.Execution{})
	pending := b.schema.InsertExecution(t, dbtest.Execution{Deadline: expired()})
	settled := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusSucceeded, Attempt: 1, Deadline: expired()})
	ids := []string{running, pending, settled}
	var before []*execution.Row
	for _, id := range ids {
		before = append(before, b.execution(t, id))
	}

	swept, err := b.store.ExecutionSweep(context.Background(), 10, 0, identity)
	require.NoError(t, err)
	require.Empty(t, swept)
	for i, id := range ids {
		require.Equal(t, before[i], b.execution(t, id))
		require.Empty(t, b.events(t, id))
		require.Empty(t, b.dispatches(t, id))
	}
	require.Nil(t, b.attempts(t, running)[0].EndedAt)
}

// Two sweepers over the same expired executions, as two replicas would be: every execution is
// handled exactly once — one event per settled execution, one dispatch record per retried one.
func TestExecutionSweepConcurrentSweepersHandleEachExecutionOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 50
	retry, settle := map[string]bool{}, map[string]bool{}
	for i := range n {
		if i%2 == 0 {
			retry[b.insertRunningAs(t, 1, dbtest.Execution{LeaseExpiresAt: expired()})] = true
		} else {
			settle[b.insertRunningAs(t, maxAttempts, dbtest.Execution{LeaseExpiresAt: expired()})] = true
		}
	}

	start := make(chan struct{})
	results := make([][]Swept, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			<-start
			for {
				list, err := b.store.ExecutionSweep(ctx, 7, 0, identity)
				if err != nil {
					errs[i] = err
					return
				}
				if len(list) == 0 {
					return
				}
				results[i] = append(results[i], list...)
			}
		})
	}
	close(start)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])

	seen := map[string]int{}
	for _, list := range results {
		for _, sw := range list {
			require.NoError(t, sw.Err)
			seen[sw.ExecutionID]++
		}
	}
	require.Len(t, seen, n)
	for id, count := range seen {
		require.Equal(t, 1, count, "execution %s swept %d times", id, count)
	}
	t.Logf("sweeper 1 took %d, sweeper 2 took %d", len(results[0]), len(results[1]))

	for id := range retry {
		require.Equal(t, execution.StatusPending, b.execution(t, id).Status)
		ds := b.dispatches(t, id)
		require.Len(t, ds, 1)
		require.Equal(t, int32(2), ds[0].Attempt)
		require.Empty(t, b.events(t, id))
	}
	for id := range settle {
		row := b.execution(t, id)
		require.Equal(t, execution.StatusFailed, row.Status)
		require.Equal(t, execution.ReasonLeaseExpired, *row.FailureReason)
		require.Len(t, b.events(t, id), 1)
		require.Empty(t, b.dispatches(t, id))
	}
	var events, dispatches int
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM integration_events), (SELECT count(*) FROM dispatches)`).Scan(&events, &dispatches))
	require.Equal(t, n/2, events)
	require.Equal(t, n/2, dispatches)
}

func TestExecutionSweepWaitsOutTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertRunningAs(t, 1, dbtest.Execution{LeaseExpiresAt: expired()})

	swept, err := b.store.ExecutionSweep(context.Background(), 10, time.Hour, identity)
	require.NoError(t, err)
	require.Empty(t, swept, "a lease expired a second ago is within an hour's grace")
	require.Equal(t, execution.StatusRunning, b.execution(t, id).Status)

	swept, err = b.store.ExecutionSweep(context.Background(), 10, 100*time.Millisecond, identity)
	require.NoError(t, err)
	require.Len(t, swept, 1, "past the grace it is swept")
}

func TestExecutionSweepStrandedSettlesPendingPastDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	past := time.Now().Add(-time.Minute)
	stranded := b.schema.InsertExecution(t, dbtest.Execution{Attempt: 1, Deadline: past})
	b.schema.InsertAttempts(t, stranded, dbtest.Attempt{N: 1, Outcome: "failed", FailureClass: execution.ClassTransient})
	_, err := b.schema.Pool.Exec(ctx, `UPDATE executions SET failure_class = 'transient' WHERE id = $1`, stranded)
	require.NoError(t, err)
	waiting := b.schema.InsertExecution(t, dbtest.Execution{Attempt: 1, Deadline: past})
	_, err = b.schema.Pool.Exec(ctx, `INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, 2, now())`, waiting)
	require.NoError(t, err)
	inTime := b.schema.InsertExecution(t, dbtest.Execution{Attempt: 1})

	swept, err := b.store.ExecutionSweepStranded(ctx, 10, time.Second)
	require.NoError(t, err)
	require.Len(t, swept, 1)
	require.NoError(t, swept[0].Err)
	require.Equal(t, stranded, swept[0].ExecutionID)
	row := b.execution(t, stranded)
	require.Equal(t, execution.StatusFailed, row.Status)
	require.Equal(t, execution.ReasonBudget, *row.FailureReason)
	require.Equal(t, execution.ClassTransient, *row.FailureClass, "the last attempt's class")
	var events int
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM integration_events WHERE execution_id = $1`, stranded).Scan(&events))
	require.Equal(t, 1, events)
	require.Equal(t, execution.StatusPending, b.execution(t, waiting).Status, "a dispatch record still waits for it")
	require.Equal(t, execution.StatusPending, b.execution(t, inTime).Status, "its deadline has not passed")

	again, err := b.store.ExecutionSweepStranded(ctx, 10, time.Second)
	require.NoError(t, err)
	require.Empty(t, again)
}
