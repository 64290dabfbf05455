package db_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// TestOpenVerifiesTheServer: a database URL with sslmode=verify-full and sslrootcert connects
// over TLS when the server's certificate verifies against the root and names the host, and is
// refused when it does not. The server's certificate is INTEGRATIONS_TEST_PG_ROOT_CERT (default
// Debian's snakeoil one, which a stock postgresql package serves, for localhost).
func TestOpenVerifiesTheServer(t *testing.T) {
	root := os.Getenv("INTEGRATIONS_TEST_PG_ROOT_CERT")
	if root == "" {
		root = "/etc/ssl/certs/ssl-cert-snakeoil.pem"
	}
	if _, err := os.Stat(root); err != nil {
		t.Skipf("no certificate of the test server to verify it with (INTEGRATIONS_TEST_PG_ROOT_CERT): %v", err)
	}
	ctx := context.Background()
	withTLS := func(host, rootCert string) string {
		u, err := url.Parse(dbtest.BaseURL())
		require.NoError(t, err)
		_, port, err := net.SplitHostPort(u.Host)
		require.NoError(t, err)
		u.Host = net.JoinHostPort(host, port)
		q := u.Query()
		q.Set("sslmode", "verify-full")
		q.Set("sslrootcert", rootCert)
		u.RawQuery = q.Encode()
		return u.String()
	}
	pool, err := db.Open(ctx, withTLS("localhost", root))
	if err != nil && !strings.Contains(err.Error(), "certificate") {
		t.Skipf("the test server does not serve TLS with %s: %v", root, err)
	}
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var ssl bool
	var version string
	require.NoError(t, pool.QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version))
	assert.True(t, ssl, "the connection is TLS")
	assert.Contains(t, []string{"TLSv1.2", "TLSv1.3"}, version)

	other := t.TempDir()
	_, err = devca.Ensure(other)
	require.NoError(t, err)
	_, err = db.Open(ctx, withTLS("localhost", devca.CAFile(other)))
	assert.ErrorContains(t, err, "certificate", "a server the root does not sign is refused")
	_, err = db.Open(ctx, withTLS("127.0.0.1", root))
	assert.ErrorContains(t, err, "certificate", "a server whose certificate names another host is refused")
}
