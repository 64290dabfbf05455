package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
)

// fakeSettlement answers the gateway's Settle (a cancellation) as the settlement service would,
// and records what it was asked.
type fakeSettlement struct {
	settlementv1.SettlementServiceClient
	mu      sync.Mutex
	settles []*settlementv1.SettleRequest
}

func (f *fakeSettlement) Settle(_ context.Context, in *settlementv1.SettleRequest, _ ...grpc.CallOption) (*settlementv1.SettleResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settles = append(f.settles, in)
	return &settlementv1.SettleResponse{Execution: &executionv1.Execution{Id: in.GetExecutionId(), Status: in.GetStatus(), Attempt: in.GetAttempt()}}, nil
}

func (f *fakeSettlement) requests() []*settlementv1.SettleRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*settlementv1.SettleRequest(nil), f.settles...)
}

// deadEvent inserts a dead completion event of a new execution of app.
func (b *bundle) deadEvent(t *testing.T, app string) string {
	t.Helper()
	execID := b.schema.InsertExecution(t, dbtest.Execution{Application: app, Status: "failed"})
	var id string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, delivery_status, attempts, dead_at, relayed_at)
		VALUES (gen_random_uuid(), $1, $2, 'execution.completed', '{"data": {}}', 'dead', 6, now(), now()) RETURNING id::text`,
		app, execID).Scan(&id))
	return id
}

func (b *bundle) eventStatus(t *testing.T, id string) string {
	t.Helper()
	var s string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT delivery_status FROM integration_events WHERE id = $1`, id).Scan(&s))
	return s
}

// The operator sees every application's events (filtered to one on request), opens and
// redelivers another application's, and redrives one application's dead events after a
// preview of how many; every action is in the audit log with the application it touched.
func TestOperatorEventsAcrossApplications(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mine := b.deadEvent(t, dbtest.TestApp)
	theirs := b.deadEvent(t, otherApp)
	theirs2 := b.deadEvent(t, otherApp)
	op := b.client(t)
	csrf := op.login(testAdminToken)

	list := op.get("/console/events")
	require.Equal(t, http.StatusOK, list.code)
	for _, id := range []string{mine, theirs, theirs2} {
		require.Contains(t, list.body, id)
	}
	require.Contains(t, list.body, `<td class="app">`+otherApp+`</td>`, "an Application column")
	one := op.get("/console/events?application=" + otherApp)
	require.NotContains(t, one.body, mine)
	require.Contains(t, one.body, theirs)
	p := op.get("/console/events?application=" + url.QueryEscape("Not An App"))
	require.Equal(t, http.StatusBadRequest, p.code)
	require.Contains(t, p.body, "application_id:")

	ev := op.get("/console/events/" + theirs)
	require.Equal(t, http.StatusOK, ev.code)
	require.Contains(t, ev.body, otherApp)
	require.Equal(t, http.StatusOK, op.get("/console/events/"+theirs+"/redeliver").code)
	p = op.post("/console/events/"+theirs+"/redeliver", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, p.code, p.body)
	require.Equal(t, "pending", b.eventStatus(t, theirs))

	preview := op.get("/console/events/redrive?application=" + otherApp)
	require.Equal(t, http.StatusOK, preview.code)
	require.Contains(t, preview.body, "Redrive 1 dead events of application "+otherApp)
	require.Contains(t, preview.body, `name="application" value="`+otherApp+`"`, "the POST redrives what was previewed")
	require.Contains(t, op.get("/console/events/redrive").body, "Redrive 2 dead events of every application")
	require.Equal(t, "dead", b.eventStatus(t, theirs2), "previews change nothing")
	p = op.post("/console/events/redrive", url.Values{"csrf": {csrf}, "application": {otherApp}})
	require.Equal(t, http.StatusSeeOther, p.code, p.body)
	require.Equal(t, "pending", b.eventStatus(t, theirs2))
	require.Equal(t, "dead", b.eventStatus(t, mine), "another application's dead event is left")

	audit := op.get("/console/audit").body
	require.Contains(t, audit, "event.redeliver")
	require.Contains(t, audit, "dead events of application "+otherApp)

	// An application's pages are unchanged: its own events, no application filter.
	app := b.client(t)
	app.login(dbtest.TestAPIKey)
	own := app.get("/console/events")
	require.Contains(t, own.body, mine)
	require.NotContains(t, own.body, theirs)
	require.NotContains(t, own.body, `id="application"`)
	require.Equal(t, http.StatusNotFound, app.get("/console/events/"+theirs).code)
	require.Equal(t, http.StatusBadRequest, app.get("/console/events?application="+otherApp).code)
	require.Equal(t, http.StatusBadRequest, app.get("/console/events/redrive?application="+otherApp).code)
	require.NotContains(t, app.get("/console/audit").body, "event.redeliver", "the operator's actions are not the application's")
}

// Cancel from the execution's page: a confirm page that changes nothing, then the POST, through
// the gateway's CancelExecution; audited. Another application's execution is a 404 on both; a
// settled one offers nothing to do.
func TestCancelFromTheExecutionsPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	running := b.schema.InsertExecution(t, dbtest.Execution{Status: "pending"})
	settled := b.schema.InsertExecution(t, dbtest.Execution{Status: "succeeded"})
	theirs := b.schema.InsertExecution(t, dbtest.Execution{Application: otherApp, Status: "pending"})
	c := b.client(t)
	csrf := c.login(dbtest.TestAPIKey)

	page := c.get("/console/executions/" + running)
	require.Contains(t, page.body, `href="/console/executions/`+running+`/cancel"`)
	require.NotContains(t, c.get("/console/executions/"+settled).body, "/cancel\"", "no cancel link on a settled execution")
	confirm := c.get("/console/executions/" + running + "/cancel")
	require.Equal(t, http.StatusOK, confirm.code)
	require.Contains(t, confirm.body, "settled cancelled")
	require.Contains(t, confirm.body, `id="confirm"`)
	require.Empty(t, b.settlement.requests(), "the confirmation page does nothing")
	require.NotContains(t, c.get("/console/executions/"+settled+"/cancel").body, `id="confirm"`, "nothing to do")

	require.Equal(t, http.StatusNotFound, c.get("/console/executions/"+theirs+"/cancel").code)
	p := c.post("/console/executions/"+theirs+"/cancel", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusNotFound, p.code)
	p = c.post("/console/executions/"+running+"/cancel", url.Values{})
	require.Equal(t, http.StatusForbidden, p.code, "no CSRF token")
	require.Empty(t, b.settlement.requests())

	p = c.post("/console/executions/"+running+"/cancel", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, p.code, p.body)
	require.Equal(t, "/console/executions/"+running, p.location)
	settles := b.settlement.requests()
	require.Len(t, settles, 1)
	require.Equal(t, running, settles[0].GetExecutionId())
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED, settles[0].GetStatus())
	audit := c.get("/console/audit").body
	require.Contains(t, audit, "execution.cancel")
	require.Contains(t, audit, running)
	p = c.post("/console/executions/"+settled+"/cancel", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusBadRequest, p.code, "already settled: a 4xx naming why")
	require.True(t, strings.Contains(p.body, "already settled"), p.body)

	op := b.client(t)
	opCSRF := op.login(testAdminToken)
	p = op.post("/console/executions/"+theirs+"/cancel", url.Values{"csrf": {opCSRF}})
	require.Equal(t, http.StatusSeeOther, p.code, "the operator cancels any application's: %s", p.body)
	require.Equal(t, "cancelled by the operator", b.settlement.requests()[1].GetFailure().GetMessage())
}
