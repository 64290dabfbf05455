package dbtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestSchemaIsReusedEmptyAndUnchanged: a schema its test left as migrated is handed to the next
// test emptied — rows gone, sequences restarted; one whose structure the test changed is not
// handed on.
func TestSchemaIsReusedEmptyAndUnchanged(t *testing.T) {
	ctx := context.Background()
	var first string
	t.Run("writes", func(t *testing.T) {
		s := dbtest.NewSchema(t)
		first = s.Name
		s.ApplyCatalog(t, dbtest.TestCatalog)
		s.InsertExecution(t, dbtest.Execution{})
	})
	t.Run("gets it back empty", func(t *testing.T) {
		s := dbtest.NewSchema(t)
		require.Equal(t, first, s.Name, "the schema the last test gave back")
		for _, table := range []string{"applications", "capabilities", "executions"} {
			var n int
			require.NoError(t, s.Pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
			require.Zero(t, n, "%s is empty", table)
		}
		// Goose's bookkeeping survives the emptying: a migration down and up again works.
		_, err := db.MigrateDownTo(ctx, s.URL, 8)
		require.NoError(t, err)
		_, err = db.Migrate(ctx, s.URL)
		require.NoError(t, err)
		// Changes its structure: the schema must not be handed on.
		_, err = s.Pool.Exec(ctx, `CREATE INDEX extra ON executions (created_at)`)
		require.NoError(t, err)
	})
	t.Run("a changed schema is not reused", func(t *testing.T) {
		s := dbtest.NewSchema(t)
		require.NotEqual(t, first, s.Name)
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'extra'`, s.Name).Scan(&n))
		require.Zero(t, n)
	})
	var skewed string
	t.Run("skews its clock", func(t *testing.T) {
		skewed = dbtest.NewSchema(t).WithClockSkew(t, time.Hour).Name
	})
	t.Run("a skewed clock is not reused", func(t *testing.T) {
		require.NotEqual(t, skewed, dbtest.NewSchema(t).Name)
	})
	require.NotZero(t, dbtest.Reusable(), "the unchanged schema waits for the next test")
}

// BenchmarkSchema: a test's schema, migrated for it and dropped after it, beside one reused,
// emptied, from the test before: set-up and teardown together, as a test pays them.
func BenchmarkSchema(b *testing.B) {
	for _, peer := range []struct {
		name    string
		noReuse bool
	}{{"migrated-each-time", true}, {"reused", false}} {
		b.Run(peer.name, func(b *testing.B) {
			defer dbtest.SetNoReuse(peer.noReuse)()
			for range b.N {
				sc := &dbtest.Scope{TB: b}
				dbtest.NewSchemaIn(sc)
				sc.Close()
			}
		})
	}
}
