package db_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSQLSTATEReadOnlyHere: outside pkg/db no code reads a Postgres error's SQLSTATE (a
// pgconn.PgError) itself; it asks Classify and the predicates beside it, so that one taxonomy
// decides what every database error means. Tests may build PgErrors.
func TestSQLSTATEReadOnlyHere(t *testing.T) {
	t.Parallel()
	var found []string
	for _, root := range []string{"../../services", "../../pkg", "../../cmd"} {
		require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path == "../../pkg/db" || path == "../../pkg/gen" || d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if strings.Contains(string(src), "pgconn.PgError") {
				found = append(found, path)
			}
			return nil
		}))
	}
	require.Empty(t, found, "read database errors through db.Classify (pkg/db/errors.go)")
}
