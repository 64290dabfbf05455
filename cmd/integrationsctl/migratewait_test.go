package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// On an empty schema the wait names every pending migration at its timeout; it returns as soon
// as the migrations are applied meanwhile, and at once on a migrated schema.
func TestMigrateWait(t *testing.T) {
	s := dbtest.NewEmptySchema(t)

	out, err := runRoot(t, "migrate", "wait", "--database-url", s.URL, "--timeout", "3s", "--interval", "100ms")
	require.Error(t, err, out)
	require.ErrorContains(t, err, "schema not ready: at version 0")
	require.ErrorContains(t, err, "00001_")

	done := make(chan error, 1)
	go func() {
		_, err := waitForSchema(context.Background(), s.URL, 20*time.Millisecond, nil)
		done <- err
	}()
	_, err = db.Migrate(context.Background(), s.URL)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not see the migrations applied")
	}

	out, err = runRoot(t, "migrate", "wait", "--database-url", s.URL, "--timeout", "5s")
	require.NoError(t, err)
	require.Contains(t, out, "schema ready at version")
}
