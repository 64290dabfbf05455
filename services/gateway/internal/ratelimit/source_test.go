package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

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

	r := NewReplicas(s.Pool, 50*time.Millisecond, zaptest.NewLogger(t))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(runCtx); close(done) }()
	require.Eventually(t, func() bool { return r.Count() == 2 }, 5*time.Second, 10*time.Millisecond,
		"the loop's beats count the other replica")

	stop()
	<-done
	var rows int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM gateway_replicas WHERE id = $1`, r.ID()).Scan(&rows))
	require.Zero(t, rows, "a stopped replica removes its row")
}
