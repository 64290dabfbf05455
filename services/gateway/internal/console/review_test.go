package console

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// postWith posts form to path with extra headers (what a browser adds).
func (c *client) postWith(path string, form url.Values, headers map[string]string) page {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.b.url+path, strings.NewReader(form.Encode()))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	return read(c.t, resp)
}

// cookie is the session cookie c holds.
func (c *client) cookie() *http.Cookie {
	c.t.Helper()
	u, _ := url.Parse(c.b.url + Prefix)
	for _, ck := range c.http.Jar.Cookies(u) {
		if ck.Name == CookieName {
			return ck
		}
	}
	c.t.Fatal("no session cookie")
	return nil
}

// A copy of the session cookie (a shared machine, a proxy log) stops working when its session
// is signed out of, not only at its expiry hours later.
func TestSignedOutSessionIsRefusedEvenWithACopiedCookie(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, token := range []string{dbtest.TestAPIKey, testAdminToken} {
		c := b.client(t)
		csrf := c.login(token)
		copied := c.cookie().Value
		requireLogin(t, c.post("/console/logout", url.Values{"csrf": {csrf}}), "signed out")

		thief := b.client(t)
		u, _ := url.Parse(b.url + Prefix)
		thief.http.Jar.SetCookies(u, []*http.Cookie{{Name: CookieName, Value: copied, Path: Prefix}})
		requireLogin(t, thief.get("/console/executions"), "the copied cookie of a session signed out of")

		other := b.client(t)
		other.login(token)
		require.Equal(t, http.StatusOK, other.get("/console/executions").code, "another session of the same key goes on")
	}
}

// A form posted from another site is refused before anything is done — the sign-in included,
// which has no session to hold a CSRF token (a forged sign-in puts the victim in the attacker's
// application, where what they type next is the attacker's to read).
func TestFormsFromAnotherSiteAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, headers := range map[string]map[string]string{
		"Sec-Fetch-Site cross-site": {"Sec-Fetch-Site": "cross-site"},
		"Sec-Fetch-Site same-site":  {"Sec-Fetch-Site": "same-site"},
		"Origin of another site":    {"Origin": "https://evil.example"},
		"Origin null":               {"Origin": "null"},
	} {
		c := b.client(t)
		p := c.postWith("/console/login", url.Values{"token": {dbtest.TestAPIKey}}, headers)
		require.Equal(t, http.StatusForbidden, p.code, name)
		require.Empty(t, p.header.Values("Set-Cookie"), "%s: no session", name)
		require.Contains(t, p.body, "another site", name)
	}
	c := b.client(t)
	p := c.postWith("/console/login", url.Values{"token": {dbtest.TestAPIKey}}, map[string]string{"Sec-Fetch-Site": "same-origin"})
	require.Equal(t, http.StatusSeeOther, p.code, "the console's own form")
	p = c.postWith("/console/logout", url.Values{}, map[string]string{"Origin": b.url})
	require.Equal(t, http.StatusForbidden, p.code, "the same origin still needs the CSRF token")
	require.Contains(t, p.body, "CSRF")

	// With the session's own CSRF token (leaked, say), a cross-site post still does nothing.
	execID := b.schema.InsertExecution(t, dbtest.Execution{Status: "succeeded"})
	var eventID string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, delivery_status, attempts, dead_at, relayed_at)
		VALUES (gen_random_uuid(), $1, $2, 'execution.completed', '{"data": {}}', 'dead', 6, now(), now()) RETURNING id::text`,
		dbtest.TestApp, execID).Scan(&eventID))
	p = c.postWith("/console/events/"+eventID+"/redeliver", url.Values{"csrf": {c.csrf()}}, map[string]string{"Sec-Fetch-Site": "cross-site"})
	require.Equal(t, http.StatusForbidden, p.code)
	var status string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT delivery_status FROM integration_events WHERE id = $1`, eventID).Scan(&status))
	require.Equal(t, "dead", status, "nothing done")
}

var auditRow = regexp.MustCompile(`<tr class="audit-entry">`)

// An application may be called "operator": its audit page is still its own, and the operator's
// entries are not shown as its (nor its as the operator's).
func TestAnApplicationNamedOperatorSeesOnlyItsOwnAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "operator-app-key-0123456789"
	b.schema.ApplyCatalog(t, "applications:\n  - id: "+store.AuditOperator+"\n    api_key: "+key+"\n")
	op := b.client(t)
	op.login(testAdminToken) // the operator's "login" entry
	app := b.client(t)
	app.login(key) // the application's

	page := app.get("/console/audit")
	require.Equal(t, http.StatusOK, page.code)
	require.Len(t, auditRow.FindAllString(page.body, -1), 1, "only its own sign-in: %s", page.body)
	require.Contains(t, page.body, "application operator")
	all := op.get("/console/audit").body
	require.Len(t, auditRow.FindAllString(all, -1), 2)
	require.Contains(t, all, "application operator")
	require.Regexp(t, `<td>operator</td>`, all, "the admin token's entry")
}

// A well-formed key that is unknown, revoked or expired gets one answer at sign-in: which of
// them would tell the holder of an old key that it once was one.
func TestSignInRefusalsDoNotTellARevokedKeyFromAnUnknownOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	info, key, err := b.store.CreateKey(context.Background(), store.NewKey{ApplicationID: dbtest.TestApp, Description: "to revoke"})
	require.NoError(t, err)
	_, err = b.store.RevokeKey(context.Background(), dbtest.TestApp, info.ID, nil)
	require.NoError(t, err)
	_, unknown, err := b.store.CreateKey(context.Background(), store.NewKey{ApplicationID: dbtest.TestApp, Description: "unknown"})
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(context.Background(), `DELETE FROM api_keys WHERE description = 'unknown'`)
	require.NoError(t, err)
	message := regexp.MustCompile(`id="login-error">([^<]*)<`)
	var said []string
	for _, token := range []string{key, unknown, "chosen-but-unknown-0123456789"} {
		p := b.client(t).post("/console/login", url.Values{"token": {token}})
		require.Equal(t, http.StatusUnauthorized, p.code)
		m := message.FindStringSubmatch(p.body)
		require.NotNil(t, m, p.body)
		said = append(said, m[1])
	}
	require.Equal(t, said[0], said[1], "revoked and unknown generated keys")
	require.Equal(t, said[0], said[2], "and an unknown chosen one")
}

// Behind a proxy that ends TLS, the listener is plain HTTP: the cookie is still Secure when the
// proxy says the browser's connection was HTTPS.
func TestCookieIsSecureBehindATLSProxy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.client(t).postWith("/console/login", url.Values{"token": {dbtest.TestAPIKey}}, map[string]string{"X-Forwarded-Proto": "https"})
	require.Equal(t, http.StatusSeeOther, p.code)
	cookies := (&http.Response{Header: p.header}).Cookies()
	require.Len(t, cookies, 1)
	require.True(t, cookies[0].Secure)
}

// What an application or an adapter wrote — an idempotency key, an error message, a progress
// report — is text on the page, never markup.
func TestWhatAnApplicationWroteIsEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const script = `<script>alert(1)</script>`
	id := b.schema.InsertExecution(t, dbtest.Execution{Status: "failed", Attempt: 1})
	b.schema.InsertAttempts(t, id, dbtest.Attempt{N: 1, Outcome: "failed", FailureClass: "permanent"})
	_, err := b.schema.Pool.Exec(context.Background(), `UPDATE executions SET idempotency_key = $2,
		failure_class = 'permanent', failure_message = $3, progress = jsonb_build_object('note', $3::text) WHERE id = $1`,
		id, `"><img/src=x/onerror=alert(1)>`, script)
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(context.Background(), `UPDATE execution_attempts SET failure_message = $2 WHERE execution_id = $1`, id, script)
	require.NoError(t, err)
	c := b.client(t)
	c.login(dbtest.TestAPIKey)
	for _, path := range []string{"/console/executions", "/console/executions/" + id, "/console/executions?q=" + url.QueryEscape(`"><img/src=x/onerror=alert(1)>`)} {
		p := c.get(path)
		require.Equal(t, http.StatusOK, p.code, path)
		require.NotContains(t, p.body, "<script>alert", path)
		require.NotContains(t, p.body, "<img", path)
	}
	require.Contains(t, c.get("/console/executions/"+id).body, "&lt;script&gt;alert(1)&lt;/script&gt;")
}

// Every answer of the console — a page, an error page, a redirect, the stylesheet — is never
// cached, never framed (a confirmation page cannot be clicked through from another site's
// frame) and runs no script.
func TestEveryAnswerCarriesTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)
	pages := map[string]page{"login": c.get("/console/login"), "redirect to login": c.get("/console/executions"),
		"stylesheet": c.get("/console/static/console.css")}
	c.login(dbtest.TestAPIKey)
	pages["executions"] = c.get("/console/executions")
	pages["404"] = c.get("/console/nowhere")
	pages["400"] = c.get("/console/executions?status=done")
	for name, p := range pages {
		require.Equal(t, "no-store", p.header.Get("Cache-Control"), name)
		require.Equal(t, "DENY", p.header.Get("X-Frame-Options"), name)
		require.Equal(t, "nosniff", p.header.Get("X-Content-Type-Options"), name)
		require.Equal(t, "same-origin", p.header.Get("Referrer-Policy"), name)
		csp := p.header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "frame-ancestors 'none'", "form-action 'self'", "base-uri 'none'"} {
			require.Contains(t, csp, want, name)
		}
		require.NotContains(t, csp, "script-src", name)
		require.NotContains(t, csp, "unsafe-inline", name)
	}
}
