// Package dbtest gives each test a schema of its own in the real Postgres, migrated to the
// current version and dropped when the test ends, so tests run in parallel without cross-talk.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
)

// DefaultURL is the database tests use unless INTEGRATIONS_TEST_DATABASE_URL says otherwise.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// BaseURL returns the test database URL.
func BaseURL() string {
	if u := os.Getenv("INTEGRATIONS_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Schema is a migrated schema of the test's own.
type Schema struct {
	Name string
	// URL connects with search_path set to the schema; hand it to services under test.
	URL  string
	Pool *pgxpool.Pool
}

// NewSchema creates and migrates a fresh schema, and drops it when t ends.
func NewSchema(t testing.TB) *Schema {
	t.Helper()
	return newSchema(t, true)
}

// NewEmptySchema creates a fresh schema with no migration applied, and drops it when t ends.
func NewEmptySchema(t testing.TB) *Schema {
	t.Helper()
	return newSchema(t, false)
}

func newSchema(t testing.TB, migrate bool) *Schema {
	t.Helper()
	ctx := context.Background()
	admin, err := db.Open(ctx, BaseURL())
	require.NoError(t, err, "test database (set INTEGRATIONS_TEST_DATABASE_URL)")
	t.Cleanup(admin.Close)

	name := "t_" + randomHex(6)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
	})

	u, err := url.Parse(BaseURL())
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	schemaURL := u.String()

	if migrate {
		_, err = db.Migrate(ctx, schemaURL)
		require.NoError(t, err)
	}
	pool, err := db.Open(ctx, schemaURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &Schema{Name: name, URL: schemaURL, Pool: pool}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
