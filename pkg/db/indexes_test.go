package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// redundantIndexes lists the schema's indexes that another index of the same table makes
// redundant, each as "redundant <= kept": the same definition (columns or expressions, operator
// classes, order, predicate) under another name, or a plain index whose columns lead another
// index's with the same predicate (a unique index stays: it is a constraint). Each costs an
// index entry per insert and per non-HOT update and buys no plan.
func redundantIndexes(t *testing.T, s *dbtest.Schema) []string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `
		WITH ix AS (
			SELECT i.indexrelid, i.indrelid, i.indisunique, i.indnatts, i.indexprs IS NOT NULL AS exprs,
				string_to_array(i.indkey::text, ' ') AS keys,
				string_to_array(i.indclass::text, ' ') AS classes,
				string_to_array(i.indoption::text, ' ') AS options,
				coalesce(pg_get_expr(i.indpred, i.indrelid), '') AS pred,
				regexp_replace(pg_get_indexdef(i.indexrelid), '^CREATE (UNIQUE )?INDEX \S+ ON ', '') AS def
			FROM pg_index i
			JOIN pg_class c ON c.oid = i.indrelid
			JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname <> 'goose_db_version'
		)
		SELECT a.indexrelid::regclass::text || ' <= ' || b.indexrelid::regclass::text
		FROM ix a JOIN ix b ON a.indrelid = b.indrelid AND a.indexrelid <> b.indexrelid
		WHERE (a.def = b.def AND (NOT a.indisunique OR b.indisunique) AND (a.indisunique <> b.indisunique OR a.indexrelid > b.indexrelid))
			OR (NOT a.indisunique AND NOT a.exprs AND NOT b.exprs AND a.pred = b.pred AND a.indnatts <= b.indnatts
				AND a.keys = b.keys[1:a.indnatts] AND a.classes = b.classes[1:a.indnatts]
				AND a.options = b.options[1:a.indnatts] AND a.def <> b.def)
		ORDER BY 1`, s.Name)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var r string
		require.NoError(t, rows.Scan(&r))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// The migrated schema has no index that another makes redundant; before migration 00011 it had
// one, which shows the check finds what it looks for.
func TestSchemaHasNoRedundantIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	assert.Empty(t, redundantIndexes(t, s))

	_, err := db.MigrateDownTo(ctx, s.URL, 10)
	require.NoError(t, err)
	assert.Equal(t, []string{"integration_events_execution_id_idx <= integration_events_execution_id_type_key"},
		redundantIndexes(t, s))
	_, err = db.Migrate(ctx, s.URL)
	require.NoError(t, err)
	assert.Empty(t, redundantIndexes(t, s))

	// A copy under another name, and a plain index duplicating a unique one, are found too.
	_, err = s.Pool.Exec(ctx, `CREATE INDEX copy_due ON dispatches (due_at);
		CREATE INDEX copy_attempt ON dispatches (execution_id, attempt)`)
	require.NoError(t, err)
	assert.Equal(t, []string{"copy_attempt <= dispatches_execution_id_attempt_key", "copy_due <= dispatches_due_at_idx"},
		redundantIndexes(t, s))
}
