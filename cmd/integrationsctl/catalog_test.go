package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// TestCatalogApplyRefusesAWeakKeyUnlessAllowed: a weak api_key is refused before anything is
// written, naming the field, the application and the variable, never the key; --allow-weak-keys
// (make run) applies it with a warning, recorded weak for the gateway; a strong key goes through.
func TestCatalogApplyRefusesAWeakKeyUnlessAllowed(t *testing.T) {
	s := dbtest.NewSchema(t)
	file := filepath.Join(t.TempDir(), "catalog.yaml")
	require.NoError(t, os.WriteFile(file, []byte("applications:\n  - id: dev-app\n    api_key: ${CATALOG_TEST_API_KEY}\n"), 0o600))
	const weakKey = "dev-api-key-change-me"
	t.Setenv("CATALOG_TEST_API_KEY", weakKey)
	const refusal = "applications[0].api_key of application dev-app (set from CATALOG_TEST_API_KEY) does not look like 32 random bytes (21 characters, fewer than 32)"
	verdict := func() *bool {
		var weak *bool
		require.NoError(t, s.Pool.QueryRow(context.Background(),
			`SELECT weak FROM api_keys WHERE application_id = 'dev-app' AND source = 'catalog'`).Scan(&weak))
		return weak
	}

	for _, sub := range []string{"check", "apply"} {
		out, err := runRoot(t, "catalog", sub, file, "--database-url", s.URL)
		require.ErrorContains(t, err, refusal, sub)
		require.ErrorContains(t, err, "--allow-weak-keys")
		assert.NotContains(t, out+err.Error(), weakKey, "the key itself is never printed")
	}
	var apps int
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM applications`).Scan(&apps))
	require.Zero(t, apps, "a refused catalog writes nothing")

	out, err := runRoot(t, "catalog", "apply", file, "--database-url", s.URL, "--allow-weak-keys")
	require.NoError(t, err)
	assert.Contains(t, out, "warning: "+refusal+": taken (--allow-weak-keys)")
	assert.Contains(t, out, "catalog applied: 1 applications")
	assert.NotContains(t, out, weakKey)
	require.Equal(t, new(true), verdict(), "recorded weak, for the gateway to refuse off loopback")

	t.Setenv("CATALOG_TEST_API_KEY", "q8ZxW2vN0pL5tR7yB1cD4fG6hJ9kM3sA") // head -c 24 /dev/urandom | base64
	out, err = runRoot(t, "catalog", "apply", file, "--database-url", s.URL)
	require.NoError(t, err)
	assert.NotContains(t, out, "warning")
	require.Equal(t, new(false), verdict())
}
