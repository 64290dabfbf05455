package devca_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// TestFilesAreTheOwnersOnly: a directory left readable by others is tightened, and a leftover
// temporary file readable by others does not lend its mode to a key written through it.
func TestFilesAreTheOwnersOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev-ca")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.Chmod(dir, 0o755)) // whatever the umask made of it
	leftover := devca.KeyFile(dir, "gateway") + ".tmp"
	require.NoError(t, os.WriteFile(leftover, []byte("stale"), 0o644))
	require.NoError(t, os.Chmod(leftover, 0o644))

	_, err := devca.Ensure(dir, "gateway")
	require.NoError(t, err)

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "the directory is the owner's only")
	for _, f := range []string{devca.KeyFile(dir, "gateway"), devca.CertFile(dir, "gateway"), filepath.Join(dir, "ca-key.pem")} {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
	}
	_, err = os.Stat(leftover)
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary file was renamed into place")
}
