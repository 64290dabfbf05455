package store

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// maxAttempts is the test catalog's attempt ceiling.
const maxAttempts = dbtest.TestMaxAttempts

type bundle struct {
	schema *dbtest.Schema
	store  *Store
}

// setup applies the standard test catalog, whose retry delays (1m, 5m) and attempt ceiling the
// AttemptFail cases expect.
func setup(t *testing.T) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	return &bundle{schema: s, store: New(s.Pool)}
}

// insertRunning inserts an async execution running at attempt n, with the rows of attempts
// 1..n (the earlier ones ended as failed), and returns its id.
func (b *bundle) insertRunning(t *testing.T, n int32, deadline time.Time) string {
	t.Helper()
	id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: n, Deadline: deadline})
	for i := int32(1); i <= n; i++ {
		a := dbtest.Attempt{N: i}
		if i < n {
			a.Outcome, a.FailureClass = "failed", execution.ClassTransient
		}
		b.schema.InsertAttempts(t, id, a)
	}
	return id
}

func (b *bundle) execution(t *testing.T, id string) *execution.Row {
	t.Helper()
	row, err := execution.Scan(b.schema.Pool.QueryRow(context.Background(),
		`SELECT `+execution.Columns+` FROM executions WHERE id = $1`, id))
	require.NoError(t, err)
	return row
}

func (b *bundle) attempts(t *testing.T, id string) []execution.AttemptRow {
	t.Helper()
	rows, err := b.schema.Pool.Query(context.Background(),
		`SELECT `+execution.AttemptColumns+` FROM execution_attempts WHERE execution_id = $1 ORDER BY n`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []execution.AttemptRow
	for rows.Next() {
		a, err := execution.ScanAttempt(rows)
		require.NoError(t, err)
		out = append(out, a)
	}
	require.NoError(t, rows.Err())
	return out
}

type event struct {
	ID      string
	Type    string
	Payload []byte
}

func (b *bundle) events(t *testing.T, id string) []event {
	t.Helper()
	rows, err := b.schema.Pool.Query(context.Background(),
		`SELECT id::text, type, payload FROM integration_events WHERE execution_id = $1`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []event
	for rows.Next() {
		var e event
		require.NoError(t, rows.Scan(&e.ID, &e.Type, &e.Payload))
		out = append(out, e)
	}
	require.NoError(t, rows.Err())
	return out
}

type dispatch struct {
	Attempt int32
	DueAt   time.Time
}

func (b *bundle) dispatches(t *testing.T, id string) []dispatch {
	t.Helper()
	rows, err := b.schema.Pool.Query(context.Background(),
		`SELECT attempt, due_at FROM dispatches WHERE execution_id = $1 ORDER BY attempt`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []dispatch
	for rows.Next() {
		var d dispatch
		require.NoError(t, rows.Scan(&d.Attempt, &d.DueAt))
		out = append(out, d)
	}
	require.NoError(t, rows.Err())
	return out
}

func dayFromNow() time.Time { return time.Now().Add(24 * time.Hour) }

func identity(d time.Duration) time.Duration { return d }

func TestExecutionSettleRaceHasOneWinner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	const rounds = 20
	winners := map[execution.Status]int{}
	for range rounds {
		id := b.insertRunning(t, 1, dayFromNow())
		outcomes := []Outcome{
			{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning, Status: execution.StatusSucceeded,
				Result: []byte(`{"echo":"hi"}`)},
			{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning, Status: execution.StatusFailed,
				Failure: execution.Failure{Class: execution.ClassPermanent, Reason: execution.ReasonAdapterPermanent,
					Code: "BAD_INPUT", Message: "no"}},
		}

		start := make(chan struct{})
		settled := make([]*Settled, len(outcomes))
		errs := make([]error, len(outcomes))
		var wg sync.WaitGroup
		for i, o := range outcomes {
			wg.Go(func() {
				<-start
				settled[i], errs[i] = b.store.ExecutionSettle(ctx, o)
			})
		}
		close(start)
		wg.Wait()

		var winner, loser int
		switch {
		case errs[0] == nil && errs[1] != nil:
			winner, loser = 0, 1
		case errs[1] == nil && errs[0] != nil:
			winner, loser = 1, 0
		default:
			t.Fatalf("want exactly one winner, got errors %v and %v", errs[0], errs[1])
		}
		want := outcomes[winner].Status
		winners[want]++

		var conflict *ConflictError
		require.ErrorAs(t, errs[loser], &conflict)
		require.Equal(t, want, conflict.Status, "the loser is told the winner's status")
		require.Equal(t, int32(1), conflict.Attempt)
		require.Nil(t, settled[loser])

		require.NotNil(t, settled[winner])
		require.Equal(t, want, settled[winner].Execution.Status)

		row := b.execution(t, id)
		require.Equal(t, want, row.Status)
		require.NotNil(t, row.SettledAt)
		require.Nil(t, row.LeaseExpiresAt)
		if want == execution.StatusSucceeded {
			require.JSONEq(t, `{"echo":"hi"}`, string(row.Result))
			require.Nil(t, row.FailureReason)
		} else {
			require.Nil(t, row.Result)
			require.Equal(t, execution.ReasonAdapterPermanent, *row.FailureReason)
		}

		evs := b.events(t, id)
		require.Len(t, evs, 1, "exactly one completion event")
		require.Equal(t, settled[winner].EventID, evs[0].ID)
		require.Equal(t, execution.EventTypeExecutionComplete, evs[0].Type)
		var payload struct {
			ID   string `json:"id"`
			Data struct {
				ExecutionID string `json:"execution_id"`
				Status      string `json:"status"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(evs[0].Payload, &payload))
		require.Equal(t, evs[0].ID, payload.ID)
		require.Equal(t, id, payload.Data.ExecutionID)
		require.EqualValues(t, want, payload.Data.Status)

		att := b.attempts(t, id)
		require.Len(t, att, 1)
		require.NotNil(t, att[0].EndedAt)
		require.EqualValues(t, want, *att[0].Outcome)
	}
	t.Logf("winners over %d rounds: %v", rounds, winners)
}

func TestExecutionSettleStaleAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insertRunning(t, 2, dayFromNow())
	before, beforeAttempts := b.execution(t, id), b.attempts(t, id)

	out, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning,
		Status: execution.StatusSucceeded, Result: []byte(`{}`)})
	require.Nil(t, out)
	var conflict *ConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, Conflict{Status: execution.StatusRunning, Attempt: 2}, conflict.Conflict)

	require.Equal(t, before, b.execution(t, id), "nothing changed")
	require.Equal(t, beforeAttempts, b.attempts(t, id))
	require.Empty(t, b.events(t, id))
}

func TestExecutionSettleUnknownExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.store.ExecutionSettle(context.Background(), Outcome{ExecutionID: uuid.NewString(), Attempt: 1,
		FromStatus: execution.StatusRunning, Status: execution.StatusSucceeded, Result: []byte(`{}`)})
	require.ErrorIs(t, err, ErrNotFound)
}

func TestAttemptFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const slack = 5 * time.Second

	tests := []struct {
		name       string
		attempt    int32
		deadline   time.Duration // from now
		retryable  bool
		retryAfter time.Duration
		// A retry: the next attempt's dispatch due after wantDelay.
		wantDelay time.Duration
		// A settlement: failed with wantReason.
		wantReason string
	}{
		{name: "retryable at attempt 1: the first delay", attempt: 1, deadline: 24 * time.Hour, retryable: true,
			wantDelay: time.Minute},
		{name: "retryable at attempt 2: the second delay", attempt: 2, deadline: 24 * time.Hour, retryable: true,
			wantDelay: 5 * time.Minute},
		{name: "retry_after longer than the delay wins", attempt: 1, deadline: 24 * time.Hour, retryable: true,
			retryAfter: 10 * time.Minute, wantDelay: 10 * time.Minute},
		{name: "retry_after shorter than the delay loses", attempt: 1, deadline: 24 * time.Hour, retryable: true,
			retryAfter: time.Second, wantDelay: time.Minute},
		{name: "at the attempt ceiling", attempt: maxAttempts, deadline: 24 * time.Hour, retryable: true,
			wantReason: execution.ReasonAttemptLimit},
		{name: "not retryable", attempt: 1, deadline: 24 * time.Hour, retryable: false,
			wantReason: execution.ReasonAdapterPermanent},
		{name: "next attempt past the deadline", attempt: 1, deadline: 30 * time.Second, retryable: true,
			wantReason: execution.ReasonBudget},
		{name: "retry_after past the deadline", attempt: 1, deadline: time.Hour, retryable: true,
			retryAfter: 2 * time.Hour, wantReason: execution.ReasonBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := b.insertRunning(t, tt.attempt, time.Now().Add(tt.deadline))
			failure := execution.Failure{Class: execution.ClassTransient, Code: "UPSTREAM_503", Message: "upstream busy"}
			if !tt.retryable {
				failure.Class = execution.ClassPermanent
			}

			before := time.Now()
			out, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: id, Attempt: tt.attempt, Failure: failure,
				Retryable: tt.retryable, RetryAfter: tt.retryAfter, Scale: identity})
			after := time.Now()
			require.NoError(t, err)

			row := b.execution(t, id)
			require.Equal(t, tt.attempt, row.Attempt)
			require.Equal(t, failure.Class, *row.FailureClass)
			require.Equal(t, failure.Code, *row.FailureCode)
			require.Equal(t, failure.Message, *row.FailureMessage)
			require.Nil(t, row.LeaseExpiresAt)
			att := b.attempts(t, id)
			require.Len(t, att, int(tt.attempt))
			last := att[len(att)-1]
			require.NotNil(t, last.EndedAt, "the attempt is closed")
			require.Equal(t, execution.AttemptFailed, *last.Outcome)
			require.Equal(t, failure.Class, *last.FailureClass)

			if tt.wantReason == "" {
				require.Equal(t, execution.StatusPending, row.Status)
				require.Nil(t, row.FailureReason)
				require.Nil(t, row.SettledAt)
				require.NotNil(t, out.NextAttemptAt)
				require.Empty(t, out.EventID)

				ds := b.dispatches(t, id)
				require.Len(t, ds, 1)
				require.Equal(t, tt.attempt+1, ds[0].Attempt)
				require.WithinRange(t, ds[0].DueAt, before.Add(tt.wantDelay-slack), after.Add(tt.wantDelay+slack))
				require.WithinDuration(t, *out.NextAttemptAt, ds[0].DueAt, time.Millisecond)
				require.Empty(t, b.events(t, id))
				return
			}

			require.Equal(t, execution.StatusFailed, row.Status)
			require.Equal(t, tt.wantReason, *row.FailureReason)
			require.NotNil(t, row.SettledAt)
			require.Nil(t, out.NextAttemptAt)
			require.Empty(t, b.dispatches(t, id), "no next attempt")
			evs := b.events(t, id)
			require.Len(t, evs, 1)
			require.Equal(t, out.EventID, evs[0].ID)
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
			require.Equal(t, tt.wantReason, payload.Data.Failure.Reason)
			require.Equal(t, failure.Class, payload.Data.Failure.Class)
		})
	}
}

func TestAttemptFailScalesTheDelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertRunning(t, 1, dayFromNow())

	before := time.Now()
	out, err := b.store.AttemptFail(context.Background(), AttemptFailure{ExecutionID: id, Attempt: 1,
		Failure: execution.Failure{Class: execution.ClassTransient}, Retryable: true,
		Scale: func(d time.Duration) time.Duration { return d / 1000 }})
	require.NoError(t, err)
	require.NotNil(t, out.NextAttemptAt)
	require.WithinRange(t, *out.NextAttemptAt, before.Add(60*time.Millisecond), time.Now().Add(60*time.Millisecond))
}

func TestAttemptFailRefusesAnAttemptThatIsNotRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("stale attempt", func(t *testing.T) {
		t.Parallel()
		id := b.insertRunning(t, 2, dayFromNow())
		before := b.execution(t, id)
		_, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: id, Attempt: 1,
			Failure: execution.Failure{Class: execution.ClassTransient}, Retryable: true, Scale: identity})
		var conflict *ConflictError
		require.ErrorAs(t, err, &conflict)
		require.Equal(t, Conflict{Status: execution.StatusRunning, Attempt: 2}, conflict.Conflict)
		require.Equal(t, before, b.execution(t, id))
		require.Empty(t, b.dispatches(t, id))
		require.Empty(t, b.events(t, id))
	})
	t.Run("already settled", func(t *testing.T) {
		t.Parallel()
		id := b.insertRunning(t, 1, dayFromNow())
		_, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning,
			Status: execution.StatusSucceeded, Result: []byte(`{}`)})
		require.NoError(t, err)
		_, err = b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: id, Attempt: 1,
			Failure: execution.Failure{Class: execution.ClassTransient}, Retryable: true, Scale: identity})
		var conflict *ConflictError
		require.ErrorAs(t, err, &conflict)
		require.Equal(t, execution.StatusSucceeded, conflict.Status)
		require.Len(t, b.events(t, id), 1)
		require.Empty(t, b.dispatches(t, id))
	})
	t.Run("unknown execution", func(t *testing.T) {
		t.Parallel()
		_, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: uuid.NewString(), Attempt: 1,
			Failure: execution.Failure{Class: execution.ClassTransient}, Retryable: true, Scale: identity})
		require.True(t, errors.Is(err, ErrNotFound), "got %v", err)
	})
}

// A cancellation is the same compare-and-set from the status the canceller read: pending (its
// waiting dispatch record goes with it) or running (its attempt is closed as cancelled).
func TestExecutionSettleCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cancelled := execution.Failure{Reason: execution.ReasonCancelled, Message: "cancelled by the application"}

	t.Run("pending", func(t *testing.T) {
		t.Parallel()
		id := b.schema.InsertExecution(t, dbtest.Execution{})
		_, err := b.schema.Pool.Exec(ctx, `INSERT INTO dispatches (execution_id, attempt) VALUES ($1, 1)`, id)
		require.NoError(t, err)

		out, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 0, FromStatus: execution.StatusPending,
			Status: execution.StatusCancelled, Failure: cancelled})

		require.NoError(t, err)
		require.Equal(t, execution.StatusCancelled, out.Execution.Status)
		require.Equal(t, execution.ReasonCancelled, *out.Execution.FailureReason)
		require.Empty(t, b.dispatches(t, id), "the next attempt will not start")
		require.Len(t, b.events(t, id), 1, "a cancelled execution still gets its completion event")
	})
	t.Run("running", func(t *testing.T) {
		t.Parallel()
		id := b.insertRunning(t, 2, dayFromNow())

		_, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 2, FromStatus: execution.StatusRunning,
			Status: execution.StatusCancelled, Failure: cancelled})

		require.NoError(t, err)
		att := b.attempts(t, id)
		require.Equal(t, execution.AttemptCancelled, *att[1].Outcome)
		require.NotNil(t, att[1].EndedAt)
		require.Len(t, b.events(t, id), 1)
	})
	t.Run("pending, read before the attempt started", func(t *testing.T) {
		t.Parallel()
		id := b.insertRunning(t, 1, dayFromNow())

		_, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 0, FromStatus: execution.StatusPending,
			Status: execution.StatusCancelled, Failure: cancelled})

		var conflict *ConflictError
		require.ErrorAs(t, err, &conflict)
		require.Equal(t, Conflict{Status: execution.StatusRunning, Attempt: 1}, conflict.Conflict)
		require.Empty(t, b.events(t, id))
	})
}
