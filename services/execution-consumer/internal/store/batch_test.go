package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestAttemptStartBatchEachRowItsOwnAnswer: one batch — one statement — holding two startable
// executions and rows that are not: already started, settled, early, past the deadline, unknown,
// a second copy of a startable one. The startable ones start; each other row gets its own answer
// and changes nothing.
func TestAttemptStartBatchEachRowItsOwnAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A wide tolerance, so that "early by less than it" holds however slow the machine.
	b.store.WithEarlyTolerance(10 * time.Second)
	ctx := context.Background()
	var dbNow time.Time
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow))

	first := b.insert(t, "pending", 0)
	retry := b.insert(t, "pending", 1)
	running := b.insert(t, "running", 1)
	settled := b.insert(t, "succeeded", 1)
	early := b.insert(t, "pending", 0)
	justEarly := b.insert(t, "pending", 0)
	past := b.schema.InsertExecution(t, dbtest.Execution{Status: "pending", Deadline: dbNow.Add(-time.Second)})
	untouched := map[string]state{}
	for _, id := range []string{running, settled, early, past} {
		untouched[id] = b.state(t, id)
	}

	reqs := []startRequest{
		{id: first, n: 1, tokenHash: tokenHash("first"), scale: 1},
		{id: running, n: 1, tokenHash: tokenHash("running"), scale: 1},
		{id: retry, n: 2, tokenHash: tokenHash("retry"), scale: 1, due: dbNow.Add(-time.Second)},
		{id: settled, n: 2, tokenHash: tokenHash("settled"), scale: 1},
		{id: early, n: 1, tokenHash: tokenHash("early"), scale: 1, due: dbNow.Add(time.Hour)},
		{id: past, n: 1, tokenHash: tokenHash("past"), scale: 1},
		{id: uuid.NewString(), n: 1, tokenHash: tokenHash("unknown"), scale: 1},
		{id: first, n: 1, tokenHash: tokenHash("copy"), scale: 1},
		// Early by less than the tolerance: started.
		{id: justEarly, n: 1, tokenHash: tokenHash("just"), scale: 1, due: dbNow.Add(5 * time.Second)},
	}
	answers, errs, err := b.store.startBatch(ctx, reqs)
	require.NoError(t, err)
	require.Nil(t, errs, "one statement answered every row")
	require.Len(t, answers, len(reqs))

	for i, want := range []string{first, retry, justEarly} {
		idx := []int{0, 2, 8}[i]
		require.NoError(t, answers[idx].err, "row %d", idx)
		st := answers[idx].started
		require.NotNil(t, st)
		require.Equal(t, want, st.ExecutionID)
		require.Equal(t, reqs[idx].n, st.Attempt)
		require.JSONEq(t, `{"n": 1}`, string(st.Payload), "the adapter's input")
		require.Equal(t, adapterEndpoint, st.AdapterEndpoint)
		got := b.state(t, want)
		require.Equal(t, "running", got.Status)
		require.Equal(t, reqs[idx].n, got.Attempt)
		require.Equal(t, reqs[idx].tokenHash, got.AttemptTokens[reqs[idx].n], "this row's token")
	}
	require.ErrorIs(t, answers[1].err, ErrNotStartable, "already started")
	require.ErrorIs(t, answers[3].err, ErrNotStartable, "settled")
	var e *EarlyError
	require.ErrorAs(t, answers[4].err, &e, "early")
	require.InDelta(t, time.Hour.Seconds(), e.By.Seconds(), 5)
	var pd *PastDeadlineError
	require.ErrorAs(t, answers[5].err, &pd, "past its deadline")
	require.ErrorIs(t, answers[6].err, ErrNotStartable, "unknown")
	require.ErrorIs(t, answers[7].err, ErrNotStartable, "the second copy in the same batch")
	for id, before := range untouched {
		require.Equal(t, before, b.state(t, id), "a row that did not start changed nothing")
	}
}

// TestAttemptStartBatchRowFaultFailsOnlyItsCaller: a row that makes the statement fail on its own
// (an execution id that is not a UUID) gets the error; the batch's other rows start.
func TestAttemptStartBatchRowFaultFailsOnlyItsCaller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ok := b.insert(t, "pending", 0)
	answers, errs, err := b.store.startBatch(ctx, []startRequest{
		{id: ok, n: 1, tokenHash: tokenHash("ok"), scale: 1},
		{id: "not-a-uuid", n: 1, tokenHash: tokenHash("bad"), scale: 1},
	})
	require.NoError(t, err)
	require.Len(t, errs, 2)
	require.NoError(t, errs[0])
	require.NoError(t, answers[0].err)
	require.NotNil(t, answers[0].started)
	require.Error(t, errs[1])
	require.Equal(t, "running", b.state(t, ok).Status)
}

// TestAttemptStartBatchFailureFailsEachCaller: a batch whose statement fails — its backend
// terminated while it waits for a row lock — fails each of its callers with the connection's
// error (retryable: not a row's own fault), nothing starts, and the same starts succeed when
// asked again.
func TestAttemptStartBatchFailureFailsEachCaller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One batch at a time, so that the callers queued behind the first go together.
	b.store.starts = batch.New(b.store.startBatch, batch.Options{Name: "attempt start", MaxSize: 64, Concurrency: 1})
	locked := b.insert(t, "pending", 0)
	free := b.insert(t, "pending", 0)

	// Another transaction holds the row of `locked`: the batch statement waits for it.
	tx, err := b.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM executions WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)

	terminateWaiting := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, b.schema.Pool.QueryRow(ctx, `
				SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%unnest($1::uuid[]%' AND pid <> pg_backend_pid()`).Scan(&n))
			return n > 0
		}, 10*time.Second, 5*time.Millisecond, "the batch statement waits for the lock")
	}

	type res struct {
		st  *Started
		err error
	}
	do := func(id, token string) <-chan res {
		ch := make(chan res, 1)
		go func() {
			st, err := b.store.AttemptStart(ctx, id, 1, tokenHash(token), identity, time.Time{})
			ch <- res{st, err}
		}()
		return ch
	}
	// The first batch: `locked` alone, waiting. Two more callers queue behind it and go together.
	one := do(locked, "one")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%unnest($1::uuid[]%'`).Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond)
	two, three := do(free, "two"), do(locked, "three")
	require.Eventually(t, func() bool { return b.store.starts.Queued() == 2 }, 5*time.Second, time.Millisecond)

	terminateWaiting()
	r := <-one
	requireRetryable(t, r.err)
	// The second batch (free, locked) now waits on the same lock: terminated too.
	terminateWaiting()
	r2, r3 := <-two, <-three
	requireRetryable(t, r2.err)
	requireRetryable(t, r3.err)
	require.EqualValues(t, 2, b.store.StartStats().Batches)
	require.EqualValues(t, 2, b.store.StartStats().Largest, "the two queued callers went in one batch")
	require.Equal(t, "pending", b.state(t, free).Status, "nothing of the failed batch started")

	require.NoError(t, tx.Rollback(ctx))
	for _, id := range []string{locked, free} {
		st, err := b.store.AttemptStart(ctx, id, 1, tokenHash("again"), identity, time.Time{})
		require.NoError(t, err, "asked again, it starts")
		require.NotNil(t, st)
	}
}

// requireRetryable: the error is the connection's or the server's, not an answer about the row.
func requireRetryable(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrNotStartable))
	require.False(t, db.IsRowError(err), "not a row's own fault: %v", err)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		require.Equal(t, "57P01", pgErr.Code, "admin shutdown: the terminated backend")
	}
	require.ErrorContains(t, err, "start attempt 1 of ")
}
