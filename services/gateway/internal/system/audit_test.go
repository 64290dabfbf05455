package system

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

type auditRow struct {
	Role, Actor, Via, Action, Target string
	Detail                           map[string]any
	raw                              string
}

// auditLog is every audit entry, oldest first.
func (a *keysAPI) auditLog() []auditRow {
	a.t.Helper()
	list, err := a.st.AuditList(context.Background(), audit.Operator, 0, 100)
	require.NoError(a.t, err)
	out := make([]auditRow, 0, len(list))
	for i := len(list) - 1; i >= 0; i-- {
		e := list[i]
		r := auditRow{Role: e.Role, Actor: e.Actor, Via: e.Via, Action: e.Action, Target: e.Target, raw: string(e.Detail)}
		require.NoError(a.t, json.Unmarshal(e.Detail, &r.Detail))
		out = append(out, r)
	}
	return out
}

// refused asserts that the call is answered want and writes no audit entry.
func (a *keysAPI) refused(want int, method, path, body, token string) {
	a.t.Helper()
	before := len(a.auditLog())
	req, err := http.NewRequest(method, a.srv.URL+path, strings.NewReader(body))
	require.NoError(a.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	_ = resp.Body.Close()
	require.Equal(a.t, want, resp.StatusCode, "%s %s", method, path)
	require.Len(a.t, a.auditLog(), before, "a refused call writes no audit entry: %s %s %s", method, path, body)
}

func requireOperatorEntry(t *testing.T, got auditRow, via, action, target string, detail map[string]any) {
	t.Helper()
	require.Equal(t, store.AuditRoleOperator, got.Role)
	require.Equal(t, store.AuditOperator, got.Actor)
	require.Equal(t, via, got.Via)
	require.Equal(t, action, got.Action)
	require.Equal(t, target, got.Target)
	for k, v := range detail {
		require.Equal(t, v, got.Detail[k], "detail %s", k)
	}
}

// Creating and revoking a key are audited in their transaction, with the key's id and never the
// key; every refusal writes nothing.
func TestKeyActionsAreAudited(t *testing.T) {
	t.Parallel()
	a := newKeysAPI(t)

	a.refused(http.StatusUnauthorized, http.MethodPost, keysPath, `{}`, "")
	a.refused(http.StatusUnauthorized, http.MethodPost, keysPath, `{}`, "wrong-token")
	a.refused(http.StatusBadRequest, http.MethodPost, keysPath, `{"expires_in": "forever"}`, testToken)
	a.refused(http.StatusBadRequest, http.MethodPost, keysPath, `{"expires_at": "2001-01-01T00:00:00Z"}`, testToken)
	a.refused(http.StatusNotFound, http.MethodPost, "/api/v1/system/applications/nope/keys", `{}`, testToken)
	a.refused(http.StatusOK, http.MethodGet, keysPath, ``, testToken) // a listing changes nothing

	code, created := a.do(http.MethodPost, keysPath, `{"description": "deploy bot", "created_by": "alice"}`)
	require.Equal(t, http.StatusCreated, code, "%v", created)
	id, token := created["id"].(string), created["key"].(string)
	require.NotEmpty(t, token)

	a.refused(http.StatusBadRequest, http.MethodPost, keysPath+"/bad:revoke", ``, testToken)
	a.refused(http.StatusNotFound, http.MethodPost, keysPath+"/AAAAAAAAAAAA:revoke", ``, testToken)
	a.refused(http.StatusUnauthorized, http.MethodDelete, keysPath+"/"+id, ``, "")

	code, _ = a.do(http.MethodPost, keysPath+"/"+id+":revoke", ``)
	require.Equal(t, http.StatusOK, code)
	code, _ = a.do(http.MethodDelete, keysPath+"/"+id, ``)
	require.Equal(t, http.StatusOK, code)

	log := a.auditLog()
	require.Len(t, log, 3)
	requireOperatorEntry(t, log[0], store.AuditViaAPI, "api_key.create", "app", map[string]any{"key_id": id, "created_by": "alice"})
	requireOperatorEntry(t, log[1], store.AuditViaAPI, "api_key.revoke", "app", map[string]any{"key_id": id, "already_revoked": false})
	requireOperatorEntry(t, log[2], store.AuditViaAPI, "api_key.revoke", "app", map[string]any{"key_id": id, "already_revoked": true})
	for _, r := range log {
		require.NotContains(t, r.raw, token, "never the key")
		require.NotContains(t, r.raw, testToken, "never the admin token")
	}
}

func testAMQPURL() string {
	if u := os.Getenv("INTEGRATIONS_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// A dead-letter redrive and a diagnostic are audited after the broker answered, through the
// endpoint (via api) as through the console's call (via console); a redrive refused — a bad
// route, no such queue, no token — writes nothing.
func TestBrokerActionsAreAudited(t *testing.T) {
	t.Parallel()
	a := newKeysAPI(t)
	broker := mq.Config{URL: testAMQPURL(), Scope: "systest-" + uuid.NewString()[:8], TimeScale: 1, Logger: zaptest.NewLogger(t)}
	cfg := Config{AdminToken: testToken, Keys: a.st, Broker: broker, Timeout: 2 * time.Second, Logger: zaptest.NewLogger(t)}
	mux := http.NewServeMux()
	for p, h := range Handlers(cfg) {
		mux.Handle(p, h)
	}
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)

	a.refused(http.StatusUnauthorized, http.MethodPost, RedrivePath, `{"route": "executions"}`, "")
	a.refused(http.StatusBadRequest, http.MethodPost, RedrivePath, `{"route": "nope"}`, testToken)
	a.refused(http.StatusServiceUnavailable, http.MethodPost, RedrivePath, `{"route": "executions"}`, testToken) // not declared in this scope

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := mq.Dial(ctx, broker)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Declare(ctx, routes.Executions))
	declared := time.Now()
	// The scope's queues go with the test: each run left thirteen quorum queues behind, and a
	// broker holding hundreds of them ran out of file descriptors (1024 by default), so that new
	// connections timed out in their handshake — every test dialling it failed on a loaded
	// machine that had run this suite a few dozen times. Not right after declaring them (see
	// pkg/mq deadLetterVia): a second after.
	t.Cleanup(func() {
		time.Sleep(time.Until(declared.Add(time.Second)))
		assert.NoError(t, b.DeleteRoutes(context.Background(), routes.Executions))
	})

	code, out := a.do(http.MethodPost, RedrivePath, `{"route": "executions", "ids": ["a", "b"]}`)
	require.Equal(t, http.StatusOK, code, "%v", out)
	_, err = RedriveDeadLetters(audit.ViaConsole(ctx), cfg, routes.Executions.Name, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(func() *http.Request {
		req, err := http.NewRequest(http.MethodPost, a.srv.URL+DiagnosticPath, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testToken)
		return req
	}())
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, resp.StatusCode)

	log := a.auditLog()
	require.Len(t, log, 3)
	requireOperatorEntry(t, log[0], store.AuditViaAPI, "dead_letters.redrive", "executions", map[string]any{"count": float64(0), "requested": float64(2)})
	requireOperatorEntry(t, log[1], store.AuditViaConsole, "dead_letters.redrive", "executions", map[string]any{"count": float64(0)})
	requireOperatorEntry(t, log[2], store.AuditViaAPI, "diagnostic.run", "", nil)
	require.Contains(t, log[2].Detail, "ok")
}
