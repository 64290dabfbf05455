package dbtest

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
)

// WithClockSkew returns the schema as seen by a database whose clock runs skew ahead of this
// host's (behind, if negative): its URL and Pool resolve now() to a function of the schema that
// returns pg_catalog.now() + skew. Every service computes and compares its due times, deadlines
// and leases with the database's now(); a test that runs a store on the skewed schema shows that
// the Go side's clock plays no part — any time.Now() of the host mixed into them is off by skew.
//
// The trick is the search path "<schema>, pg_catalog": pg_catalog named after the schema is
// searched after it, so the schema's now() wins over the built-in one. Column defaults were
// resolved to pg_catalog.now() when the schema was migrated and keep the real clock (created_at
// and the like); the platform's statements name now() explicitly wherever a time is compared.
func (s *Schema) WithClockSkew(t testing.TB, skew time.Duration) *Schema {
	t.Helper()
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE OR REPLACE FUNCTION %s.now() RETURNS timestamptz LANGUAGE sql STABLE
		AS $$ SELECT pg_catalog.now() + make_interval(secs => %f) $$`, s.Name, skew.Seconds()))
	require.NoError(t, err)

	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", s.Name+",pg_catalog")
	u.RawQuery = q.Encode()
	skewedURL := u.String()
	pool, err := db.Open(ctx, skewedURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// Check the skew is in force: a test that relied on a skew that silently did not apply would
	// prove nothing.
	var got float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT extract(epoch FROM now() - pg_catalog.now())::float8`).Scan(&got))
	require.InDelta(t, skew.Seconds(), got, 0.001, "skewed now() in force")
	return &Schema{Name: s.Name, URL: skewedURL, Pool: pool}
}
