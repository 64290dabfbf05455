package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
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
