package system

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

const testToken = "admin-token-for-tests"

type keysAPI struct {
	t      *testing.T
	schema *dbtest.Schema
	st     *store.Store
	srv    *httptest.Server
}

func newKeysAPI(t *testing.T) *keysAPI {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := store.New(s.Pool)
	mux := http.NewServeMux()
	for p, h := range Handlers(Config{AdminToken: testToken, Keys: st, Logger: zaptest.NewLogger(t)}) {
		mux.Handle(p, h)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &keysAPI{t: t, schema: s, st: st, srv: srv}
}

func (a *keysAPI) do(method, path, body string) (int, map[string]any) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.srv.URL+path, strings.NewReader(body))
	require.NoError(a.t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer resp.Body.Close()
	out := map[string]any{}
	require.NoError(a.t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

func (a *keysAPI) count() int {
	a.t.Helper()
	var n int
	require.NoError(a.t, a.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM api_keys`).Scan(&n))
	return n
}

const keysPath = "/api/v1/system/applications/app/keys"

func TestKeyEndpoints(t *testing.T) {
	t.Parallel()
	a := newKeysAPI(t)

	code, created := a.do(http.MethodPost, keysPath, `{"description": "deploy bot", "created_by": "alice", "expires_in": "720h"}`)
	require.Equal(t, http.StatusCreated, code, "%v", created)
	tok, _ := created["key"].(string)
	k, err := apikey.Parse(tok)
	require.NoError(t, err, "the answer holds the key, once")
	require.Equal(t, k.ID, created["id"])
	require.Equal(t, apikey.Prefix+k.ID, created["prefix"])
	require.Equal(t, "deploy bot", created["description"])
	require.Equal(t, "alice", created["created_by"])
	require.Equal(t, "active", created["status"])
	exp, err := time.Parse(time.RFC3339Nano, created["expires_at"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(720*time.Hour), exp, time.Minute)

	code, second := a.do(http.MethodPost, keysPath, ``)
	require.Equal(t, http.StatusCreated, code, "an empty body is a key without expiry: %v", second)
	require.Nil(t, second["expires_at"])

	code, list := a.do(http.MethodGet, keysPath, "")
	require.Equal(t, http.StatusOK, code)
	keys := list["keys"].([]any)
	require.Len(t, keys, 3, "the catalog key and the two created")
	raw, err := json.Marshal(list)
	require.NoError(t, err)
	require.NotContains(t, string(raw), tok, "a listing never shows a secret")
	require.NotContains(t, string(raw), second["key"].(string))
	require.NotContains(t, string(raw), "hash")
	for _, item := range keys {
		m := item.(map[string]any)
		require.Contains(t, m, "last_used_at")
		require.NotContains(t, m, "key")
	}

	code, revoked := a.do(http.MethodPost, keysPath+"/"+k.ID+":revoke", "")
	require.Equal(t, http.StatusOK, code, "%v", revoked)
	require.Equal(t, "revoked", revoked["status"])
	require.NotNil(t, revoked["revoked_at"])
	code, revoked = a.do(http.MethodDelete, keysPath+"/"+second["id"].(string), "")
	require.Equal(t, http.StatusOK, code, "%v", revoked)
	require.Equal(t, "revoked", revoked["status"])
	rec, err := a.st.KeyForGenerated(context.Background(), k.ID, apikey.Hash(tok))
	require.NoError(t, err)
	require.True(t, rec.Revoked)

	code, at := a.do(http.MethodPost, keysPath, `{"expires_at": "`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`)
	require.Equal(t, http.StatusCreated, code, "%v", at)
}

func TestKeyEndpointsRefuseBadInputNamingTheField(t *testing.T) {
	t.Parallel()
	a := newKeysAPI(t)
	before := a.count()
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	cases := []struct {
		method, path, body string
		code               int
		field              string
	}{
		{http.MethodPost, "/api/v1/system/applications/nope/keys", ``, http.StatusNotFound, "application:"},
		{http.MethodGet, "/api/v1/system/applications/nope/keys", ``, http.StatusNotFound, "application:"},
		{http.MethodPost, "/api/v1/system/applications/Bad%20App/keys", ``, http.StatusBadRequest, "application:"},
		{http.MethodPost, "/api/v1/system/applications/%ff/keys", ``, http.StatusBadRequest, "application:"},
		{http.MethodPost, keysPath, `{"expires_in": "soon"}`, http.StatusBadRequest, "expires_in:"},
		{http.MethodPost, keysPath, `{"expires_in": "-1h"}`, http.StatusBadRequest, "expires_in:"},
		{http.MethodPost, keysPath, `{"expires_in": "1000000h"}`, http.StatusBadRequest, "expires_in:"},
		{http.MethodPost, keysPath, `{"expires_at": "tomorrow"}`, http.StatusBadRequest, "expires_at:"},
		{http.MethodPost, keysPath, `{"expires_at": "` + past + `"}`, http.StatusBadRequest, "expires_at: must be in the future"},
		{http.MethodPost, keysPath, `{"expires_at": "9999-01-01T00:00:00Z"}`, http.StatusBadRequest, "expires_at:"},
		{http.MethodPost, keysPath, `{"expires_in": "1h", "expires_at": "2099-01-01T00:00:00Z"}`, http.StatusBadRequest, "expires_in, expires_at:"},
		{http.MethodPost, keysPath, `{"description": "a\u0000b"}`, http.StatusBadRequest, "description:"},
		{http.MethodPost, keysPath, `{"description": "` + strings.Repeat("x", 300) + `"}`, http.StatusBadRequest, "description:"},
		{http.MethodPost, keysPath, `{"created_by": "\n"}`, http.StatusBadRequest, "created_by:"},
		{http.MethodPost, keysPath, `{"secret": "mine"}`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `[`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `{"description": "ci"} {"description": "more"}`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `{"description": "ci"}x`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `{"description": "ci"}}`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `null`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `"ci"`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `{"` + strings.Repeat("f", 10000) + `": 1}`, http.StatusBadRequest, "body:"},
		{http.MethodPost, keysPath, `{"description": "` + strings.Repeat("x", 70<<10) + `"}`, http.StatusRequestEntityTooLarge, "body:"},
		{http.MethodPost, keysPath, `{"description": "ci` + "\u202e" + `gnp.exe"}`, http.StatusBadRequest, "description:"},
		{http.MethodPost, keysPath, `{"description": "zero` + "\u200b" + `width"}`, http.StatusBadRequest, "description:"},
		{http.MethodPost, keysPath, `{"created_by": "ops` + "\u0085" + `"}`, http.StatusBadRequest, "created_by:"},
		{http.MethodPost, keysPath, `{"created_by": "ops` + "\u2028" + `"}`, http.StatusBadRequest, "created_by:"},
		{http.MethodPut, keysPath, ``, http.StatusMethodNotAllowed, "use GET"},
		{http.MethodPost, keysPath + "/not-an-id:revoke", ``, http.StatusBadRequest, "key id:"},
		{http.MethodPost, keysPath + "/AAAAAAAAAAAA:revoke", ``, http.StatusNotFound, "key id:"},
		{http.MethodGet, keysPath + "/AAAAAAAAAAAA:revoke", ``, http.StatusMethodNotAllowed, "use POST"},
		{http.MethodPost, keysPath + "/AAAAAAAAAAAA", ``, http.StatusMethodNotAllowed, "use DELETE"},
		{http.MethodGet, "/api/v1/system/applications/app/other", ``, http.StatusNotFound, "no such endpoint"},
	}
	for _, c := range cases {
		code, body := a.do(c.method, c.path, c.body)
		require.Equal(t, c.code, code, "%s %s %s: %v", c.method, c.path, c.body, body)
		require.Contains(t, body["message"], c.field, "%s %s %s", c.method, c.path, c.body)
		require.Less(t, len(body["message"].(string)), 400, "the message does not echo the input unbounded")
	}
	require.Equal(t, before, a.count(), "nothing written")
}

func TestKeyEndpointsNeedTheAdminToken(t *testing.T) {
	t.Parallel()
	a := newKeysAPI(t)
	before := a.count()
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + dbtest.TestAPIKey} {
		req, err := http.NewRequest(http.MethodPost, a.srv.URL+keysPath, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "an application's own key does not manage keys")
	}
	require.Equal(t, before, a.count())
}
