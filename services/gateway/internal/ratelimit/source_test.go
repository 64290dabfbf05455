package ratelimit

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// ID is this replica's row in gateway_replicas.
func (r *Replicas) ID() string { return r.id }

var defaults = Limits{Invoke: Limit{PerSecond: 100, Burst: 200}, Read: Limit{PerSecond: 300, Burst: 400}}

func TestSourceFillsUnsetLimitsWithTheDefaults(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, `
applications:
  - id: plain
    api_key: plain-key-0123456789
  - id: own
    api_key: own-key-0123456789
    rate_limits:
      invokes_per_second: 5
      read_burst: 9
  - id: open
    api_key: open-key-0123456789
    rate_limits: {invokes_per_second: 0, reads_per_second: 0}
`)
	ctx := context.Background()
	src := NewSource(s.Pool, defaults, 0)

	l, err := src.Limits(ctx, "plain")
	require.NoError(t, err)
	require.Equal(t, defaults, l)

	l, err = src.Limits(ctx, "own")
	require.NoError(t, err)
	require.Equal(t, Limits{Invoke: Limit{PerSecond: 5, Burst: 200}, Read: Limit{PerSecond: 300, Burst: 9}}, l)

	l, err = src.Limits(ctx, "open")
	require.NoError(t, err)
	require.True(t, l.Invoke.Unlimited())
	require.True(t, l.Read.Unlimited())

	l, err = src.Limits(ctx, "gone")
	require.NoError(t, err)
	require.Equal(t, defaults, l, "an application removed since its call was authenticated gets the defaults")
}

func TestSourceCachesForItsTTL(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	cached := NewSource(s.Pool, defaults, time.Hour)
	_, err := cached.Limits(ctx, dbtest.TestApp)
	require.NoError(t, err)

	_, err = s.Pool.Exec(ctx, `UPDATE applications SET invokes_per_second = 1 WHERE id = $1`, dbtest.TestApp)
	require.NoError(t, err)
	l, err := cached.Limits(ctx, dbtest.TestApp)
	require.NoError(t, err)
	require.Equal(t, defaults.Invoke, l.Invoke, "within the TTL the cached limits answer")
	l, err = NewSource(s.Pool, defaults, 0).Limits(ctx, dbtest.TestApp)
	require.NoError(t, err)
	require.Equal(t, 1.0, l.Invoke.PerSecond, "read afresh, the change shows")
}

func TestReplicasCountEachOtherAndForgetTheDead(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	ctx := context.Background()
	log := zaptest.NewLogger(t)
	a := NewReplicas(s.Pool, time.Second, log)
	b := NewReplicas(s.Pool, time.Second, log)
	require.NotEqual(t, a.ID(), b.ID())
	require.Equal(t, 1, a.Count(), "before its first beat a replica counts itself alone")

	require.NoError(t, a.Beat(ctx))
	require.Equal(t, 1, a.Count())
	require.NoError(t, b.Beat(ctx))
	require.Equal(t, 2, b.Count())
	require.NoError(t, a.Beat(ctx))
	require.Equal(t, 2, a.Count())

	// A replica that stopped beating three intervals ago is dead: not counted, and its row goes.
	_, err := s.Pool.Exec(ctx, `INSERT INTO gateway_replicas (id, last_seen) VALUES ('dead', now() - interval '4 seconds')`)
	require.NoError(t, err)
	require.NoError(t, a.Beat(ctx))
	require.Equal(t, 2, a.Count())
	var rows int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM gateway_replicas WHERE id = 'dead'`).Scan(&rows))
	require.Zero(t, rows, "the dead replica's row is deleted")

	// One that left cleanly is gone from the others' next count.
	require.NoError(t, b.Leave(ctx))
	require.NoError(t, a.Beat(ctx))
	require.Equal(t, 1, a.Count())
}

func TestReplicasRunBeatsAndLeavesWhenStopped(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	ctx := context.Background()
	other := NewReplicas(s.Pool, time.Second, zaptest.NewLogger(t))
	require.NoError(t, other.Beat(ctx))

	// The loop's first beat comes an interval in, and counts the rows beaten within three: other's
	// single beat is 2 s old then, 4 s from stale (at 50 ms, a first beat 100 ms late on a loaded
	// machine would find it stale and delete it).
	r := NewReplicas(s.Pool, 2*time.Second, zaptest.NewLogger(t))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(runCtx); close(done) }()
	require.Eventually(t, func() bool { return r.Count() == 2 }, 15*time.Second, 10*time.Millisecond,
		"the loop's beats count the other replica")

	stop()
	<-done
	var rows int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM gateway_replicas WHERE id = $1`, r.ID()).Scan(&rows))
	require.Zero(t, rows, "a stopped replica removes its row")
}

// A beat is bounded by an interval; beats failing keep the count until the others stop counting
// this replica (staleAfter), then count one more, so that the share held errs small.
func TestReplicasFailedBeatsCountConservatively(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	ctx := context.Background()
	log := zaptest.NewLogger(t)
	const interval = time.Second // a beat is bounded by it: short enough for the test, long enough for a busy machine
	a := NewReplicas(s.Pool, interval, log)
	b := NewReplicas(s.Pool, interval, log)
	clock := time.Unix(1_700_000_000, 0)
	a.now = func() time.Time { return clock }
	require.NoError(t, b.Beat(ctx))
	require.NoError(t, a.Beat(ctx))
	require.Equal(t, 2, a.Count())

	// Postgres stalls: the table is locked by another transaction.
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE gateway_replicas IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	beat := func() error {
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- a.Beat(ctx) }()
		select {
		case err := <-done:
			// Bounded by the interval rather than by the lock (held until the test ends): ten
			// intervals leave a loaded machine room, and the lock would hold it 30 s and more.
			require.Less(t, time.Since(start), 10*interval, "a stalled beat ends after about an interval")
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("a stalled beat did not end")
			return nil
		}
	}
	clock = clock.Add(interval)
	require.Error(t, beat())
	require.Equal(t, 2, a.Count(), "a failure within the staleness window keeps the count")
	clock = clock.Add(3 * interval)
	require.Error(t, beat())
	require.Equal(t, 3, a.Count(), "past it the others took up this replica's share: count one more")
	clock = clock.Add(10 * interval)
	require.Error(t, beat())
	require.Equal(t, 3, a.Count(), "once, not one more a failure")
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, b.Beat(ctx))
	require.NoError(t, a.Beat(ctx))
	require.Equal(t, 2, a.Count(), "a beat that succeeds counts again")
}

func TestReplicasFirstBeatFailedCountsTwo(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	pool, err := pgxpool.New(context.Background(), s.Pool.Config().ConnString())
	require.NoError(t, err)
	pool.Close() // unreachable
	r := NewReplicas(pool, time.Second, zaptest.NewLogger(t))
	require.Equal(t, 1, r.Count())
	require.Error(t, r.Beat(context.Background()))
	require.Equal(t, 2, r.Count(), "knowing nothing of the fleet, not the whole limit")
}

// slowReads is a pgx tracer counting the queries on the applications table and holding each for
// a while, as a busy Postgres does.
type slowReads struct{ n atomic.Int64 }

func (r *slowReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "FROM applications") {
		r.n.Add(1)
		time.Sleep(300 * time.Millisecond) // the slow Postgres itself, not synchronisation
	}
	return ctx
}

func (r *slowReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Calls that miss the cache at once share one read: a busy application's entry expiring does not
// send every call in flight to Postgres.
func TestSourceMissesShareOneRead(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, "applications:\n  - id: app\n    api_key: app-key-0123456789\n    rate_limits: {invokes_per_second: 5}\n")
	cfg := s.Pool.Config()
	tracer := &slowReads{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	src := NewSource(pool, defaults, time.Minute)

	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			l, err := src.Limits(context.Background(), "app")
			assert.NoError(t, err)
			assert.Equal(t, 5.0, l.Invoke.PerSecond)
		})
	}
	wg.Wait()
	require.Less(t, tracer.n.Load(), int64(4), "32 calls at once, about one read (not 32)")

	// A caller giving up does not fail the read the others wait on.
	ctx, cancel := context.WithCancel(context.Background())
	src = NewSource(pool, defaults, time.Minute)
	reads := tracer.n.Load()
	first := make(chan error, 1)
	go func() { _, err := src.Limits(ctx, "app"); first <- err }()
	require.Eventually(t, func() bool { return tracer.n.Load() > reads }, 5*time.Second, time.Millisecond, "the read started")
	second := make(chan error, 1)
	go func() { _, err := src.Limits(context.Background(), "app"); second <- err }()
	cancel()
	require.ErrorIs(t, <-first, context.Canceled)
	require.NoError(t, <-second)
}
