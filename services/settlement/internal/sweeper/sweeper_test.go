package sweeper

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/services/settlement/internal/store"
)

func identity(d time.Duration) time.Duration { return d }

// insertExpired inserts an async execution running at attempt n whose lease expired.
func insertExpired(t *testing.T, s *dbtest.Schema, n int32) string {
	t.Helper()
	id := s.InsertExecution(t, dbtest.Execution{Status: execution.StatusRunning, Attempt: n, LeaseExpiresAt: time.Now().Add(-time.Second)})
	for i := int32(1); i <= n; i++ {
		a := dbtest.Attempt{N: i}
		if i < n {
			a.Outcome, a.FailureClass = "failed", execution.ClassTransient
		}
		s.InsertAttempts(t, id, a)
	}
	return id
}

func status(t *testing.T, s *dbtest.Schema, id string) execution.Status {
	t.Helper()
	var st execution.Status
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT status FROM executions WHERE id = $1`, id).Scan(&st))
	return st
}

// The metrics are process-wide: this test does not run in parallel with the others of the package
// (which sweep too), and reads them as deltas.
func TestPassCountsNudgesAndRecordsItsRun(t *testing.T) {
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	retried := insertExpired(t, s, 1)
	failed := insertExpired(t, s, dbtest.TestMaxAttempts)
	var nudges atomic.Int32
	// A batch of one: the pass must go on until a batch comes back short.
	sw := New(store.New(s.Pool), Options{Interval: time.Hour, BatchSize: 1, Scale: identity,
		Nudge: func() { nudges.Add(1) }, Logger: zaptest.NewLogger(t)})
	retriedBefore := testutil.ToFloat64(swept.WithLabelValues(OutcomeRetried))
	failedBefore := testutil.ToFloat64(swept.WithLabelValues(OutcomeFailed))
	start := float64(time.Now().Unix())

	c, err := sw.Pass(context.Background())

	require.NoError(t, err)
	require.Equal(t, Counts{Retried: 1, Failed: 1}, c)
	require.Equal(t, int32(1), nudges.Load(), "the dispatcher is nudged after a next attempt was scheduled")
	require.Equal(t, retriedBefore+1, testutil.ToFloat64(swept.WithLabelValues(OutcomeRetried)))
	require.Equal(t, failedBefore+1, testutil.ToFloat64(swept.WithLabelValues(OutcomeFailed)))
	require.GreaterOrEqual(t, testutil.ToFloat64(lastRun), start)
	require.Equal(t, execution.StatusPending, status(t, s, retried))
	require.Equal(t, execution.StatusFailed, status(t, s, failed))

	c, err = sw.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, Counts{}, c)
	require.Equal(t, int32(1), nudges.Load(), "no nudge when nothing was scheduled")
}

func TestRunSweepsUntilCancelled(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	sw := New(store.New(s.Pool), Options{Interval: 10 * time.Millisecond, Scale: identity, Logger: zaptest.NewLogger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sw.Run(ctx) }()

	// Inserted while the sweeper runs: found by whichever pass comes next.
	id := insertExpired(t, s, dbtest.TestMaxAttempts)
	require.Eventually(t, func() bool { return status(t, s, id) == execution.StatusFailed }, 10*time.Second, 10*time.Millisecond)

	cancel()
	require.NoError(t, <-done)
}
