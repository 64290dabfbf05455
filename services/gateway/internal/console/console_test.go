package console

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testAdminToken = "console-admin-token"
	otherApp       = "other"
	otherKey       = "other-api-key-0123456789"
)

type bundle struct {
	schema *dbtest.Schema
	store  *store.Store
	url    string
	box    *secret.Box
	// settlement stands in for the settlement service, which a cancellation calls.
	settlement *fakeSettlement
	// api is the gateway service the console calls, for a test to call it as the API would.
	api *server.Server
	mu  sync.Mutex
	now time.Time
}

func (b *bundle) advance(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now = b.now.Add(d)
}

func setup(t *testing.T) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	s.ApplyCatalog(t, "applications:\n  - id: "+otherApp+"\n    api_key: "+otherKey+"\n")
	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", base64.StdEncoding.EncodeToString(key))
	require.NoError(t, err)
	st := store.New(s.Pool)
	logger := zaptest.NewLogger(t)
	settlement := &fakeSettlement{}
	api := server.New(st, nil, nil, settlement, box, server.Options{MaxPayloadBytes: 1 << 20, Scale: func(d time.Duration) time.Duration { return d }}, logger)
	b := &bundle{schema: s, store: st, box: box, now: time.Now(), settlement: settlement, api: api}
	h, err := Handler(Config{API: api, Store: st, Box: box, AdminToken: testAdminToken, Logger: logger,
		Now: func() time.Time { b.mu.Lock(); defer b.mu.Unlock(); return b.now }})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(Prefix, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

// client is a browser: it keeps cookies and does not follow redirects, so tests see them.
type client struct {
	t    *testing.T
	b    *bundle
	http *http.Client
}

func (b *bundle) client(t *testing.T) *client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &client{t: t, b: b, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type page struct {
	code     int
	body     string
	location string
	header   http.Header
}

func (c *client) get(path string) page {
	c.t.Helper()
	resp, err := c.http.Get(c.b.url + path)
	require.NoError(c.t, err)
	return read(c.t, resp)
}

func (c *client) post(path string, form url.Values) page {
	c.t.Helper()
	resp, err := c.http.PostForm(c.b.url+path, form)
	require.NoError(c.t, err)
	return read(c.t, resp)
}

func read(t *testing.T, resp *http.Response) page {
	t.Helper()
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return page{code: resp.StatusCode, body: string(body), location: resp.Header.Get("Location"), header: resp.Header}
}

// login signs c in with token and returns the CSRF token of its session.
func (c *client) login(token string) string {
	c.t.Helper()
	p := c.post("/console/login", url.Values{"token": {token}})
	require.Equal(c.t, http.StatusSeeOther, p.code, p.body)
	require.Equal(c.t, "/console/executions", p.location)
	return c.csrf()
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (c *client) csrf() string {
	c.t.Helper()
	p := c.get("/console/executions")
	require.Equal(c.t, http.StatusOK, p.code, p.body)
	m := csrfField.FindStringSubmatch(p.body)
	require.NotNil(c.t, m, "the page has the sign-out form with its CSRF token")
	return m[1]
}

func requireLogin(t *testing.T, p page, why string) {
	t.Helper()
	require.Equal(t, http.StatusSeeOther, p.code, why)
	require.True(t, strings.HasPrefix(p.location, "/console/login"), "%s: sent to %q", why, p.location)
}

func TestLoginSetsASealedStrictCookie(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)

	requireLogin(t, c.get("/console/executions"), "no session")
	p := c.post("/console/login", url.Values{"token": {"wrong-key-0123456789"}})
	require.Equal(t, http.StatusUnauthorized, p.code)
	require.Contains(t, p.body, "not a valid API key")
	require.Empty(t, p.header.Values("Set-Cookie"))
	p = c.post("/console/login", url.Values{"token": {""}})
	require.Equal(t, http.StatusBadRequest, p.code)

	p = c.post("/console/login", url.Values{"token": {dbtest.TestAPIKey}, "next": {"https://evil.example/"}})
	require.Equal(t, http.StatusSeeOther, p.code)
	require.Equal(t, "/console/executions", p.location, "never sent to another site after signing in")
	cookies := (&http.Response{Header: p.header}).Cookies()
	require.Len(t, cookies, 1)
	ck := cookies[0]
	require.Equal(t, CookieName, ck.Name)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, Prefix, ck.Path)
	require.False(t, ck.Secure, "plain HTTP listener")
	require.WithinDuration(t, time.Now().Add(DefaultSessionTTL), ck.Expires, time.Minute)
	s, err := open(b.box, ck.Value, time.Now())
	require.NoError(t, err)
	require.Equal(t, dbtest.TestApp, s.Application)
	raw, err := base64.RawURLEncoding.DecodeString(ck.Value)
	require.NoError(t, err)
	opened, err := b.box.Open(raw)
	require.NoError(t, err)
	require.NotContains(t, string(opened), dbtest.TestAPIKey, "the session names the key, it does not hold it")
	require.Equal(t, http.StatusOK, c.get("/console/executions").code)
}

func TestSessionEndsWhenTamperedExpiredOrRevoked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	info, key, err := b.store.CreateKey(ctx, store.NewKey{ApplicationID: dbtest.TestApp, Description: "console test"})
	require.NoError(t, err)

	t.Run("tampered", func(t *testing.T) {
		c := b.client(t)
		c.login(key)
		u, _ := url.Parse(b.url + Prefix)
		ck := c.http.Jar.Cookies(u)[0]
		raw, err := base64.RawURLEncoding.DecodeString(ck.Value)
		require.NoError(t, err)
		raw[len(raw)-1] ^= 1
		c.http.Jar.SetCookies(u, []*http.Cookie{{Name: CookieName, Value: base64.RawURLEncoding.EncodeToString(raw), Path: Prefix}})
		requireLogin(t, c.get("/console/executions"), "a tampered cookie")
	})
	t.Run("forged by another key", func(t *testing.T) {
		other, err := secret.NewBox("K", base64.StdEncoding.EncodeToString(make([]byte, 32)))
		require.NoError(t, err)
		forged, err := seal(other, &session{Role: roleOperator, AdminHash: adminHash(testAdminToken), CSRF: "x", Expires: time.Now().Add(time.Hour)})
		require.NoError(t, err)
		c := b.client(t)
		u, _ := url.Parse(b.url + Prefix)
		c.http.Jar.SetCookies(u, []*http.Cookie{{Name: CookieName, Value: forged, Path: Prefix}})
		requireLogin(t, c.get("/console/dead-letters"), "a cookie sealed with another key")
	})
	t.Run("revoked", func(t *testing.T) {
		c := b.client(t)
		c.login(key)
		_, err := b.store.RevokeKey(ctx, dbtest.TestApp, info.ID, nil)
		require.NoError(t, err)
		requireLogin(t, c.get("/console/executions"), "the key was revoked")
		p := c.post("/console/login", url.Values{"token": {key}})
		require.Equal(t, http.StatusUnauthorized, p.code)
		require.Contains(t, p.body, "revoked")
	})
}

func TestSessionExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)
	c.login(dbtest.TestAPIKey)
	b.advance(DefaultSessionTTL - time.Minute)
	require.Equal(t, http.StatusOK, c.get("/console/executions").code, "still within the session")
	b.advance(2 * time.Minute)
	requireLogin(t, c.get("/console/executions"), "past the session's expiry")
}

func TestLogoutEndsTheSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)
	csrf := c.login(dbtest.TestAPIKey)
	p := c.post("/console/logout", url.Values{"csrf": {csrf}})
	requireLogin(t, p, "signed out")
	requireLogin(t, c.get("/console/executions"), "after signing out")
}

func TestPostsWithoutTheSessionsCSRFTokenAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	execID := b.schema.InsertExecution(t, dbtest.Execution{Status: "succeeded"})
	var eventID string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, delivery_status, attempts, dead_at, relayed_at)
		VALUES (gen_random_uuid(), $1, $2, 'execution.completed', '{"data": {}}', 'dead', 6, now(), now()) RETURNING id::text`,
		dbtest.TestApp, execID).Scan(&eventID))
	c := b.client(t)
	csrf := c.login(dbtest.TestAPIKey)
	status := func() string {
		var s string
		require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT delivery_status FROM integration_events WHERE id = $1`, eventID).Scan(&s))
		return s
	}

	for name, form := range map[string]url.Values{"missing": {}, "wrong": {"csrf": {"not-the-token"}}} {
		p := c.post("/console/events/"+eventID+"/redeliver", form)
		require.Equal(t, http.StatusForbidden, p.code, name)
		require.Contains(t, p.body, "CSRF", name)
		require.Equal(t, "dead", status(), "%s: nothing done", name)
	}
	p := c.post("/console/logout", url.Values{})
	require.Equal(t, http.StatusForbidden, p.code, "even signing out needs the token")

	confirm := c.get("/console/events/" + eventID + "/redeliver")
	require.Equal(t, http.StatusOK, confirm.code)
	require.Contains(t, confirm.body, "becomes pending")
	require.Equal(t, "dead", status(), "the confirmation page does nothing")
	p = c.post("/console/events/"+eventID+"/redeliver", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, p.code, p.body)
	require.Equal(t, "pending", status())
	audit := c.get("/console/audit")
	require.Contains(t, audit.body, "event.redeliver")
	require.Contains(t, audit.body, eventID)
}

func TestAnotherApplicationsExecutionIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mine := b.schema.InsertExecution(t, dbtest.Execution{})
	theirs := b.schema.InsertExecution(t, dbtest.Execution{Application: otherApp})
	c := b.client(t)
	c.login(dbtest.TestAPIKey)

	p := c.get("/console/executions/" + theirs)
	require.Equal(t, http.StatusNotFound, p.code)
	require.NotContains(t, p.body, otherApp, "nothing of the execution is shown")
	require.Equal(t, http.StatusOK, c.get("/console/executions/"+mine).code)
	list := c.get("/console/executions")
	require.Contains(t, list.body, mine)
	require.NotContains(t, list.body, theirs)
	require.Equal(t, http.StatusNotFound, c.get("/console/dead-letters").code, "the operator's pages are not an application's")

	op := b.client(t)
	op.login(testAdminToken)
	list = op.get("/console/executions")
	require.Contains(t, list.body, mine)
	require.Contains(t, list.body, theirs)
	list = op.get("/console/executions?application=" + otherApp)
	require.NotContains(t, list.body, mine)
	require.Contains(t, list.body, theirs)
	require.Equal(t, http.StatusOK, op.get("/console/executions/"+theirs).code)
	events := op.get("/console/events")
	require.Equal(t, http.StatusOK, events.code, "the operator sees every application's events")
}

func TestBadFiltersAreA400NamingTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)
	c.login(dbtest.TestAPIKey)
	for path, field := range map[string]string{
		"/console/executions?status=done":                            "status",
		"/console/executions?created_from=yesterday":                 "created_from",
		"/console/executions?created_to=2026-13-01T00:00":            "created_to",
		"/console/executions?capability=" + url.QueryEscape("a\x00"): "capability",
		"/console/executions?q=" + url.QueryEscape("two words"):      "query",
		"/console/executions?page=nope":                              "page_token",
		"/console/executions?application=" + otherApp:                "application",
		"/console/executions/not-an-id":                              "id",
		"/console/events?status=lost":                                "status",
		"/console/events?since=soon":                                 "since",
		"/console/events?execution_id=x":                             "execution_id",
		"/console/events/redrive?since=later":                        "since",
		"/console/audit?before=-1":                                   "before",
	} {
		p := c.get(path)
		require.Equal(t, http.StatusBadRequest, p.code, path)
		require.Contains(t, p.body, field+":", path)
	}
	op := b.client(t)
	op.login(testAdminToken)
	p := op.get("/console/dead-letters/redrive?route=nowhere")
	require.Equal(t, http.StatusBadRequest, p.code)
	require.Contains(t, p.body, "route:")
}

func TestRedrivePreviewShowsTheCountFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		execID := b.schema.InsertExecution(t, dbtest.Execution{Status: "failed"})
		_, err := b.schema.Pool.Exec(context.Background(), `
			INSERT INTO integration_events (id, application_id, execution_id, type, payload, delivery_status, attempts, dead_at, relayed_at)
			VALUES (gen_random_uuid(), $1, $2, 'execution.completed', '{"data": {}}', 'dead', 6, now(), now())`, dbtest.TestApp, execID)
		require.NoError(t, err)
	}
	c := b.client(t)
	csrf := c.login(dbtest.TestAPIKey)
	dead := func() int {
		var n int
		require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM integration_events WHERE delivery_status = 'dead'`).Scan(&n))
		return n
	}
	p := c.get("/console/events/redrive")
	require.Equal(t, http.StatusOK, p.code)
	require.Contains(t, p.body, "Redrive 3 dead events")
	require.Equal(t, 3, dead(), "the preview changes nothing")
	p = c.post("/console/events/redrive", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, p.code, p.body)
	require.Equal(t, 0, dead())
	require.Contains(t, c.get("/console/audit").body, "events.redrive")
	op := b.client(t)
	op.login(testAdminToken)
	require.Contains(t, op.get("/console/audit").body, "events.redrive", "the operator sees every entry")
	other := b.client(t)
	other.login(otherKey)
	require.NotContains(t, other.get("/console/audit").body, "events.redrive", "an application sees its own")
}
