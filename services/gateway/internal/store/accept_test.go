package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

func newAsync(key, hash string) NewExecution {
	id, err := uuid.NewV7()
	if err != nil {
		panic(err)
	}
	return NewExecution{
		ID: id.String(), ApplicationID: dbtest.TestApp, Capability: dbtest.TestCapability,
		Mode: execution.ModeAsync, MaxAttempts: 3, Payload: []byte(`{"n":1}`), RequestHash: []byte(hash),
		IdempotencyKey: key, Budget: time.Hour,
	}
}

func countRows(t *testing.T, s *dbtest.Schema, table, column string, ids ...string) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+table+` WHERE `+column+`::text = ANY($1)`, ids).Scan(&n))
	return n
}

// One batch: new executions are created with their dispatch records, a key already used and a
// key used twice in the same batch are each skipped (their callers replay), and the replay
// answers as before: the original execution, or IDEMPOTENCY_KEY_REUSED for another request.
func TestAcceptBatchAnswersEachRowItsOwn(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	ctx := context.Background()

	earlier := newAsync("k-earlier", "h1")
	_, created, err := st.ExecutionAccept(ctx, earlier)
	require.NoError(t, err)
	require.True(t, created)

	fresh, replay, reused, first, twice := newAsync("", "h"), newAsync("k-earlier", "h1"), newAsync("k-earlier", "other"),
		newAsync("k-batch", "h2"), newAsync("k-batch", "h2")
	out, errs, err := st.acceptBatch(ctx, []NewExecution{fresh, replay, reused, first, twice})
	require.NoError(t, err)
	require.Nil(t, errs)
	require.NotNil(t, out[0], "new, no key")
	require.Nil(t, out[1], "key already used: skipped")
	require.Nil(t, out[2], "key already used: skipped")
	require.NotNil(t, out[3], "first use of a key in the batch")
	require.Nil(t, out[4], "second use of the batch's key: skipped")
	require.False(t, out[0].deadlineAt.Before(out[0].createdAt.Add(time.Hour-time.Second)), "deadline is now() + budget")

	require.Equal(t, 2, countRows(t, s, "executions", "id", fresh.ID, replay.ID, reused.ID, first.ID, twice.ID))
	require.Equal(t, 3, countRows(t, s, "dispatches", "execution_id", earlier.ID, fresh.ID, first.ID))
	require.Zero(t, countRows(t, s, "dispatches", "execution_id", replay.ID, reused.ID, twice.ID))

	row, created, err := st.ExecutionAccept(ctx, replay)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, earlier.ID, row.ID)
	_, _, err = st.ExecutionAccept(ctx, reused)
	require.ErrorIs(t, err, ErrIdempotencyReused)
	row, created, err = st.ExecutionAccept(ctx, twice)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, row.ID)
}

// A row only it can fail (a capability that does not exist: a foreign key) fails its own caller;
// the batch's other rows are created.
func TestAcceptBatchRowErrorFailsOnlyItsCaller(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	a, bad, c := newAsync("", "h"), newAsync("", "h"), newAsync("", "h")
	bad.Capability = "no.such"
	out, errs, err := st.acceptBatch(context.Background(), []NewExecution{a, bad, c})
	require.NoError(t, err)
	require.NotNil(t, out[0])
	require.Error(t, errs[1])
	require.Nil(t, out[1])
	require.NotNil(t, out[2])
	require.NoError(t, errs[0])
	require.NoError(t, errs[2])
	require.Equal(t, 2, countRows(t, s, "executions", "id", a.ID, bad.ID, c.ID))
}

// A batch whose connection is lost fails every caller of it with a retryable error, and writes
// nothing: the batch waits on a row lock (another transaction holds the same idempotency key,
// uncommitted) when its backend is terminated.
func TestAcceptBatchLostConnectionFailsEveryCallerAndWritesNothing(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	app := "acc_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	pool, err := db.Open(ctx, s.URL+"&application_name="+app, db.MaxConns(2))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st := New(pool)

	held := newAsync("k-held", "h")
	holder, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `INSERT INTO executions (id, application_id, capability, mode, status, attempt, max_attempts,
		payload, request_hash, idempotency_key, deadline_at) VALUES ($1, $2, $3, 'async', 'pending', 0, 3, '{}', 'h', 'k-held', now())`,
		held.ID, dbtest.TestApp, dbtest.TestCapability)
	require.NoError(t, err)

	fresh, blocked := newAsync("", "h"), newAsync("k-held", "h")
	done := make(chan error, 1)
	go func() {
		_, _, err := st.acceptBatch(ctx, []NewExecution{fresh, blocked})
		done <- err
	}()
	// The batch's wait on the held key is the event awaited; a batch that ended first (it could
	// not have written the held key) fails the test with its error, and a wait not seen within the
	// generous bound with what the batch's backends were doing.
	waiting := func() bool {
		var n int
		err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
		return err == nil && n == 1
	}
	for deadline := time.Now().Add(30 * time.Second); !waiting(); {
		select {
		case err := <-done:
			require.FailNow(t, "the batch ended before it waited on the held key", "%v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			rows, err := s.Pool.Query(ctx, `SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''), query
				FROM pg_stat_activity WHERE application_name = $1`, app)
			require.NoError(t, err)
			backends, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ State, WaitType, Wait, Query string }])
			require.NoError(t, err)
			require.FailNow(t, "the batch never waited on the held key", "its backends: %+v", backends)
		}
	}
	_, err = s.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
	require.NoError(t, err)

	err = <-done
	require.Error(t, err)
	require.Equal(t, codes.Unavailable, grpcx.ToStatus(err).Code(), "retryable: %v", err)
	require.NoError(t, holder.Rollback(ctx))
	require.Zero(t, countRows(t, s, "executions", "id", fresh.ID, blocked.ID), "nothing half-written")
	require.Zero(t, countRows(t, s, "dispatches", "execution_id", fresh.ID, blocked.ID))
}

// Concurrent accepts share statements, and each caller still gets its own execution.
func TestConcurrentAcceptsShareStatements(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	const callers = 64
	var wg sync.WaitGroup
	ids := make([]string, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := newAsync("", "h")
			row, created, err := st.ExecutionAccept(context.Background(), n)
			if err == nil && (!created || row.ID != n.ID || row.Status != execution.StatusPending) {
				err = errors.New("not this caller's new execution")
			}
			ids[i], errs[i] = n.ID, err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, callers, countRows(t, s, "executions", "id", ids...))
	require.Equal(t, callers, countRows(t, s, "dispatches", "execution_id", ids...))
	stats := st.accepts.Stats()
	require.EqualValues(t, callers, stats.Items)
	t.Logf("%d accepts in %d statements (largest %d)", stats.Items, stats.Batches, stats.Largest)
}
