package dbtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestCatalog's YAML cannot be built from the constants tests assert against, so this keeps the
// two from drifting apart.
func TestTestCatalogMatchesItsConstants(t *testing.T) {
	t.Parallel()
	c, err := catalog.Parse([]byte(dbtest.TestCatalog), func(string) (string, bool) { return "", false })
	require.NoError(t, err)

	require.Len(t, c.Applications, 1)
	require.Equal(t, dbtest.TestApp, c.Applications[0].ID)
	require.Equal(t, dbtest.TestAPIKey, c.Applications[0].APIKey)

	require.Len(t, c.Adapters, 1)
	require.Equal(t, dbtest.TestAdapter, c.Adapters[0].ID)
	require.Equal(t, dbtest.TestAdapterEndpoint, c.Adapters[0].Endpoint)

	require.Len(t, c.Capabilities, 1)
	cp := c.Capabilities[0]
	require.Equal(t, dbtest.TestCapability, cp.Name)
	require.Equal(t, dbtest.TestAdapter, cp.Adapter)
	require.Equal(t, []string{"async"}, cp.Modes)
	require.Equal(t, dbtest.TestMaxAttempts, cp.MaxAttempts)
	require.Equal(t, dbtest.TestAsyncBudget, duration(t, cp.AsyncBudget))
	require.Equal(t, dbtest.TestLease, duration(t, cp.Lease))
	var delays []time.Duration
	for _, s := range cp.RetryDelays {
		delays = append(delays, duration(t, s))
	}
	require.Equal(t, dbtest.TestRetryDelays(), delays)
}

// The defaults are what tests rely on without saying so; this pins them.
func TestInsertExecutionDefaults(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()

	type row struct {
		App, Capability, Mode, Status string
		Attempt, MaxAttempts          int32
		Payload                       string
		DeadlineIn                    time.Duration
		Leased, Settled               bool
	}
	read := func(id string) row {
		var r row
		var deadlineSecs float64
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT application_id, capability, mode, status, attempt, max_attempts, payload::text,
				extract(epoch FROM deadline_at - now())::float8, lease_expires_at IS NOT NULL, settled_at IS NOT NULL
			FROM executions WHERE id = $1`, id).Scan(&r.App, &r.Capability, &r.Mode, &r.Status, &r.Attempt,
			&r.MaxAttempts, &r.Payload, &deadlineSecs, &r.Leased, &r.Settled))
		r.DeadlineIn = time.Duration(deadlineSecs * float64(time.Second)).Round(time.Hour)
		return r
	}

	pending := s.InsertExecution(t, dbtest.Execution{})
	require.Equal(t, row{App: dbtest.TestApp, Capability: dbtest.TestCapability, Mode: "async", Status: "pending",
		MaxAttempts: dbtest.TestMaxAttempts, Payload: "{}", DeadlineIn: 24 * time.Hour}, read(pending))

	runningID := s.InsertExecution(t, dbtest.Execution{Status: "running", Attempt: 2})
	running := read(runningID)
	require.True(t, running.Leased, "a running execution holds a lease")
	require.False(t, running.Settled)
	require.True(t, read(s.InsertExecution(t, dbtest.Execution{Status: "cancelled"})).Settled)

	s.InsertAttempts(t, runningID, dbtest.Attempt{N: 1, Outcome: "failed", FailureClass: "transient"}, dbtest.Attempt{N: 2})
	rows, err := s.Pool.Query(ctx, `
		SELECT ended_at IS NOT NULL, coalesce(outcome, ''), coalesce(failure_class, ''), length(callback_token_hash)
		FROM execution_attempts WHERE execution_id = $1 ORDER BY n`, runningID)
	require.NoError(t, err)
	defer rows.Close()
	type attempt struct {
		Ended          bool
		Outcome, Class string
		TokenHashLen   int
	}
	var got []attempt
	for rows.Next() {
		var a attempt
		require.NoError(t, rows.Scan(&a.Ended, &a.Outcome, &a.Class, &a.TokenHashLen))
		got = append(got, a)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []attempt{{true, "failed", "transient", 32}, {false, "", "", 32}}, got)
}

func duration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	require.NoError(t, err)
	return d
}
