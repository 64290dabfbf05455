package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

func succeed(id string, n int32) settleRequest {
	return settleRequest{settle: &Outcome{ExecutionID: id, Attempt: n, FromStatus: execution.StatusRunning,
		Status: execution.StatusSucceeded, Result: []byte(`{"ok":true}`)}}
}

func failRetryable(id string, n int32) settleRequest {
	return settleRequest{fail: &AttemptFailure{ExecutionID: id, Attempt: n, Retryable: true, Scale: identity,
		Failure: execution.Failure{Class: execution.ClassTransient, Message: "down"}}}
}

// failRetryableBatched is failRetryable with the execution's retry policy read, as AttemptFail
// reads it before a settlement joins a batch.
func (b *bundle) failRetryableBatched(t *testing.T, id string, n int32) settleRequest {
	t.Helper()
	r := failRetryable(id, n)
	p, err := retryPolicy(context.Background(), b.store.pool, id)
	require.NoError(t, err)
	r.fail.Policy = p
	return r
}

// A batch with one loser settles the others: the loser gets its own conflict answer and moves
// nothing; a settlement, a failed attempt that retries and one that settles, all in the same
// transaction, each get their own answer.
func TestSettleBatchWithALoserSettlesTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	won := b.insertRunning(t, 1, dayFromNow())
	stale := b.insertRunning(t, 2, dayFromNow())
	retried := b.insertRunning(t, 1, dayFromNow())
	exhausted := b.insertRunning(t, maxAttempts, dayFromNow())
	before, beforeAttempts := b.execution(t, stale), b.attempts(t, stale)

	answers, errs, err := b.store.settleBatch(ctx, []settleRequest{
		succeed(won, 1), succeed(stale, 1), b.failRetryableBatched(t, retried, 1), b.failRetryableBatched(t, exhausted, maxAttempts)})
	require.NoError(t, err)
	require.Len(t, answers, 4)

	require.NoError(t, errs[0])
	require.Equal(t, execution.StatusSucceeded, answers[0].settled.Execution.Status)
	require.Equal(t, execution.StatusSucceeded, b.execution(t, won).Status)
	require.Len(t, b.events(t, won), 1)
	require.Equal(t, answers[0].settled.EventID, b.events(t, won)[0].ID)

	var conflict *ConflictError
	require.ErrorAs(t, errs[1], &conflict)
	require.Equal(t, Conflict{Status: execution.StatusRunning, Attempt: 2}, conflict.Conflict)
	require.Nil(t, answers[1].settled)
	require.Equal(t, before, b.execution(t, stale), "the loser moved nothing")
	require.Equal(t, beforeAttempts, b.attempts(t, stale))
	require.Empty(t, b.events(t, stale))

	require.NoError(t, errs[2])
	require.Equal(t, execution.StatusPending, answers[2].failed.Execution.Status)
	require.NotNil(t, answers[2].failed.NextAttemptAt)
	d := b.dispatches(t, retried)
	require.Len(t, d, 1)
	require.Equal(t, int32(2), d[0].Attempt)
	require.WithinDuration(t, *answers[2].failed.NextAttemptAt, d[0].DueAt, 0)
	require.Empty(t, b.events(t, retried))

	require.NoError(t, errs[3])
	require.Equal(t, execution.StatusFailed, answers[3].failed.Execution.Status)
	require.Equal(t, execution.ReasonAttemptLimit, *b.execution(t, exhausted).FailureReason)
	require.Len(t, b.events(t, exhausted), 1)
}

// The same execution twice (or three times) in one batch: exactly one settlement wins, the
// others are told the winner's status, and there is one event.
func TestSettleBatchSameExecutionTwiceHasOneWinner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insertRunning(t, 1, dayFromNow())
	failed := settleRequest{settle: &Outcome{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning,
		Status: execution.StatusFailed, Failure: execution.Failure{Class: execution.ClassPermanent, Reason: execution.ReasonAdapterPermanent}}}

	answers, errs, err := b.store.settleBatch(ctx, []settleRequest{succeed(id, 1), failed, b.failRetryableBatched(t, id, 1)})
	require.NoError(t, err)
	var winners int
	for i, e := range errs {
		if e == nil {
			winners++
			require.Equal(t, 0, i, "the first of the batch for an execution runs first")
			continue
		}
		var conflict *ConflictError
		require.ErrorAs(t, e, &conflict)
		require.Equal(t, Conflict{Status: execution.StatusSucceeded, Attempt: 1}, conflict.Conflict)
	}
	require.Equal(t, 1, winners)
	require.NotNil(t, answers[0].settled)
	require.Equal(t, execution.StatusSucceeded, b.execution(t, id).Status)
	require.Len(t, b.events(t, id), 1)
	require.Empty(t, b.dispatches(t, id))
}

// A statement that fails (here: a result Postgres cannot take as jsonb) rolls its batch back;
// the batch is run again one settlement at a time, so that only its caller gets the error.
func TestSettleBatchStatementErrorFailsOnlyItsCaller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	good, bad := b.insertRunning(t, 1, dayFromNow()), b.insertRunning(t, 1, dayFromNow())
	broken := succeed(bad, 1)
	broken.settle.Result = []byte(`{not json`)

	answers, errs, err := b.store.settleBatch(ctx, []settleRequest{succeed(good, 1), broken})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.NotNil(t, answers[0].settled)
	require.Error(t, errs[1])
	require.False(t, db.IsConnectionError(errs[1]))
	require.Equal(t, execution.StatusSucceeded, b.execution(t, good).Status)
	require.Len(t, b.events(t, good), 1)
	require.Equal(t, execution.StatusRunning, b.execution(t, bad).Status)
	require.Empty(t, b.events(t, bad))
}

// poolNamed opens a pool on the schema whose connections carry an application_name of the
// test's own, so that the test can find (and terminate) its backends.
func poolNamed(t *testing.T, s *dbtest.Schema, name string) *pgxpool.Pool {
	t.Helper()
	pool, err := db.Open(context.Background(), s.URL+"&application_name="+name)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// waitLockWaiter waits until one of name's backends waits for a lock, and returns its pid.
func waitLockWaiter(t *testing.T, admin *pgxpool.Pool, name string) int32 {
	t.Helper()
	var pid int32
	require.Eventually(t, func() bool {
		err := admin.QueryRow(context.Background(), `
			SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, name).Scan(&pid)
		return err == nil
	}, 10*time.Second, 5*time.Millisecond)
	return pid
}

// lockRow holds execution id's row lock in a transaction of its own until the returned release.
func lockRow(t *testing.T, pool *pgxpool.Pool, id string) (release func()) {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), `SELECT 1 FROM executions WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// Concurrent settlements go together in one batch; a batch whose backend is terminated while it
// runs (here: waiting for a row lock, after its first statement wrote) fails every one of its
// callers with a retryable error — UNAVAILABLE at the gRPC edge — and writes nothing.
func TestSettleBatchTerminatedMidBatchFailsEveryCallerAndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	name := "settle_batch_" + b.schema.Name
	st := New(poolNamed(t, b.schema, name))
	st.batcher = batch.New(st.settleBatch, batch.Options{Name: "settlement", MaxSize: 64, Concurrency: 1})
	st.lockTimeout = time.Minute // the batch waits at the lock until it is terminated

	plug := b.insertRunning(t, 1, dayFromNow())
	// Ids are time-ordered: the batch runs first's statement, then blocks at second's row.
	first, second, third := b.insertRunning(t, 1, dayFromNow()), b.insertRunning(t, 1, dayFromNow()), b.insertRunning(t, 1, dayFromNow())
	releasePlug := lockRow(t, b.schema.Pool, plug)
	releaseSecond := lockRow(t, b.schema.Pool, second)

	plugDone := make(chan error, 1)
	go func() {
		_, err := st.ExecutionSettle(ctx, *succeed(plug, 1).settle)
		plugDone <- err
	}()
	waitLockWaiter(t, b.schema.Pool, name) // the plug's batch runs, alone, and waits
	ids := []string{first, second, third}
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			_, errs[i] = st.ExecutionSettle(ctx, *succeed(id, 1).settle)
		})
	}
	require.Eventually(t, func() bool { return st.batcher.Queued() == len(ids) }, 10*time.Second, time.Millisecond)
	releasePlug()
	require.NoError(t, <-plugDone)

	pid := waitLockWaiter(t, b.schema.Pool, name) // the batch of three, blocked at second
	var terminated bool
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&terminated))
	require.True(t, terminated)
	wg.Wait()
	releaseSecond()

	for i, err := range errs {
		require.Error(t, err, ids[i])
		require.True(t, db.IsConnectionError(err), "retryable: %v", err)
		require.Equal(t, codes.Unavailable, grpcx.ToStatus(err).Code(), "%v", err)
	}
	for _, id := range ids {
		require.Equal(t, execution.StatusRunning, b.execution(t, id).Status, "nothing written")
		require.Nil(t, b.attempts(t, id)[0].EndedAt)
		require.Empty(t, b.events(t, id))
	}
	stats := st.SettleStats()
	require.Equal(t, int64(2), stats.Batches)
	require.Equal(t, int64(3), stats.Largest)

	// The callers' retries settle.
	for _, id := range ids {
		_, err := st.ExecutionSettle(ctx, *succeed(id, 1).settle)
		require.NoError(t, err)
	}
}

// Under concurrent callers the batcher coalesces: fewer batches than settlements, each caller
// still settled once with its own answer.
func TestConcurrentSettlementsAreBatched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 40
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.insertRunning(t, 1, dayFromNow())
	}
	start := make(chan struct{})
	events := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			<-start
			if i%2 == 1 {
				_, errs[i] = b.store.AttemptFail(ctx, *failRetryable(id, 1).fail)
				return
			}
			s, err := b.store.ExecutionSettle(ctx, *succeed(id, 1).settle)
			if errs[i] = err; err == nil {
				events[i] = s.EventID
			}
		})
	}
	close(start)
	wg.Wait()
	for i, id := range ids {
		require.NoError(t, errs[i])
		if i%2 == 0 {
			require.Equal(t, execution.StatusSucceeded, b.execution(t, id).Status)
			evs := b.events(t, id)
			require.Len(t, evs, 1)
			require.Equal(t, events[i], evs[0].ID)
		} else {
			require.Equal(t, execution.StatusPending, b.execution(t, id).Status)
			require.Len(t, b.dispatches(t, id), 1)
		}
	}
	stats := b.store.SettleStats()
	require.Equal(t, int64(n), stats.Items)
	require.Less(t, stats.Batches, int64(n), "some settlements shared a batch")
	t.Logf("%d settlements in %d batches, the largest %d", stats.Items, stats.Batches, stats.Largest)
}

// An execution locked elsewhere holds up only its own settlement: the batch it is in gives up the
// lock wait after the bound, the others settle, and the locked one waits on its own and settles
// once the lock is released — even with no deadline of its own.
func TestLockedExecutionHoldsUpOnlyItsOwnSettlement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	name := "settle_locked_" + b.schema.Name
	st := New(poolNamed(t, b.schema, name))
	locked := b.insertRunning(t, 1, dayFromNow())
	free := b.insertRunning(t, 1, dayFromNow())
	release := lockRow(t, b.schema.Pool, locked)

	done := make(chan error, 1)
	go func() {
		_, err := st.ExecutionSettle(ctx, *succeed(locked, 1).settle) // no deadline
		done <- err
	}()
	waitLockWaiter(t, b.schema.Pool, name) // its batch runs first and waits for the lock
	start := time.Now()
	// The batch's lock wait is bounded at batchLockTimeout (500 ms); the lock itself is held
	// until release below. The free settlement's ctx runs two minutes, so the free settlement
	// succeeding within 20 s can only be the lock-wait bound's doing, however loaded the machine.
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err := st.ExecutionSettle(fctx, *succeed(free, 1).settle)
	require.NoError(t, err, "a settlement queued behind a locked one")
	require.Less(t, time.Since(start), 20*time.Second, "after the batch's lock wait, not the lock's release")
	require.Equal(t, execution.StatusSucceeded, b.execution(t, free).Status)
	select {
	case err := <-done:
		t.Fatalf("the locked execution settled while locked: %v", err)
	default:
	}
	release()
	require.NoError(t, <-done)
	require.Equal(t, execution.StatusSucceeded, b.execution(t, locked).Status)
}
