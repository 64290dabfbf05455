package riverpeer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/accept"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// databaseURL is the tests' database (INTEGRATIONS_TEST_DATABASE_URL), as for every other test.
func databaseURL() string { return dbtest.BaseURL() }

// freshSchema creates a schema with River's tables, dropped when the test ends.
func freshSchema(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "riverpeer_test_" + hex.EncodeToString(b)
	if err := accept.MigrateRiver(ctx, url, schema); err != nil {
		t.Fatalf("migrate River into %s: %v", schema, err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool, err := accept.Pool(cctx, url, 1)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer pool.Close()
		if _, err := pool.Exec(cctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := databaseURL()
	schema := freshSchema(t, ctx, url)

	c := BestConfig()
	c.DatabaseURL, c.Schema, c.N, c.Concurrency = url, schema, 200, 8
	// Twice on the same schema: the second run starts from an emptied job table.
	for run := range 2 {
		r, err := Run(ctx, c)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		t.Logf("run %d: %d completed in %s (%.0f/s), p50 %s p99 %s max %s; River: queue wait p50 %s, complete p50 %s; %s",
			run, r.Completed, r.Elapsed, r.Rate(), r.P50, r.P99, r.Max, r.QueueWaitP50, r.CompleteP50, r.Config)
		if r.Completed != 200 || r.Errors != 0 {
			t.Fatalf("run %d: completed %d, errors %d (first: %v), want 200 and 0", run, r.Completed, r.Errors, r.FirstErr)
		}
		if !(r.P50 <= r.P99 && r.P99 <= r.Max) {
			t.Errorf("run %d: p50 %s, p99 %s, max %s not ordered", run, r.P50, r.P99, r.Max)
		}
		if r.Elapsed <= 0 || r.Rate() <= 0 {
			t.Errorf("run %d: elapsed %s, rate %f", run, r.Elapsed, r.Rate())
		}
	}
}
