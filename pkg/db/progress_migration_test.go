package db_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// Migration 00014 (progress events) numbers the events already written (each its execution's
// only one: sequence 1) without rewriting the executions that have them. Goose runs a migration
// in one transaction, and its ALTER TABLE of executions holds that table locked against every
// read and write until the commit: an UPDATE of every settled execution there would stop the
// platform for as long as it takes to rewrite the history. Those executions are settled and
// write no event again, so their counter has nothing to count.
func TestProgressMigrationDoesNotRewriteSettledExecutions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	_, err := db.MigrateDownTo(ctx, s.URL, 13)
	require.NoError(t, err)

	settled := s.InsertExecution(t, dbtest.Execution{Status: "succeeded", Attempt: 1})
	event := uuid.NewString()
	_, err = s.Pool.Exec(ctx, `INSERT INTO integration_events (id, application_id, execution_id, type, payload)
		SELECT $1, application_id, id, 'execution.completed', '{}' FROM executions WHERE id = $2`, event, settled)
	require.NoError(t, err)
	var before string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT xmin::text FROM executions WHERE id = $1`, settled).Scan(&before))

	_, err = db.Migrate(ctx, s.URL)
	require.NoError(t, err)
	// The migrated schema's statements are prepared anew: the pool's cached plans know the old one.
	s.Pool.Reset()
	var after string
	var seq int32
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT x.xmin::text, e.sequence FROM executions x JOIN integration_events e
		ON e.execution_id = x.id WHERE x.id = $1`, settled).Scan(&after, &seq))
	require.Equal(t, int32(1), seq, "the event written before is its execution's first")
	require.Equal(t, before, after, "the settled execution's row was not rewritten")
}
