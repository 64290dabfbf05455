package catalog_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// rateLimitCatalog is a one-application catalog with limits (YAML lines under rate_limits).
func rateLimitCatalog(limits string) string {
	doc := "applications:\n  - id: app-a\n    api_key: abcdefghijklmnopqrstuvwxyz\n"
	if limits != "" {
		doc += "    rate_limits:\n" + limits
	}
	return doc
}

func TestParseRateLimits(t *testing.T) {
	t.Parallel()
	c, err := catalog.Parse([]byte(rateLimitCatalog(
		"      invokes_per_second: 2.5\n      invoke_burst: 5\n      reads_per_second: 0\n")), env(nil))
	require.NoError(t, err)
	r := c.Applications[0].RateLimits
	require.NotNil(t, r)
	require.InDelta(t, 2.5, *r.InvokesPerSecond, 1e-9)
	require.Equal(t, 5, *r.InvokeBurst)
	require.Zero(t, *r.ReadsPerSecond, "0 is given (unlimited), not left out")
	require.Nil(t, r.ReadBurst, "left out: the deployment's default")
}

func TestRateLimitValidationNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ limits, field string }{
		{"      invokes_per_second: -1\n", "applications[0].rate_limits.invokes_per_second: -1"},
		{"      invokes_per_second: .nan\n", "applications[0].rate_limits.invokes_per_second: NaN"},
		{"      reads_per_second: .inf\n", "applications[0].rate_limits.reads_per_second: +Inf"},
		{"      reads_per_second: 1000001\n", "applications[0].rate_limits.reads_per_second"},
		{"      reads_per_second: 1e-300\n", "applications[0].rate_limits.reads_per_second: 1e-300 must be 0 (unlimited) or between 0.001"},
		{"      invokes_per_second: 0.0009\n", "applications[0].rate_limits.invokes_per_second: 0.0009"},
		{"      invoke_burst: 0\n", "applications[0].rate_limits.invoke_burst: 0"},
		{"      read_burst: -3\n", "applications[0].rate_limits.read_burst: -3"},
		{"      read_burst: 1000001\n", "applications[0].rate_limits.read_burst"},
		{"      reads_per_minute: 5\n", "reads_per_minute"}, // unknown fields are refused
		{"      invoke_burst: many\n", "line 5"},            // a decoding error names the line
	} {
		_, err := catalog.Parse([]byte(rateLimitCatalog(tc.limits)), env(nil))
		require.Error(t, err, tc.limits)
		require.Contains(t, err.Error(), tc.field, tc.limits)
	}
}

type limitsRow struct {
	invokes, reads *float64
	invokeBurst    *int
	readBurst      *int
}

func readLimits(t *testing.T, s *dbtest.Schema, app string) limitsRow {
	t.Helper()
	var r limitsRow
	require.NoError(t, s.Pool.QueryRow(context.Background(), `
		SELECT invokes_per_second, invoke_burst, reads_per_second, read_burst FROM applications WHERE id = $1`,
		app).Scan(&r.invokes, &r.invokeBurst, &r.reads, &r.readBurst))
	return r
}

func TestApplyStoresRateLimitsAndResetsThemWhenLeftOut(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	ctx := context.Background()
	apply := func(doc string) {
		t.Helper()
		c, err := catalog.Parse([]byte(doc), env(nil))
		require.NoError(t, err)
		require.NoError(t, catalog.Apply(ctx, s.Pool, c))
	}

	apply(rateLimitCatalog("      invokes_per_second: 100\n      invoke_burst: 200\n      read_burst: 7\n"))
	r := readLimits(t, s, "app-a")
	require.NotNil(t, r.invokes)
	require.InDelta(t, 100, *r.invokes, 1e-9)
	require.Equal(t, 200, *r.invokeBurst)
	require.Nil(t, r.reads, "a field left out is stored as NULL: the deployment's default")
	require.Equal(t, 7, *r.readBurst)

	apply(rateLimitCatalog(""))
	require.Equal(t, limitsRow{}, readLimits(t, s, "app-a"), "limits no longer declared go back to the defaults")
}
