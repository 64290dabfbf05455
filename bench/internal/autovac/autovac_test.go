package autovac

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// analyzed reports whether the table was analyzed by hand (a stand-in's ANALYZE or VACUUM (ANALYZE)).
func analyzed(t *testing.T, s *dbtest.Schema, table string) bool {
	t.Helper()
	var n int64
	require.NoError(t, s.Pool.QueryRow(context.Background(),
		`SELECT analyze_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, s.Name, table).Scan(&n))
	return n > 0
}

func TestAStandInAnalyzesTheTablesOverTheThresholdAndOnlyThose(t *testing.T) {
	ctx := context.Background()
	s := dbtest.NewEmptySchema(t)
	_, err := s.Pool.Exec(ctx, `
		CREATE TABLE grown (id int PRIMARY KEY);
		CREATE TABLE small (id int PRIMARY KEY);
		INSERT INTO grown SELECT generate_series(1, 2000);
		INSERT INTO small VALUES (1), (2), (3)`)
	require.NoError(t, err)

	st := Start(ctx, s.Pool, 20*time.Millisecond, s.Name)
	// The statistics of the inserts reach pg_stat_user_tables shortly after their commit: wait
	// for the stand-in to see them and act.
	require.Eventually(t, func() bool { return analyzed(t, s, "grown") }, 20*time.Second, 20*time.Millisecond,
		"2000 inserted rows are over autovacuum's thresholds (50 + 10 %% of an empty table): the stand-in analyzes the table")
	stats := st.Stop()
	require.Zero(t, stats.Errors, "last error: %v", stats.LastErr)
	require.GreaterOrEqual(t, stats.Vacuums+stats.Analyzes, 1)
	require.False(t, analyzed(t, s, "small"), "3 rows are under the thresholds: left alone, as autovacuum would")

	var reltuples float64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, s.Name+".grown").Scan(&reltuples))
	require.Equal(t, float64(2000), reltuples, "the planner now knows the table's size")
}
