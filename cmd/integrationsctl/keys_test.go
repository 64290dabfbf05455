package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/apikey"
)

func runRoot(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := root()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestKeysGeneratePrintsANewKey(t *testing.T) {
	out, err := runRoot(t, "keys", "generate")
	require.NoError(t, err)
	_, err = apikey.Parse(strings.TrimSpace(out))
	require.NoError(t, err, out)
}

func TestKeysCommandsNeedTheirFlags(t *testing.T) {
	t.Setenv("INTEGRATIONS_ADMIN_TOKEN", "")
	_, err := runRoot(t, "keys", "list", "--admin-token", "x")
	require.ErrorContains(t, err, "--application is required")
	_, err = runRoot(t, "keys", "list", "--application", "app")
	require.ErrorContains(t, err, "an admin token is required")
}

func TestKeysCommandsShowTheGatewaysRefusal(t *testing.T) {
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"code": 404, "message": "key id: application app has no key AAAAAAAAAAAA"}`))
	}))
	defer srv.Close()
	_, err := runRoot(t, "keys", "revoke", "AAAAAAAAAAAA", "--application", "app", "--admin-url", srv.URL, "--admin-token", "tok")
	require.ErrorContains(t, err, "404 key id: application app has no key AAAAAAAAAAAA")
	require.Equal(t, http.MethodPost, got.Method)
	require.Equal(t, "/api/v1/system/applications/app/keys/AAAAAAAAAAAA:revoke", got.URL.Path)
	require.Equal(t, "Bearer tok", got.Header.Get("Authorization"))
}

func TestKeysCreateWritesANewKeyFileOwnerOnly(t *testing.T) {
	key, err := apikey.Generate()
	require.NoError(t, err)
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id": %q, "prefix": "igk_%s", "key": %q}`, key.ID, key.ID, key.Token)
	}))
	defer srv.Close()
	dir := t.TempDir()
	args := func(file string) []string {
		return []string{"keys", "create", "--application", "app", "--admin-url", srv.URL, "--admin-token", "tok", "--key-file", file}
	}

	existing := filepath.Join(dir, "shared")
	require.NoError(t, os.WriteFile(existing, []byte("keep"), 0o644))
	require.NoError(t, os.Chmod(existing, 0o644))
	_, err = runRoot(t, args(existing)...)
	require.ErrorContains(t, err, "--key-file "+existing+" already exists")
	require.Zero(t, calls, "no key is created when it could not be written")
	b, err := os.ReadFile(existing)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b))

	fresh := filepath.Join(dir, "new")
	_, err = runRoot(t, args(fresh)...)
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	b, err = os.ReadFile(fresh)
	require.NoError(t, err)
	require.Equal(t, key.Token, string(b))
	st, err := os.Stat(fresh)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	// A refused create leaves no empty key file behind.
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"code": 404, "message": "application: no application app"}`))
	}))
	defer refusing.Close()
	none := filepath.Join(dir, "none")
	_, err = runRoot(t, "keys", "create", "--application", "app", "--admin-url", refusing.URL, "--admin-token", "tok", "--key-file", none)
	require.ErrorContains(t, err, "no application app")
	_, err = os.Stat(none)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// A gateway serving TLS with the deployment's own CA is reached with --ca-file; without it the
// system's roots refuse its certificate.
func TestKeysCommandsVerifyATLSGatewayWithTheCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"keys": []}`))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))

	_, err := runRoot(t, "keys", "list", "--application", "app", "--admin-url", srv.URL, "--admin-token", "tok")
	require.ErrorContains(t, err, "certificate", "the system's roots do not know the test server's CA")
	_, err = runRoot(t, "keys", "list", "--application", "app", "--admin-url", srv.URL, "--admin-token", "tok", "--ca-file", ca)
	require.NoError(t, err)
}
