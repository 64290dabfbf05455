package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	launcher "github.com/integrations-platform/integrations/e2e/stack"
	"github.com/integrations-platform/integrations/pkg/apikey"
)

// keysCacheTTL is the gateways' INTEGRATIONS_GATEWAY_CACHE_TTL here: how long a revoked key may
// keep working on a replica that had it cached.
const keysCacheTTL = 2 * time.Second

// TestAPIKeyLifecycle runs two gateway replicas on one database: keys created through the
// operator API and integrationsctl both work on both (a rotation's overlap); a revoked key is
// refused by every replica within the cache TTL while the other keeps working; the listing shows
// when each key was last used.
//
// The client-facing listeners stay plain here whatever INTEGRATIONS_E2E_PUBLIC_TLS says: the test
// is about keys, and integrationsctl's operator client reaches the second replica by URL.
func TestAPIKeyLifecycle(t *testing.T) {
	s := newStackWith(t, timeScale, false)
	http2 := freeAddr(t)
	ttl := "INTEGRATIONS_GATEWAY_CACHE_TTL=" + keysCacheTTL.String()
	s.ProgramEnv["gateway"] = []string{ttl}
	s.ProgramEnv["gateway-2"] = []string{ttl, "INTEGRATIONS_HTTP_ADDR=" + http2}
	s.start("gateway")
	s.startInstance("gateway-2", "gateway")
	replicas := []string{s.RESTURL, "http://" + http2}

	ctl := buildCtl(t)
	runCtl := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(ctl, append(args, "--admin-url", replicas[1], "--application", "dev-app")...)
		cmd.Env = []string{"INTEGRATIONS_ADMIN_TOKEN=" + adminToken, "PATH=" + os.Getenv("PATH")}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "integrationsctl %v: %s", args, stderr.String())
		return stdout.String(), stderr.String()
	}
	// get lists the application's executions through one replica with key: a read that needs
	// nothing but authentication and Postgres.
	get := func(base, key string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+"/v1/executions", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := s.http.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	admin := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, replicas[0]+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := s.http.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out := map[string]any{}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}

	// Key A through the operator API of replica 1, key B through integrationsctl on replica 2.
	code, created := admin(http.MethodPost, "/api/v1/system/applications/dev-app/keys", `{"description": "key A", "expires_in": "720h"}`)
	require.Equal(t, http.StatusCreated, code, "%v", created)
	keyA := created["key"].(string)
	idA := created["id"].(string)
	out, errOut := runCtl("keys", "create", "--description", "key B")
	keyB := strings.TrimSpace(out)
	parsedB, err := apikey.Parse(keyB)
	require.NoError(t, err, "integrationsctl prints the new key: %q", out)
	assert.Contains(t, errOut, parsedB.ID)

	for _, base := range replicas {
		for _, key := range []string{keyA, keyB, s.APIKey} {
			code, body := get(base, key)
			require.Equal(t, http.StatusOK, code, "%s: %s", base, body)
		}
	}

	// Revoke A; both replicas have it cached. Each refuses it within the TTL, found by polling.
	out, _ = runCtl("keys", "revoke", idA)
	revokedAt := time.Now()
	require.Contains(t, out, "key "+idA+" revoked")
	for _, base := range replicas {
		var last string
		for {
			code, body := get(base, keyA)
			if code == http.StatusUnauthorized {
				assert.Contains(t, body, "API key revoked")
				t.Logf("%s refuses the revoked key %s after the revocation", base, time.Since(revokedAt).Round(time.Millisecond))
				break
			}
			require.Equal(t, http.StatusOK, code, body)
			last = body
			// A cache that kept the key would accept it for good: TTL + 5 s tells that apart, with
			// room for a loaded machine's slow polls (TTL + 1 s did not always).
			require.Less(t, time.Since(revokedAt), keysCacheTTL+5*time.Second,
				"%s still accepts the revoked key past the cache TTL (%s)", base, last)
			time.Sleep(20 * time.Millisecond) // polling the API: a replica's cache expiry is no event
		}
	}
	for _, base := range replicas {
		code, body := get(base, keyB)
		require.Equal(t, http.StatusOK, code, "the other key keeps working on %s: %s", base, body)
	}

	// A typo in a generated key is refused by its checksum.
	typo := []byte(keyB)
	typo[len(apikey.Prefix)+3] ^= 1
	code, body := get(replicas[0], string(typo))
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "malformed API key")

	// The listing shows B's last use (written asynchronously), A revoked, and no secret.
	listed := func() map[string]map[string]any {
		code, list := admin(http.MethodGet, "/api/v1/system/applications/dev-app/keys", "")
		require.Equal(t, http.StatusOK, code)
		raw, _ := json.Marshal(list)
		require.NotContains(t, string(raw), keyA)
		require.NotContains(t, string(raw), keyB)
		seen := map[string]map[string]any{}
		for _, k := range list["keys"].([]any) {
			m := k.(map[string]any)
			seen[m["id"].(string)] = m
		}
		return seen
	}
	deadline := time.Now().Add(10 * time.Second)
	seen := listed()
	for seen[parsedB.ID]["last_used_at"] == nil || seen[idA]["last_used_at"] == nil {
		require.True(t, time.Now().Before(deadline), "last use not recorded: %v", seen)
		time.Sleep(50 * time.Millisecond) // polling the API: the write is asynchronous by design
		seen = listed()
	}
	require.Len(t, seen, 3, "the catalog key, A and B")
	assert.Equal(t, "revoked", seen[idA]["status"])
	assert.Equal(t, "active", seen[parsedB.ID]["status"])
	out, _ = runCtl("keys", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	for _, line := range lines[1:] {
		if strings.HasPrefix(line, parsedB.ID) {
			assert.Contains(t, line, "igk_"+parsedB.ID)
			assert.Contains(t, line, "active")
			assert.Regexp(t, `\d{4}-\d\d-\d\dT\S+\s+never\s+\d{4}-\d\d-\d\dT`, line, "created, never expires, last used")
		}
	}

	// The catalog key (a chosen one, cached by its hash) revoked through replica 2 is refused
	// there at once, and is no longer in the column the previous release's gateways read.
	var catalogID string
	for id, k := range seen {
		if k["source"] == "catalog" {
			catalogID = id
		}
	}
	require.NotEmpty(t, catalogID)
	code, body = get(replicas[1], s.APIKey)
	require.Equal(t, http.StatusOK, code, body)
	runCtl("keys", "revoke", catalogID)
	code, body = get(replicas[1], s.APIKey)
	assert.Equal(t, http.StatusUnauthorized, code, "the revoking replica refuses the catalog key at once: %s", body)
	assert.Contains(t, body, "API key revoked")
	var legacy int
	require.NoError(t, s.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM applications WHERE api_key_hash = $1`, apikey.Hash(s.APIKey)).Scan(&legacy))
	assert.Zero(t, legacy, "the revoked catalog key's hash is gone from applications.api_key_hash")
}

// buildCtl builds integrationsctl for the test.
func buildCtl(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "integrationsctl")
	build := exec.Command("go", "build", "-o", out, launcher.ModulePrefix+"cmd/integrationsctl")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "build integrationsctl")
	return out
}
