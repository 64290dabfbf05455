package store

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

type bundle struct {
	schema *dbtest.Schema
	store  *Store
	// execution is a pending execution the dispatch rows refer to; rows differ by attempt.
	execution string
}

// setup gives the test a schema with the standard catalog and one pending execution.
func setup(t *testing.T) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	id := s.InsertExecution(t, dbtest.Execution{})
	return &bundle{schema: s, store: New(s.Pool), execution: id}
}

// insert adds a dispatch row for attempt n, due dueIn from now and claimed for claimedFor from
// now (nil: not claimed), and returns its id. Times are relative to the database's clock.
func (b *bundle) insert(t *testing.T, n int, dueIn time.Duration, claimedFor *time.Duration) int64 {
	t.Helper()
	var claimed any
	if claimedFor != nil {
		claimed = claimedFor.Seconds()
	}
	var id int64
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		INSERT INTO dispatches (execution_id, attempt, due_at, claimed_until)
		VALUES ($1, $2, now() + make_interval(secs => $3),
			CASE WHEN $4::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $4::float8) END)
		RETURNING id`, b.execution, n, dueIn.Seconds(), claimed).Scan(&id))
	return id
}

func ids(ds []Dispatch) []int64 {
	out := make([]int64, 0, len(ds))
	for _, d := range ds {
		out = append(out, d.ID)
	}
	slices.Sort(out)
	return out
}

// claim is DispatchClaim's claimed records.
func (b *bundle) claim(ctx context.Context, limit int, ttl, horizon time.Duration) ([]Dispatch, error) {
	c, err := b.store.DispatchClaim(ctx, limit, ttl, horizon)
	return c.Dispatches, err
}

// nextDue is the next-due answer of a claim that takes nothing (limit 0).
func (b *bundle) nextDue(ctx context.Context, horizon time.Duration) (*time.Duration, error) {
	c, err := b.store.DispatchClaim(ctx, 0, time.Minute, horizon)
	return c.NextIn, err
}

func ptr(d time.Duration) *time.Duration { return &d }

func TestDispatchClaimTakesOnlyDueUnclaimedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	due := b.insert(t, 1, -time.Minute, nil)
	_ = b.insert(t, 2, time.Minute, nil)                     // not due yet
	_ = b.insert(t, 3, -time.Minute, ptr(time.Minute))       // claimed by another dispatcher
	expired := b.insert(t, 4, -time.Hour, ptr(-time.Second)) // that dispatcher's claim expired

	before := time.Now()
	got, err := b.claim(ctx, 10, 30*time.Second, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{due, expired}, ids(got))
	for _, d := range got {
		require.Equal(t, b.execution, d.ExecutionID)
		require.WithinRange(t, d.ClaimedUntil, before.Add(25*time.Second), time.Now().Add(35*time.Second))
		require.True(t, d.DueAt.Before(time.Now()))
	}

	again, err := b.claim(ctx, 10, 30*time.Second, 0)
	require.NoError(t, err)
	require.Empty(t, again, "claimed rows are not claimed again while the claim holds")
}

func TestDispatchClaimHonoursTheLimitOldestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	var oldest []int64
	for n := 1; n <= 5; n++ {
		id := b.insert(t, n, -time.Duration(n)*time.Minute, nil)
		if n >= 4 {
			oldest = append(oldest, id)
		}
	}
	got, err := b.claim(ctx, 2, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, oldest, ids(got))
}

func TestDispatchClaimConcurrentClaimersNeverShareARow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	const rows, claimers, limit = 200, 4, 50
	_, err := b.schema.Pool.Exec(ctx, `
		INSERT INTO dispatches (execution_id, attempt, due_at)
		SELECT $1, n, now() - interval '1 second' * n FROM generate_series(1, $2) n`, b.execution, rows)
	require.NoError(t, err)

	start := make(chan struct{})
	claimed := make([][]Dispatch, claimers)
	errs := make([]error, claimers)
	var wg sync.WaitGroup
	for i := range claimers {
		wg.Go(func() {
			<-start
			for {
				got, err := b.claim(ctx, limit, time.Minute, 0)
				if err != nil {
					errs[i] = err
					return
				}
				if len(got) == 0 {
					return
				}
				claimed[i] = append(claimed[i], got...)
			}
		})
	}
	close(start)
	wg.Wait()

	seen := map[int64]int{}
	per := make([]int, claimers)
	for i := range claimers {
		per[i] = len(claimed[i])
		require.NoError(t, errs[i])
		require.LessOrEqual(t, len(claimed[i]), rows)
		for _, d := range claimed[i] {
			seen[d.ID]++
		}
	}
	total := 0
	for id, n := range seen {
		require.Equal(t, 1, n, "dispatch %d claimed %d times", id, n)
		total += n
	}
	require.Equal(t, rows, total, "every row claimed once")
	t.Logf("rows claimed by each claimer: %v", per)

	var unclaimed int
	require.NoError(t, b.schema.Pool.QueryRow(ctx,
		`SELECT count(*) FROM dispatches WHERE claimed_until IS NULL OR claimed_until < now()`).Scan(&unclaimed))
	require.Zero(t, unclaimed)
}

func TestDispatchDeletePublishedOnlyUnderTheSameClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	for n := 1; n <= 3; n++ {
		b.insert(t, n, -time.Minute, nil)
	}
	got, err := b.claim(ctx, 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, got, 3)
	claimedUntil := got[0].ClaimedUntil
	for _, d := range got {
		require.True(t, claimedUntil.Equal(d.ClaimedUntil), "one claim, one claimed_until")
	}

	// The claim on the first row expired and another dispatcher claimed it again.
	reclaimed := got[0].ID
	_, err = b.schema.Pool.Exec(ctx, `UPDATE dispatches SET claimed_until = claimed_until + interval '1 second' WHERE id = $1`, reclaimed)
	require.NoError(t, err)

	n, err := b.store.DispatchDeletePublished(ctx, ids(got), claimedUntil.Add(time.Microsecond))
	require.NoError(t, err)
	require.Zero(t, n, "another claim's time deletes nothing")

	n, err = b.store.DispatchDeletePublished(ctx, ids(got), claimedUntil)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)

	var left []int64
	rows, err := b.schema.Pool.Query(ctx, `SELECT id FROM dispatches ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{reclaimed}, left, "the row another dispatcher holds stays")
}

// TestDispatchClaimWithinTheHorizon: with a horizon, records due up to that far ahead are claimed
// too (they go into the broker's delay levels), later ones wait; ClaimedAt is the database's clock,
// against which each claimed record's due time says how far ahead it is.
func TestDispatchClaimWithinTheHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	due := b.insert(t, 1, -time.Minute, nil)
	soon := b.insert(t, 2, 30*time.Minute, nil)
	edge := b.insert(t, 3, 119*time.Minute, nil)
	_ = b.insert(t, 4, 3*time.Hour, nil)                              // beyond the horizon: waits in Postgres
	_ = b.insert(t, 5, time.Minute, ptr(time.Minute))                 // within, but another dispatcher holds it
	expired := b.insert(t, 6, 90*time.Minute, ptr(-time.Millisecond)) // within, its claim expired

	got, err := b.claim(ctx, 10, 30*time.Second, 2*time.Hour)
	require.NoError(t, err)
	require.Equal(t, []int64{due, soon, edge, expired}, ids(got))
	ahead := map[int64]time.Duration{due: -time.Minute, soon: 30 * time.Minute, expired: 90 * time.Minute, edge: 119 * time.Minute}
	for _, d := range got {
		require.Equal(t, got[0].ClaimedAt, d.ClaimedAt, "one claim, one clock reading")
		require.InDelta(t, ahead[d.ID].Seconds(), d.DueAt.Sub(d.ClaimedAt).Seconds(), 5, "dispatch %d", d.ID)
		require.True(t, d.ClaimedUntil.Sub(d.ClaimedAt) == 30*time.Second, "claimed for the TTL")
	}

	again, err := b.claim(ctx, 10, 30*time.Second, 2*time.Hour)
	require.NoError(t, err)
	require.Empty(t, again)
	wider, err := b.claim(ctx, 10, 30*time.Second, 4*time.Hour)
	require.NoError(t, err)
	require.Len(t, wider, 1, "a wider horizon reaches the 3h record")
}

// TestDispatchClaimAnswersTheNextDue: the claim statement itself says when the next pass is due,
// leaving out the rows it just claimed (its snapshot still shows them unclaimed): no second
// statement per pass.
func TestDispatchClaimAnswersTheNextDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.insert(t, 1, -time.Second, nil)
	b.insert(t, 2, 0, nil)
	b.insert(t, 3, 2*time.Hour, nil)
	c, err := b.store.DispatchClaim(ctx, 10, 30*time.Second, time.Hour)
	require.NoError(t, err)
	require.Len(t, c.Dispatches, 2, "the two due records")
	require.NotNil(t, c.NextIn)
	require.InDelta(t, time.Hour.Seconds(), c.NextIn.Seconds(), 5, "the 2 h record, an hour before it is due")

	c, err = b.store.DispatchClaim(ctx, 10, 30*time.Second, 0)
	require.NoError(t, err)
	require.Empty(t, c.Dispatches)
	require.NotNil(t, c.NextIn)
	require.InDelta(t, (30 * time.Second).Seconds(), c.NextIn.Seconds(), 5,
		"nothing claimable: the earliest claim to expire, the first two's")
}

// TestDispatchNextDueLooksAheadByTheHorizon: the dispatcher wakes when the earliest record comes
// within the horizon, or a claim on one within it expires.
func TestDispatchNextDueLooksAheadByTheHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	requireNear := func(t *testing.T, want time.Duration, got *time.Duration) {
		t.Helper()
		require.NotNil(t, got)
		require.InDelta(t, want.Seconds(), got.Seconds(), 5)
	}

	t.Run("nothing waits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		next, err := b.nextDue(ctx, time.Hour)
		require.NoError(t, err)
		require.Nil(t, next)
	})
	t.Run("an unclaimed record", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, 1, 3*time.Hour, nil)
		next, err := b.nextDue(ctx, 2*time.Hour)
		require.NoError(t, err)
		requireNear(t, time.Hour, next)
		next, err = b.nextDue(ctx, 0)
		require.NoError(t, err)
		requireNear(t, 3*time.Hour, next)
	})
	t.Run("a claimed record within the horizon: when its claim expires", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, 1, 30*time.Minute, ptr(10*time.Minute))
		next, err := b.nextDue(ctx, 2*time.Hour)
		require.NoError(t, err)
		requireNear(t, 10*time.Minute, next)
	})
	t.Run("a claimed record beyond the horizon: when it comes within", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, 1, 5*time.Hour, ptr(10*time.Minute))
		next, err := b.nextDue(ctx, 2*time.Hour)
		require.NoError(t, err)
		requireNear(t, 3*time.Hour, next)
	})
}
