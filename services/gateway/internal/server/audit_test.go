package server

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// auditLog is every audit entry, oldest first, with its detail decoded.
func auditLog(t *testing.T, b *bundle) []auditRow {
	t.Helper()
	list, err := b.server.store.AuditList(context.Background(), audit.Operator, 0, 100)
	require.NoError(t, err)
	out := make([]auditRow, 0, len(list))
	for i := len(list) - 1; i >= 0; i-- {
		e := list[i]
		r := auditRow{Role: e.Role, Actor: e.Actor, Via: e.Via, Action: e.Action, Target: e.Target}
		require.NoError(t, json.Unmarshal(e.Detail, &r.Detail))
		out = append(out, r)
	}
	return out
}

type auditRow struct {
	Role, Actor, Via, Action, Target string
	Detail                           map[string]any
}

// refused asserts that call is refused with want and writes no audit entry.
func refused(t *testing.T, b *bundle, want codes.Code, call func() error, msg string) {
	t.Helper()
	before := len(auditLog(t, b))
	c, _ := code(call())
	require.Equal(t, want, c, msg)
	require.Len(t, auditLog(t, b), before, "a refused call writes no audit entry: %s", msg)
}

var (
	operatorRow = func(via string) auditRow {
		return auditRow{Role: store.AuditRoleOperator, Actor: store.AuditOperator, Via: via}
	}
	appRow = func(app, via string) auditRow {
		return auditRow{Role: store.AuditRoleApplication, Actor: app, Via: via}
	}
)

func requireEntry(t *testing.T, got auditRow, who auditRow, action, target string, detail map[string]any) {
	t.Helper()
	require.Equal(t, who.Role, got.Role)
	require.Equal(t, who.Actor, got.Actor)
	require.Equal(t, who.Via, got.Via)
	require.Equal(t, action, got.Action)
	require.Equal(t, target, got.Target)
	for k, v := range detail {
		require.EqualValues(t, v, got.Detail[k], "detail %s", k)
	}
}

// A redelivery is audited in its transaction whoever asks — the operator over the API, an
// application over the API, either through the console — and a refusal writes nothing.
func TestRedeliverEventIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	mine, myExec := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6})
	theirs, theirExec := insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDead, attempts: 6})
	op := AsOperator(context.Background())
	redeliver := func(ctx context.Context, id string) func() error {
		return func() error {
			_, err := b.server.RedeliverEvent(ctx, &gatewayv1.RedeliverEventRequest{Id: id})
			return err
		}
	}

	refused(t, b, codes.InvalidArgument, redeliver(op, "not-an-id"), "bad id")
	refused(t, b, codes.NotFound, redeliver(b.ctx, theirs), "another application's event")
	refused(t, b, codes.NotFound, redeliver(op, "0190a0d6-0000-7000-8000-000000000000"), "no such event")
	refused(t, b, codes.Unauthenticated, redeliver(context.Background(), mine), "no caller")

	require.NoError(t, redeliver(op, theirs)())
	require.NoError(t, redeliver(b.ctx, mine)())
	require.NoError(t, redeliver(audit.ViaConsole(op), mine)())
	log := auditLog(t, b)
	require.Len(t, log, 3)
	requireEntry(t, log[0], operatorRow(store.AuditViaAPI), "event.redeliver", theirs,
		map[string]any{"execution_id": theirExec, "application_id": otherApp, "type": "execution.completed"})
	requireEntry(t, log[1], appRow(dbtest.TestApp, store.AuditViaAPI), "event.redeliver", mine,
		map[string]any{"execution_id": myExec, "application_id": dbtest.TestApp})
	requireEntry(t, log[2], operatorRow(store.AuditViaConsole), "event.redeliver", mine, nil)
}

// The entry is the redelivery's own transaction: when it cannot be written, the event is not
// redelivered either.
func TestRedeliverEventRollsBackWithoutItsEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6})
	bad := store.Audit{Who: store.AuditActor{Role: "nobody", ID: "x"}, Via: store.AuditViaAPI, Action: "event.redeliver", Target: id}
	_, err := b.server.store.EventRedeliver(context.Background(), store.AnyApplication, id, &bad)
	require.Error(t, err, "the role check refuses the entry")
	ev, _, err := b.server.store.EventGet(context.Background(), store.AnyApplication, id)
	require.NoError(t, err)
	require.Equal(t, execution.EventDead, ev.Status, "the redelivery went with its entry")
	require.Empty(t, auditLog(t, b))
}

// A redrive is audited with how many events it took; its preview and its refusals write nothing.
func TestRedriveEventsIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6})
	insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDead, attempts: 6})
	insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDead, attempts: 6})
	op := AsOperator(context.Background())
	redrive := func(ctx context.Context, req *gatewayv1.RedriveEventsRequest) func() error {
		return func() error { _, err := b.server.RedriveEvents(ctx, req); return err }
	}

	refused(t, b, codes.OK, redrive(op, &gatewayv1.RedriveEventsRequest{ValidateOnly: true}), "a preview changes nothing")
	refused(t, b, codes.InvalidArgument, redrive(b.ctx, &gatewayv1.RedriveEventsRequest{ApplicationId: otherApp}), "another application")
	refused(t, b, codes.InvalidArgument, redrive(op, &gatewayv1.RedriveEventsRequest{ApplicationId: "Not An App"}), "bad application")
	refused(t, b, codes.InvalidArgument, redrive(op, &gatewayv1.RedriveEventsRequest{Since: &timestamppb.Timestamp{Seconds: -1 << 62}}), "bad since")
	refused(t, b, codes.Unauthenticated, redrive(context.Background(), &gatewayv1.RedriveEventsRequest{}), "no caller")

	require.NoError(t, redrive(op, &gatewayv1.RedriveEventsRequest{ApplicationId: otherApp})())
	since := timestamppb.New(timestamppb.Now().AsTime().Add(-3600e9).Truncate(1e9))
	require.NoError(t, redrive(audit.ViaConsole(b.ctx), &gatewayv1.RedriveEventsRequest{Since: since})())
	require.NoError(t, redrive(op, &gatewayv1.RedriveEventsRequest{})())
	log := auditLog(t, b)
	require.Len(t, log, 3)
	requireEntry(t, log[0], operatorRow(store.AuditViaAPI), "events.redrive", "dead events of application "+otherApp,
		map[string]any{"count": float64(2), "application_id": otherApp})
	requireEntry(t, log[1], appRow(dbtest.TestApp, store.AuditViaConsole), "events.redrive",
		"dead events of application "+dbtest.TestApp+" since "+since.AsTime().UTC().Format("2006-01-02T15:04:05Z07:00"),
		map[string]any{"count": float64(1)})
	requireEntry(t, log[2], operatorRow(store.AuditViaAPI), "events.redrive", "dead events of every application",
		map[string]any{"count": float64(0)})
}

// A cancellation is audited after the settlement took it, by whoever asked; a refusal — a bad
// id, another application's or no execution, one already settled, no caller — writes nothing.
func TestCancelExecutionIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	theirs := b.schema.InsertExecution(t, dbtest.Execution{Application: otherApp, Status: execution.StatusPending})
	mine := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusPending})
	settled := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusSucceeded, Attempt: 1})
	op := AsOperator(context.Background())
	cancel := func(ctx context.Context, id string) func() error {
		return func() error {
			_, err := b.server.CancelExecution(ctx, &gatewayv1.CancelExecutionRequest{Id: id})
			return err
		}
	}

	refused(t, b, codes.InvalidArgument, cancel(op, "nope"), "bad id")
	refused(t, b, codes.NotFound, cancel(b.ctx, theirs), "another application's execution")
	refused(t, b, codes.FailedPrecondition, cancel(op, settled), "already settled")
	refused(t, b, codes.Unauthenticated, cancel(context.Background(), mine), "no caller")

	require.NoError(t, cancel(op, theirs)())
	require.NoError(t, cancel(audit.ViaConsole(b.ctx), mine)())
	log := auditLog(t, b)
	require.Len(t, log, 2)
	requireEntry(t, log[0], operatorRow(store.AuditViaAPI), "execution.cancel", theirs,
		map[string]any{"application_id": otherApp, "from_status": execution.StatusPending})
	requireEntry(t, log[1], appRow(dbtest.TestApp, store.AuditViaConsole), "execution.cancel", mine,
		map[string]any{"application_id": dbtest.TestApp})
}
