package db_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// goose keeps its version table in the schema; it is bookkeeping, not part of the schema.
const versionTable = "goose_db_version"

// tables lists the schema's tables other than goose's version table.
func tables(t *testing.T, s *dbtest.Schema) []string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `
		SELECT table_name FROM information_schema.tables
		WHERE table_schema = $1 AND table_name <> $2
		ORDER BY table_name`, s.Name, versionTable)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestMigrateDownAndUpAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t) // applies every migration

	want := []string{"adapters", "api_keys", "applications", "capabilities", "console_audit", "console_sessions_ended", "dispatches", "event_deliveries",
		"execution_attempts", "executions", "gateway_replicas", "integration_events"}
	require.Equal(t, want, tables(t, s))

	st, err := db.MigrationStatus(ctx, s.URL)
	require.NoError(t, err)
	require.NotEmpty(t, st)
	for _, m := range st {
		require.Equal(t, goose.StateApplied, m.State, "migration %d", m.Source.Version)
	}
	last := st[len(st)-1].Source.Version

	results, err := db.Migrate(ctx, s.URL)
	require.NoError(t, err)
	require.Empty(t, results, "a migrated schema has nothing to apply")

	// Roll back every migration, newest first.
	for i := len(st) - 1; i >= 0; i-- {
		res, err := db.MigrateDown(ctx, s.URL)
		require.NoError(t, err)
		require.Equal(t, st[i].Source.Version, res.Source.Version)
	}
	require.Empty(t, tables(t, s), "after rolling back every migration no table is left")

	st, err = db.MigrationStatus(ctx, s.URL)
	require.NoError(t, err)
	for _, m := range st {
		require.Equal(t, goose.StatePending, m.State, "migration %d", m.Source.Version)
	}

	results, err = db.Migrate(ctx, s.URL)
	require.NoError(t, err)
	require.Len(t, results, len(st))
	require.Equal(t, last, results[len(results)-1].Source.Version)
	require.Equal(t, want, tables(t, s))

	st, err = db.MigrationStatus(ctx, s.URL)
	require.NoError(t, err)
	for _, m := range st {
		require.Equal(t, goose.StateApplied, m.State, "migration %d", m.Source.Version)
	}
}

// Migrations run against the search_path's schema only: migrating one schema leaves another
// test's schema as it was.
func TestMigrateTouchesOnlyItsSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := dbtest.NewSchema(t), dbtest.NewSchema(t)

	st, err := db.MigrationStatus(ctx, a.URL)
	require.NoError(t, err)
	for range st {
		_, err := db.MigrateDown(ctx, a.URL)
		require.NoError(t, err)
	}
	require.NotContains(t, tables(t, a), "executions")
	require.Contains(t, tables(t, b), "executions")
}
