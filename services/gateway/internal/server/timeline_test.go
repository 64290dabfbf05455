package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// retriedExecution writes an execution that failed attempt 1 after one progress report, renewed
// attempt 2's lease twice and reported its progress three times, succeeded on attempt 2 and whose completion event was delivered on the second try, with every
// time set a second apart so that the expected order is the only right one.
func retriedExecution(t *testing.T, b *bundle) string {
	t.Helper()
	_, executionID := insertEvent(t, b, testEvent{deliveries: 2})
	b.schema.InsertAttempts(t, executionID,
		dbtest.Attempt{N: 1, Outcome: "failed", FailureClass: execution.ClassTimeout},
		dbtest.Attempt{N: 2, Outcome: execution.AttemptSucceeded})
	for _, q := range []string{
		`UPDATE executions SET created_at = '2026-01-01 10:00:00Z', updated_at = '2026-01-01 10:00:06Z',
			settled_at = '2026-01-01 10:00:06Z', attempt = 2, max_attempts = 3, idempotency_key = 'order-7',
			progress = '{"percent": 80}'
			WHERE id = $1`,
		`UPDATE execution_attempts SET started_at = '2026-01-01 10:00:01Z', ended_at = '2026-01-01 10:00:02Z',
			failure_message = 'provider timed out', progress_reports = 1, last_progress_at = '2026-01-01 10:00:01.5Z'
			WHERE execution_id = $1 AND n = 1`,
		`UPDATE execution_attempts SET started_at = '2026-01-01 10:00:03Z', ended_at = '2026-01-01 10:00:05Z',
			renewals = 2, last_renewed_at = '2026-01-01 10:00:04Z',
			progress_reports = 3, last_progress_at = '2026-01-01 10:00:04.5Z' WHERE execution_id = $1 AND n = 2`,
		`UPDATE integration_events SET created_at = '2026-01-01 10:00:06Z' WHERE execution_id = $1`,
		`UPDATE event_deliveries SET at = '2026-01-01 10:00:07Z'::timestamptz + make_interval(secs => n),
			status_code = CASE n WHEN 2 THEN 204 ELSE 500 END, response_body = repeat('x', 1000)
			WHERE event_id IN (SELECT id FROM integration_events WHERE execution_id = $1)`,
	} {
		_, err := b.schema.Pool.Exec(context.Background(), q, executionID)
		require.NoError(t, err, q)
	}
	return executionID
}

func TestGetExecutionTimelineOrdersEveryHop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := retriedExecution(t, b)

	resp, err := b.server.GetExecutionTimeline(b.ctx, &gatewayv1.GetExecutionTimelineRequest{Id: id})

	require.NoError(t, err)
	require.Equal(t, id, resp.GetExecutionId())
	type step struct {
		kind    gatewayv1.TimelineEntryKind
		attempt int32
	}
	var got []step
	for _, e := range resp.GetEntries() {
		got = append(got, step{e.GetKind(), e.GetAttempt()})
	}
	require.Equal(t, []step{
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ACCEPTED, 0},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_STARTED, 1},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_PROGRESS, 1},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_ENDED, 1},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_STARTED, 2},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_LEASE_RENEWED, 2},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_PROGRESS, 2},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_ENDED, 2},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_SETTLED, 2},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_EVENT, 0},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_DELIVERY, 0},
		{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_DELIVERY, 0},
	}, got)
	en := resp.GetEntries()
	require.Equal(t, "order-7", en[0].GetIdempotencyKey())
	require.Equal(t, int32(1), en[2].GetProgressReports())
	require.Nil(t, en[2].GetProgress(), "attempt 1's report was replaced by attempt 2's: its value is not stored")
	require.Equal(t, execution.ClassTimeout, en[3].GetErrorClass())
	require.Equal(t, "provider timed out", en[3].GetErrorMessage())
	require.Equal(t, int32(2), en[5].GetRenewals())
	require.Equal(t, int32(3), en[6].GetProgressReports())
	require.Equal(t, "2026-01-01T10:00:04.5Z", en[6].GetAt().AsTime().Format(time.RFC3339Nano), "at the last report")
	require.Equal(t, float64(80), en[6].GetProgress().GetFields()["percent"].GetNumberValue(), "the last report's value")
	require.Equal(t, "execution.completed", en[9].GetEventType())
	require.Equal(t, int32(500), en[10].GetStatusCode())
	require.Equal(t, int32(204), en[11].GetStatusCode())
	require.Len(t, en[11].GetResponseStart(), 256, "only the start of the answer")
	for i := 1; i < len(en); i++ {
		require.False(t, en[i].GetAt().AsTime().Before(en[i-1].GetAt().AsTime()), "entry %d before %d", i, i-1)
	}
}

// A progress stored before reports were counted on the attempt (migration 00018) has no time of
// its own: the timeline still shows it, at the settlement, and says so.
func TestGetExecutionTimelinePlacesUncountedProgressAtTheSettlement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := retriedExecution(t, b)
	_, err := b.schema.Pool.Exec(context.Background(), `UPDATE execution_attempts SET progress_reports = 0, last_progress_at = NULL
		WHERE execution_id = $1`, id)
	require.NoError(t, err)

	resp, err := b.server.GetExecutionTimeline(b.ctx, &gatewayv1.GetExecutionTimelineRequest{Id: id})
	require.NoError(t, err)
	var progress []*gatewayv1.TimelineEntry
	for _, e := range resp.GetEntries() {
		if e.GetKind() == gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_PROGRESS {
			progress = append(progress, e)
		}
	}
	require.Len(t, progress, 1)
	require.Equal(t, "2026-01-01T10:00:06Z", progress[0].GetAt().AsTime().Format(time.RFC3339Nano), "at the settlement")
	require.Equal(t, float64(80), progress[0].GetProgress().GetFields()["percent"].GetNumberValue())
	require.Contains(t, progress[0].GetSummary(), "not recorded")
}

// Delivery durations are stored in whole milliseconds: they read as such, not as "0s".
func TestDurationText(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "<1 ms", 900 * time.Microsecond: "<1 ms", 3 * time.Millisecond: "3 ms",
		2400 * time.Millisecond: "2400 ms", 12345 * time.Millisecond: "12.3 s",
	} {
		require.Equal(t, want, DurationText(d), "%s", d)
	}
}

func TestGetExecutionTimelineAuthorisation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	id := retriedExecution(t, b)
	theirs := b.schema.InsertExecution(t, dbtest.Execution{Application: otherApp, Status: execution.StatusPending})

	_, err := b.server.GetExecutionTimeline(b.ctx, &gatewayv1.GetExecutionTimelineRequest{Id: theirs})
	c, _ := code(err)
	require.Equal(t, codes.NotFound, c, "another application's execution")

	_, err = b.server.GetExecutionTimeline(b.ctx, &gatewayv1.GetExecutionTimelineRequest{Id: "nope"})
	c, _ = code(err)
	require.Equal(t, codes.InvalidArgument, c)
	require.Equal(t, "id", field(err))

	// Through the interceptor: another application's key gets NOT_FOUND, the admin token reads
	// both applications' timelines and nothing else.
	auth := AuthInterceptor(b.server.store, nil, "the-admin-token")
	call := func(token, method string, req any, h grpc.UnaryHandler) error {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
		_, err := auth(ctx, req, &grpc.UnaryServerInfo{Server: b.server, FullMethod: method}, h)
		return err
	}
	timeline := func(id string) (any, grpc.UnaryHandler) {
		req := &gatewayv1.GetExecutionTimelineRequest{Id: id}
		return req, func(ctx context.Context, req any) (any, error) {
			return b.server.GetExecutionTimeline(ctx, req.(*gatewayv1.GetExecutionTimelineRequest))
		}
	}
	_, otherKey, err := b.server.store.CreateKey(context.Background(), store.NewKey{ApplicationID: otherApp})
	require.NoError(t, err)
	req, h := timeline(id)
	c, _ = code(call(otherKey, gatewayv1.GatewayService_GetExecutionTimeline_FullMethodName, req, h))
	require.Equal(t, codes.NotFound, c, "other application's key")
	for _, x := range []string{id, theirs} {
		req, h := timeline(x)
		require.NoError(t, call("the-admin-token", gatewayv1.GatewayService_GetExecutionTimeline_FullMethodName, req, h))
	}
	err = call("the-admin-token", gatewayv1.GatewayService_GetExecution_FullMethodName, &gatewayv1.GetExecutionRequest{Id: id},
		func(ctx context.Context, req any) (any, error) {
			return b.server.GetExecution(ctx, req.(*gatewayv1.GetExecutionRequest))
		})
	c, _ = code(err)
	require.Equal(t, codes.PermissionDenied, c)
}

// An execution of a progress_events capability: its progress events appear on the timeline in
// sequence order before the completion event, each with its type, sequence, the progress it
// carries and its delivery attempts; the events API shows their type and sequence too.
func TestGetExecutionTimelineShowsProgressEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := retriedExecution(t, b)
	ctx := context.Background()
	for _, q := range []string{
		`UPDATE integration_events SET sequence = 3 WHERE execution_id = $1`,
		`INSERT INTO integration_events (id, application_id, execution_id, type, payload, created_at, sequence, delivery_status, delivered_at)
			SELECT gen_random_uuid(), application_id, id, 'execution.progress',
				jsonb_build_object('type', 'execution.progress', 'data', jsonb_build_object('execution_id', id, 'sequence', s,
					'progress', jsonb_build_object('percent', s * 40))),
				'2026-01-01 10:00:04Z'::timestamptz + make_interval(secs => s * 0.25), s, 'delivered', now()
			FROM executions, generate_series(1, 2) s WHERE id = $1`,
		`INSERT INTO event_deliveries (event_id, n, at, status_code, duration_ms)
			SELECT e.id, 1, e.created_at + interval '10 milliseconds', 204, 3
			FROM integration_events e WHERE e.execution_id = $1 AND e.type = 'execution.progress'`,
	} {
		_, err := b.schema.Pool.Exec(ctx, q, id)
		require.NoError(t, err, q)
	}

	resp, err := b.server.GetExecutionTimeline(b.ctx, &gatewayv1.GetExecutionTimelineRequest{Id: id})
	require.NoError(t, err)
	type ev struct {
		kind     gatewayv1.TimelineEntryKind
		typ      string
		sequence int32
		percent  float64
	}
	var got []ev
	for _, e := range resp.GetEntries() {
		if e.GetEventId() != "" {
			got = append(got, ev{e.GetKind(), e.GetEventType(), e.GetEventSequence(), e.GetProgress().GetFields()["percent"].GetNumberValue()})
		}
	}
	const event, delivery = gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_EVENT, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_DELIVERY
	require.Equal(t, []ev{
		{event, "execution.progress", 1, 40}, {delivery, "execution.progress", 1, 0},
		{event, "execution.progress", 2, 80}, {delivery, "execution.progress", 2, 0},
		{event, "execution.completed", 3, 0}, {delivery, "execution.completed", 3, 0}, {delivery, "execution.completed", 3, 0},
	}, got)

	list, err := b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{ExecutionId: id})
	require.NoError(t, err)
	types := map[int32]string{}
	for _, e := range list.GetEvents() {
		types[e.GetSequence()] = e.GetType()
	}
	require.Equal(t, map[int32]string{1: "execution.progress", 2: "execution.progress", 3: "execution.completed"}, types)
}
