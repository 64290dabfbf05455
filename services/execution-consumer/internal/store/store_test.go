package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// The standard test catalog's adapter endpoint and lease, which AttemptStart reports.
const (
	adapterEndpoint = dbtest.TestAdapterEndpoint
	lease           = dbtest.TestLease
)

type bundle struct {
	schema *dbtest.Schema
	store  *Store
}

func setup(t testing.TB) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	return &bundle{schema: s, store: New(s.Pool)}
}

// insert adds an async execution in status at attempt n, with rows for attempts 1..n, and
// returns its id.
func (b *bundle) insert(t testing.TB, status execution.Status, n int32) string {
	t.Helper()
	id := b.schema.InsertExecution(t, dbtest.Execution{Status: status, Attempt: n, Payload: `{"n": 1}`})
	for i := int32(1); i <= n; i++ {
		b.schema.InsertAttempts(t, id, dbtest.Attempt{N: i, Outcome: "failed", CallbackTokenHash: tokenHash(fmt.Sprint("old", i))})
	}
	return id
}

// state is what AttemptStart may change.
type state struct {
	Status        string
	Attempt       int32
	LeaseExpires  *time.Time
	UpdatedAt     time.Time
	AttemptTokens map[int32][]byte
}

func (b *bundle) state(t *testing.T, id string) state {
	t.Helper()
	ctx := context.Background()
	var s state
	require.NoError(t, b.schema.Pool.QueryRow(ctx,
		`SELECT status, attempt, lease_expires_at, updated_at FROM executions WHERE id = $1`, id).
		Scan(&s.Status, &s.Attempt, &s.LeaseExpires, &s.UpdatedAt))
	rows, err := b.schema.Pool.Query(ctx, `SELECT n, callback_token_hash FROM execution_attempts WHERE execution_id = $1`, id)
	require.NoError(t, err)
	defer rows.Close()
	s.AttemptTokens = map[int32][]byte{}
	for rows.Next() {
		var n int32
		var h []byte
		require.NoError(t, rows.Scan(&n, &h))
		s.AttemptTokens[n] = h
	}
	require.NoError(t, rows.Err())
	return s
}

func tokenHash(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

func identity(d time.Duration) time.Duration { return d }

func TestAttemptStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insert(t, "pending", 0)

	before := time.Now()
	st, err := b.store.AttemptStart(ctx, id, 1, tokenHash("first"), identity, time.Time{})
	require.NoError(t, err)
	require.Equal(t, id, st.ExecutionID)
	require.Equal(t, int32(1), st.Attempt)
	require.Equal(t, "test.echo", st.Capability)
	require.Equal(t, "async", st.Mode)
	require.JSONEq(t, `{"n": 1}`, string(st.Payload))
	require.Equal(t, adapterEndpoint, st.AdapterEndpoint)
	require.Equal(t, lease, st.Lease)

	got := b.state(t, id)
	require.Equal(t, "running", got.Status)
	require.Equal(t, int32(1), got.Attempt)
	require.NotNil(t, got.LeaseExpires)
	require.WithinRange(t, *got.LeaseExpires, before.Add(lease-5*time.Second), time.Now().Add(lease+5*time.Second))
	require.Equal(t, map[int32][]byte{1: tokenHash("first")}, got.AttemptTokens)

	t.Run("the duplicate message changes nothing", func(t *testing.T) {
		_, err := b.store.AttemptStart(ctx, id, 1, tokenHash("second"), identity, time.Time{})
		require.ErrorIs(t, err, ErrNotStartable)
		require.Equal(t, got, b.state(t, id))
	})
}

func TestAttemptStartScalesTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, "pending", 0)

	before := time.Now()
	st, err := b.store.AttemptStart(context.Background(), id, 1, tokenHash("t"), func(d time.Duration) time.Duration { return d / 1000 }, time.Time{})
	require.NoError(t, err)
	require.Equal(t, lease/1000, st.Lease)
	leaseEnds := b.state(t, id).LeaseExpires
	require.NotNil(t, leaseEnds)
	require.WithinRange(t, *leaseEnds, before.Add(lease/1000-time.Second), time.Now().Add(lease/1000+time.Second))
}

func TestAttemptStartRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	tests := []struct {
		name    string
		status  execution.Status
		attempt int32 // the execution's
		n       int32 // the message's
	}{
		{"a skipped attempt", "pending", 0, 3},
		{"an attempt already started", "running", 1, 1},
		{"the next attempt while one runs", "running", 1, 2},
		{"an obsolete attempt after a retry", "pending", 1, 1},
		{"a settled execution", "succeeded", 1, 2},
		{"a cancelled execution", "cancelled", 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := b.insert(t, tt.status, tt.attempt)
			before := b.state(t, id)
			st, err := b.store.AttemptStart(ctx, id, tt.n, tokenHash("late"), identity, time.Time{})
			require.ErrorIs(t, err, ErrNotStartable)
			require.Nil(t, st)
			require.Equal(t, before, b.state(t, id), "nothing changed")
		})
	}

	t.Run("an unknown execution", func(t *testing.T) {
		t.Parallel()
		_, err := b.store.AttemptStart(ctx, uuid.NewString(), 1, tokenHash("t"), identity, time.Time{})
		require.ErrorIs(t, err, ErrNotStartable)
	})
}

func TestAttemptStartConcurrentDuplicatesHaveOneWinner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	for _, n := range []int32{1, 2} { // the first attempt, and a retry
		t.Run(fmt.Sprint("attempt ", n), func(t *testing.T) {
			t.Parallel()
			id := b.insert(t, "pending", n-1)

			const copies = 10
			start := make(chan struct{})
			errs := make([]error, copies)
			var wg sync.WaitGroup
			for i := range copies {
				wg.Go(func() {
					<-start
					_, errs[i] = b.store.AttemptStart(ctx, id, n, tokenHash(fmt.Sprint("copy", i)), identity, time.Time{})
				})
			}
			close(start)
			wg.Wait()

			winner := -1
			for i, err := range errs {
				if err == nil {
					require.Equal(t, -1, winner, "copies %d and %d both started attempt %d", winner, i, n)
					winner = i
					continue
				}
				require.True(t, errors.Is(err, ErrNotStartable), "copy %d: %v", i, err)
			}
			require.NotEqual(t, -1, winner, "one copy starts the attempt")

			got := b.state(t, id)
			require.Equal(t, "running", got.Status)
			require.Equal(t, n, got.Attempt)
			require.Len(t, got.AttemptTokens, int(n))
			require.Equal(t, tokenHash(fmt.Sprint("copy", winner)), got.AttemptTokens[n], "the winner's token is the attempt's")
		})
	}
}

// TestAttemptStartComparesTheDueTimeOnTheDatabaseClock: whether a dispatch is early is the
// database's call — its now() against the due time it wrote — whichever way this host's clock is
// off. An early dispatch starts nothing and is told how early it is if the attempt could start
// then, and is not startable if it never could.
func TestAttemptStartComparesTheDueTimeOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			t.Parallel()
			s := dbtest.NewSchema(t)
			s.ApplyCatalog(t, dbtest.TestCatalog)
			s = s.WithClockSkew(t, skew)
			b := &bundle{schema: s, store: New(s.Pool)}
			ctx := context.Background()
			// The database's now, as the dispatcher would read it with due_at.
			var dbNow time.Time
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow))

			pending := b.insert(t, "pending", 1)
			_, err := b.store.AttemptStart(ctx, pending, 2, tokenHash("early"), identity, dbNow.Add(90*time.Second))
			var early *EarlyError
			require.ErrorAs(t, err, &early, "due in 90 s on the database's clock")
			require.InDelta(t, 90, early.By.Seconds(), 2)
			require.Equal(t, "pending", b.state(t, pending).Status, "an early dispatch starts nothing")
			require.Len(t, b.state(t, pending).AttemptTokens, 1)

			settled := b.insert(t, "succeeded", 1)
			_, err = b.store.AttemptStart(ctx, settled, 2, tokenHash("obsolete"), identity, dbNow.Add(90*time.Second))
			require.ErrorIs(t, err, ErrNotStartable, "an early dispatch that could never start is not deferred")

			// The database's now read again: the statements above may take seconds on a loaded
			// machine, and Overdue counts from the due time, so only this one statement's time
			// may add to its second.
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow))
			st, err := b.store.AttemptStart(ctx, pending, 2, tokenHash("due"), identity, dbNow.Add(-time.Second))
			require.NoError(t, err, "due a second ago on the database's clock")
			require.InDelta(t, lease.Seconds(), st.Remaining.Seconds(), 2, "the lease left, as the database measured it")
			require.InDelta(t, (24 * time.Hour).Seconds(), st.DeadlineIn.Seconds(), 2, "the fixture's deadline: a day after the database's now")
			require.InDelta(t, 1, st.Overdue.Seconds(), 1, "started a second after its due time, on the database's clock")
			require.WithinDuration(t, time.Now().Add(lease), st.LocalLeaseEnd(), 2*time.Second, "the lease's end on this host's clock")
			require.WithinDuration(t, time.Now().Add(24*time.Hour), st.LocalDeadline(), 2*time.Second, "the deadline on this host's clock")
			leaseEnds := b.state(t, pending).LeaseExpires
			require.NotNil(t, leaseEnds)
			require.WithinDuration(t, time.Now().Add(skew+lease), *leaseEnds, 2*time.Second, "the lease written on the database's clock")
		})
	}
}

// TestAttemptUndo: the undo of a start that sent nothing returns the execution to pending at the
// attempt before, deletes the attempt's row and, in the same statement, schedules the attempt
// again as a dispatch record due after the delay by the database's clock. An undo of an attempt
// that is no longer the running one changes nothing; a record already there for the attempt is
// kept.
func TestAttemptUndo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	skewed := New(b.schema.WithClockSkew(t, time.Hour).Pool)
	id := b.insert(t, "pending", 1)
	_, err := skewed.AttemptStart(ctx, id, 2, tokenHash("second"), identity, time.Time{})
	require.NoError(t, err)

	undone, err := skewed.AttemptUndo(ctx, id, 2, 7*time.Second)
	require.NoError(t, err)
	require.True(t, undone)
	got := b.state(t, id)
	require.Equal(t, "pending", got.Status)
	require.EqualValues(t, 1, got.Attempt)
	require.Nil(t, got.LeaseExpires)
	require.Len(t, got.AttemptTokens, 1, "the undone attempt's row is gone")
	dueIn := func() []float64 {
		rows, err := b.schema.Pool.Query(ctx, `
			SELECT extract(epoch FROM due_at - now() - interval '1 hour')::float8 FROM dispatches
			WHERE execution_id = $1 AND attempt = 2`, id)
		require.NoError(t, err)
		defer rows.Close()
		var out []float64
		for rows.Next() {
			var v float64
			require.NoError(t, rows.Scan(&v))
			out = append(out, v)
		}
		require.NoError(t, rows.Err())
		return out
	}
	due := dueIn()
	require.Len(t, due, 1, "the attempt is rescheduled")
	require.InDelta(t, 7, due[0], 1, "due after the delay, on the database's clock")

	t.Run("an attempt no longer running", func(t *testing.T) {
		before := b.state(t, id)
		undone, err := skewed.AttemptUndo(ctx, id, 2, time.Second)
		require.NoError(t, err)
		require.False(t, undone)
		require.Equal(t, before, b.state(t, id))
		require.Len(t, dueIn(), 1)
	})
	t.Run("the published record the dispatcher is about to delete is taken over", func(t *testing.T) {
		// The dispatcher published the record for attempt 2 and, holding its claim, has not
		// deleted it yet when the consumer undoes the attempt that message started.
		var claim time.Time
		require.NoError(t, b.schema.Pool.QueryRow(ctx, `
			UPDATE dispatches SET claimed_until = now() + interval '30 seconds'
			WHERE execution_id = $1 AND attempt = 2 RETURNING claimed_until`, id).Scan(&claim))
		_, err := skewed.AttemptStart(ctx, id, 2, tokenHash("again"), identity, time.Time{})
		require.NoError(t, err)
		undone, err := skewed.AttemptUndo(ctx, id, 2, 20*time.Second)
		require.NoError(t, err)
		require.True(t, undone)
		due := dueIn()
		require.Len(t, due, 1)
		require.InDelta(t, 20, due[0], 2, "due after the new delay")
		// The dispatcher's delete of what it published (only while its claim holds) misses it.
		tag, err := b.schema.Pool.Exec(ctx, `DELETE FROM dispatches WHERE execution_id = $1 AND attempt = 2 AND claimed_until = $2`, id, claim)
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected())
		require.Len(t, dueIn(), 1, "the retry survives the dispatcher's delete")
	})
}
