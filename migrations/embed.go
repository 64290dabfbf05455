// Package migrations holds the numbered SQL migrations of the shared schema, embedded so that
// every binary and test applies exactly the files in this folder.
package migrations

import "embed"

// FS holds the migration files (NNNNN_name.sql, goose format: an Up and a Down section each).
//
//go:embed *.sql
var FS embed.FS
