package console

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
)

// auditActions counts the audit log's entries by action and surface ("event.redeliver/console").
func (b *bundle) auditActions(t *testing.T) map[string]int {
	t.Helper()
	list, err := b.store.AuditList(context.Background(), audit.Operator, 0, 100)
	require.NoError(t, err)
	out := map[string]int{}
	for _, e := range list {
		out[e.Action+"/"+e.Via]++
	}
	return out
}

// An action through the console is audited once — by the gateway method that carries it out, as
// taken via the console — not a second time by the console; the audit page shows the API's
// actions beside the console's, each with its surface.
func TestConsoleActionsAreAuditedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pending := b.schema.InsertExecution(t, dbtest.Execution{Status: "pending"})
	viaConsole := b.deadEvent(t, dbtest.TestApp)
	viaAPI := b.deadEvent(t, otherApp)
	app := b.client(t)
	csrf := app.login(dbtest.TestAPIKey)

	require.Equal(t, http.StatusSeeOther, app.post("/console/events/"+viaConsole+"/redeliver", url.Values{"csrf": {csrf}}).code)
	require.Equal(t, http.StatusSeeOther, app.post("/console/executions/"+pending+"/cancel", url.Values{"csrf": {csrf}}).code)
	require.Equal(t, http.StatusSeeOther, app.post("/console/events/redrive", url.Values{"csrf": {csrf}}).code)
	require.Equal(t, map[string]int{"login/console": 1, "event.redeliver/console": 1, "execution.cancel/console": 1,
		"events.redrive/console": 1}, b.auditActions(t))

	_, err := b.api.RedeliverEvent(server.AsOperator(context.Background()), &gatewayv1.RedeliverEventRequest{Id: viaAPI})
	require.NoError(t, err)
	require.Equal(t, 1, b.auditActions(t)["event.redeliver/api"])

	op := b.client(t)
	op.login(testAdminToken)
	page := op.get("/console/audit").body
	row := regexp.MustCompile(`<tr class="audit-entry"><td>[^<]*</td><td>operator</td><td>api</td><th scope="row">event.redeliver</th><td class="mono">` + viaAPI)
	require.Regexp(t, row, page, "the API's action, with its surface")
	row = regexp.MustCompile(`<td>application ` + dbtest.TestApp + `</td><td>console</td><th scope="row">execution.cancel</th><td class="mono">` + pending)
	require.Regexp(t, row, page, "the console's action, with its surface")
	require.NotContains(t, app.get("/console/audit").body, viaAPI, "the operator's API action is not the application's")
}
