package server

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

const testRotationOverlap = 24 * time.Hour

// otherApp is a second application, for tenant isolation.
const otherApp = "other"

func addOtherApp(t *testing.T, b *bundle) {
	t.Helper()
	_, err := b.schema.Pool.Exec(context.Background(),
		`INSERT INTO applications (id, name, api_key_hash) VALUES ($1, $1, sha256(convert_to($1, 'UTF8')))`, otherApp)
	require.NoError(t, err)
}

// testEvent is an integration_events row for insertEvent; zero fields take defaults: a pending,
// relayed completion event of a new execution of TestApp, created now.
type testEvent struct {
	app      string
	status   execution.EventStatus
	attempts int32
	// age puts created_at that long before now.
	age time.Duration
	// deliveries inserts attempt rows 1..n.
	deliveries int
	// typ and data (a format with %q for the execution id) are the event's type and body's data;
	// empty: a succeeded execution's completion.
	typ, data string
}

func insertEvent(t *testing.T, b *bundle, e testEvent) (id, executionID string) {
	t.Helper()
	if e.app == "" {
		e.app = dbtest.TestApp
	}
	if e.status == "" {
		e.status = execution.EventPending
	}
	executionID = b.schema.InsertExecution(t, dbtest.Execution{Application: e.app, Status: execution.StatusSucceeded, Attempt: 1})
	u, err := uuid.NewV7()
	require.NoError(t, err)
	id = u.String()
	if e.typ == "" {
		e.typ, e.data = execution.EventTypeExecutionComplete, `{"execution_id": %q, "status": "succeeded", "result": {"n": 1}}`
	}
	payload := fmt.Sprintf(`{"id": %q, "type": %q, "timestamp": "2025-01-01T00:00:00Z", "data": %s}`,
		id, e.typ, fmt.Sprintf(e.data, executionID))
	_, err = b.schema.Pool.Exec(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, created_at, relayed_at,
			delivery_status, attempts, last_error, next_attempt_at, delivered_at, dead_at)
		VALUES ($1, $2, $3, $8, $4, now() - make_interval(secs => $5), now(), $6::text, $7,
			CASE WHEN $6::text <> 'delivered' AND $7 > 0 THEN 'http_status' END,
			CASE WHEN $6::text = 'pending' AND $7 > 0 THEN now() + interval '5 minutes' END,
			CASE WHEN $6::text = 'delivered' THEN now() END,
			CASE WHEN $6::text = 'dead' THEN now() END)`,
		id, e.app, executionID, payload, e.age.Seconds(), e.status, e.attempts, e.typ)
	require.NoError(t, err)
	for n := 1; n <= e.deliveries; n++ {
		_, err := b.schema.Pool.Exec(context.Background(), `
			INSERT INTO event_deliveries (event_id, n, status_code, error, duration_ms, response_body)
			VALUES ($1, $2, 500, 'http_status', 12, 'oops')`, id, n)
		require.NoError(t, err)
	}
	return id, executionID
}

// field is the request field an InvalidArgument error names.
func field(err error) string {
	for _, d := range grpcx.ToStatus(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

func ids(events []*eventsv1.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.GetId()
	}
	return out
}

func TestListEventsIsScopedNewestFirstAndPaginated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	var mine []string
	for range 5 {
		id, _ := insertEvent(t, b, testEvent{})
		mine = append([]string{id}, mine...) // newest first
	}
	insertEvent(t, b, testEvent{app: otherApp})

	var got []string
	token := ""
	for page := 0; ; page++ {
		require.Less(t, page, 4, "pagination must end")
		resp, err := b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{PageSize: 2, PageToken: token})
		require.NoError(t, err)
		require.LessOrEqual(t, len(resp.GetEvents()), 2)
		got = append(got, ids(resp.GetEvents())...)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	require.Equal(t, mine, got, "only the application's own events, newest first, each once")

	resp, err := b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{})
	require.NoError(t, err)
	require.Len(t, resp.GetEvents(), 5)
	require.Empty(t, resp.GetNextPageToken())

	// A last page exactly full has no token either: it used to carry one that led to an empty page.
	resp, err = b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{PageSize: 5})
	require.NoError(t, err)
	require.Len(t, resp.GetEvents(), 5)
	require.Empty(t, resp.GetNextPageToken(), "the last page, full, has no next page")
	resp, err = b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{PageSize: 4})
	require.NoError(t, err)
	require.Len(t, resp.GetEvents(), 4)
	require.NotEmpty(t, resp.GetNextPageToken(), "a page with one more after it")
	e := resp.GetEvents()[0]
	require.Equal(t, execution.EventTypeExecutionComplete, e.GetType())
	require.Equal(t, eventsv1.EventStatus_EVENT_STATUS_PENDING, e.GetStatus())
	require.Equal(t, "succeeded", e.GetData().GetFields()["status"].GetStringValue(), "data is the body's data object")
	require.NotContains(t, e.GetData().GetFields(), "result", "a list leaves the result out (GetEvent has it)")
	require.Equal(t, "succeeded", e.GetExecutionCompleted().GetStatus(), "the data, typed")
	require.Nil(t, e.GetExecutionCompleted().GetResult(), "the typed data leaves it out too")
	require.Empty(t, e.GetDeliveries(), "a list carries no attempts")
}

// sameData asserts that an event's typed data (execution_completed or execution_progress, as its
// type says) says what its Struct data says: written as JSON by its field names (its zero values too:
// a stored body has every member that is not optional), it reads back as the same object.
func sameData(t *testing.T, e *eventsv1.Event) {
	t.Helper()
	typed := proto.Message(e.GetExecutionCompleted())
	if e.GetType() == execution.EventTypeExecutionProgress {
		typed = e.GetExecutionProgress()
		require.Nil(t, e.GetExecutionCompleted())
	}
	require.NotNil(t, typed, "typed data of a %s event", e.GetType())
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}.Marshal(typed)
	require.NoError(t, err)
	back := &structpb.Struct{}
	require.NoError(t, protojson.Unmarshal(raw, back))
	require.True(t, proto.Equal(e.GetData(), back), "typed %s\nstruct %s", raw, protojson.Format(e.GetData()))
}

// TestEventDataIsTyped: GetEvent and ListEvents answer each event's data typed by its type as
// well as as a Struct, the same values, for bodies as settlement and adapter-callback store them
// (members absent when unset, the failure's empty texts absent, a member a later release adds).
func TestEventDataIsTyped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, ev := range []testEvent{
		{typ: execution.EventTypeExecutionComplete, data: `{"execution_id": %q, "capability": "dummy.echo", "mode": "async",
			"status": "succeeded", "attempt": 1, "sequence": 3, "idempotency_key": "k-1", "result": {"echo": {"n": [1, 2]}}}`},
		{typ: execution.EventTypeExecutionComplete, data: `{"execution_id": %q, "capability": "dummy.echo", "mode": "sync",
			"status": "cancelled", "attempt": 0, "sequence": 1, "failure": {"reason": "cancelled", "message": "cancelled by the operator"}}`},
		{typ: execution.EventTypeExecutionProgress, data: `{"execution_id": %q, "capability": "dummy.echo", "attempt": 2,
			"sequence": 2, "progress": {"pct": 40, "step": "upload"}}`},
	} {
		id, executionID := insertEvent(t, b, ev)
		resp, err := b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: id})
		require.NoError(t, err)
		sameData(t, resp.GetEvent())
		if d := resp.GetEvent().GetExecutionCompleted(); d != nil {
			require.Equal(t, executionID, d.GetExecutionId())
			require.Equal(t, "dummy.echo", d.GetCapability())
		} else {
			require.Equal(t, int32(2), resp.GetEvent().GetExecutionProgress().GetAttempt())
			require.Equal(t, "upload", resp.GetEvent().GetExecutionProgress().GetProgress().GetFields()["step"].GetStringValue())
		}
	}
	list, err := b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetEvents(), 3)
	for _, e := range list.GetEvents() {
		sameData(t, e)
	}

	// A member the typed message does not know is skipped there and kept in data.
	id, _ := insertEvent(t, b, testEvent{typ: execution.EventTypeExecutionComplete,
		data: `{"execution_id": %q, "status": "succeeded", "sequence": 1, "later": {"x": 1}}`})
	resp, err := b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: id})
	require.NoError(t, err)
	require.Equal(t, "succeeded", resp.GetEvent().GetExecutionCompleted().GetStatus())
	require.Contains(t, resp.GetEvent().GetData().GetFields(), "later")
}

func TestListEventsFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old, _ := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6, age: 3 * time.Hour})
	dead, _ := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6, age: time.Hour})
	delivered, deliveredExec := insertEvent(t, b, testEvent{status: execution.EventDelivered, attempts: 1})
	pending, _ := insertEvent(t, b, testEvent{attempts: 2})
	now := time.Now()

	tests := []struct {
		name string
		req  *gatewayv1.ListEventsRequest
		want []string
	}{
		{"all", &gatewayv1.ListEventsRequest{}, []string{pending, delivered, dead, old}},
		{"dead", &gatewayv1.ListEventsRequest{Status: eventsv1.EventStatus_EVENT_STATUS_DEAD}, []string{dead, old}},
		{"pending", &gatewayv1.ListEventsRequest{Status: eventsv1.EventStatus_EVENT_STATUS_PENDING}, []string{pending}},
		{"execution", &gatewayv1.ListEventsRequest{ExecutionId: deliveredExec}, []string{delivered}},
		{"since", &gatewayv1.ListEventsRequest{Since: timestamppb.New(now.Add(-2 * time.Hour))}, []string{pending, delivered, dead}},
		{"until", &gatewayv1.ListEventsRequest{Until: timestamppb.New(now.Add(-30 * time.Minute))}, []string{dead, old}},
		{"since and until", &gatewayv1.ListEventsRequest{
			Since: timestamppb.New(now.Add(-2 * time.Hour)), Until: timestamppb.New(now.Add(-30 * time.Minute))}, []string{dead}},
		{"dead since", &gatewayv1.ListEventsRequest{Status: eventsv1.EventStatus_EVENT_STATUS_DEAD,
			Since: timestamppb.New(now.Add(-2 * time.Hour))}, []string{dead}},
		{"unknown execution", &gatewayv1.ListEventsRequest{ExecutionId: uuid.NewString()}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, err := b.server.ListEvents(b.ctx, tt.req)
			require.NoError(t, err)
			if tt.want == nil {
				require.Empty(t, resp.GetEvents())
				return
			}
			require.Equal(t, tt.want, ids(resp.GetEvents()))
		})
	}
}

func TestListEventsRefusesBadFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tests := []struct {
		name  string
		req   *gatewayv1.ListEventsRequest
		field string
	}{
		{"page size", &gatewayv1.ListEventsRequest{PageSize: 101}, "page_size"},
		{"negative page size", &gatewayv1.ListEventsRequest{PageSize: -1}, "page_size"},
		{"status", &gatewayv1.ListEventsRequest{Status: eventsv1.EventStatus(42)}, "status"},
		{"execution id", &gatewayv1.ListEventsRequest{ExecutionId: "nope"}, "execution_id"},
		{"since", &gatewayv1.ListEventsRequest{Since: &timestamppb.Timestamp{Seconds: 1 << 60}}, "since"},
		{"until", &gatewayv1.ListEventsRequest{Until: &timestamppb.Timestamp{Nanos: -1}}, "until"},
		{"until before since", &gatewayv1.ListEventsRequest{
			Since: timestamppb.New(time.Now()), Until: timestamppb.New(time.Now().Add(-time.Hour))}, "until"},
		{"page token", &gatewayv1.ListEventsRequest{PageToken: "!!"}, "page_token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := b.server.ListEvents(b.ctx, tt.req)
			c, _ := code(err)
			require.Equal(t, codes.InvalidArgument, c)
			require.Equal(t, tt.field, field(err))
		})
	}
}

func TestGetEventShowsItsDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, executionID := insertEvent(t, b, testEvent{attempts: 2, deliveries: 2})

	resp, err := b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: id})

	require.NoError(t, err)
	e := resp.GetEvent()
	require.Equal(t, id, e.GetId())
	require.Equal(t, executionID, e.GetExecutionId())
	require.Equal(t, int32(2), e.GetAttempts())
	require.Equal(t, "http_status", e.GetLastError())
	require.NotNil(t, e.GetNextAttemptTime())
	require.Nil(t, e.GetDeadTime())
	require.Equal(t, float64(1), e.GetData().GetFields()["result"].GetStructValue().GetFields()["n"].GetNumberValue())
	require.Len(t, e.GetDeliveries(), 2)
	for i, d := range e.GetDeliveries() {
		require.Equal(t, int32(i+1), d.GetNumber())
		require.Equal(t, int32(500), d.GetStatusCode())
		require.Equal(t, "http_status", d.GetError())
		require.Equal(t, 12*time.Millisecond, d.GetDuration().AsDuration())
		require.Equal(t, "oops", d.GetResponseBody())
		require.NotNil(t, d.GetTime())
	}
}

func TestEventsOfAnotherApplicationAreNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	theirs, _ := insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDead, attempts: 6})

	_, err := b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: theirs})
	c, _ := code(err)
	require.Equal(t, codes.NotFound, c)

	_, err = b.server.RedeliverEvent(b.ctx, &gatewayv1.RedeliverEventRequest{Id: theirs})
	c, _ = code(err)
	require.Equal(t, codes.NotFound, c)

	resp, err := b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{})
	require.NoError(t, err)
	require.Zero(t, resp.GetCount())

	var status string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT delivery_status FROM integration_events WHERE id = $1`, theirs).Scan(&status))
	require.EqualValues(t, execution.EventDead, status, "another application's event is untouched")

	for _, id := range []string{"nope", ""} {
		_, err = b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: id})
		c, _ = code(err)
		require.Equal(t, codes.InvalidArgument, c)
		require.Equal(t, "id", field(err))
	}
}

// listen returns a function that waits for a NOTIFY on the relay's channel with the payload.
func listen(t *testing.T, b *bundle) func(payload string) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.schema.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Hijack().Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN "+execution.EventsNotifyChannel)
	require.NoError(t, err)
	return func(payload string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// The channel is database-wide: parallel tests' notifications are skipped.
		for {
			n, err := conn.Conn().WaitForNotification(ctx)
			require.NoError(t, err, "no notification %q", payload)
			if n.Payload == payload {
				return
			}
		}
	}
}

type eventState struct {
	status                                      execution.EventStatus
	attempts                                    int32
	lastError                                   *string
	nextAttemptAt, deadAt, deliveredAt, relayed *time.Time
	deliveries                                  int
}

func readState(t *testing.T, b *bundle, id string) eventState {
	t.Helper()
	var s eventState
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		SELECT delivery_status, attempts, last_error, next_attempt_at, dead_at, delivered_at, relayed_at,
			(SELECT count(*) FROM event_deliveries WHERE event_id = e.id)
		FROM integration_events e WHERE id = $1`, id).Scan(&s.status, &s.attempts, &s.lastError,
		&s.nextAttemptAt, &s.deadAt, &s.deliveredAt, &s.relayed, &s.deliveries))
	return s
}

func TestRedeliverEventResetsStateAndKeepsHistory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ev   testEvent
	}{
		{"dead", testEvent{status: execution.EventDead, attempts: 6, deliveries: 6}},
		{"delivered", testEvent{status: execution.EventDelivered, attempts: 2, deliveries: 2}},
		{"pending between attempts", testEvent{attempts: 3, deliveries: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id, _ := insertEvent(t, b, tt.ev)
			notified := listen(t, b)

			resp, err := b.server.RedeliverEvent(b.ctx, &gatewayv1.RedeliverEventRequest{Id: id})

			require.NoError(t, err)
			e := resp.GetEvent()
			require.Equal(t, eventsv1.EventStatus_EVENT_STATUS_PENDING, e.GetStatus())
			require.Zero(t, e.GetAttempts())
			require.Empty(t, e.GetLastError())
			require.Nil(t, e.GetDeadTime())
			require.Nil(t, e.GetNextAttemptTime())
			s := readState(t, b, id)
			require.Equal(t, eventState{status: execution.EventPending, deliveries: tt.ev.deliveries}, s,
				"pending, a fresh budget, unrelayed; the history kept")
			notified(id)

			// The event router's next attempt continues the numbering (its insert takes max(n)+1).
			_, err = b.schema.Pool.Exec(context.Background(), `
				INSERT INTO event_deliveries (event_id, n, status_code, duration_ms)
				SELECT $1, COALESCE(max(n), 0) + 1, 200, 5 FROM event_deliveries WHERE event_id = $1`, id)
			require.NoError(t, err)
			got, err := b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: id})
			require.NoError(t, err)
			require.Len(t, got.GetEvent().GetDeliveries(), tt.ev.deliveries+1)
			require.Equal(t, int32(tt.ev.deliveries+1), got.GetEvent().GetDeliveries()[tt.ev.deliveries].GetNumber())
		})
	}
}

func TestRedriveEventsRedrivesOnlyTheApplicationsDeadEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addOtherApp(t, b)
	oldDead, _ := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6, deliveries: 6, age: 3 * time.Hour})
	newDead, _ := insertEvent(t, b, testEvent{status: execution.EventDead, attempts: 6, deliveries: 6, age: time.Hour})
	pending, _ := insertEvent(t, b, testEvent{attempts: 2})
	delivered, _ := insertEvent(t, b, testEvent{status: execution.EventDelivered, attempts: 1})
	theirs, _ := insertEvent(t, b, testEvent{app: otherApp, status: execution.EventDead, attempts: 6})
	notified := listen(t, b)
	before := map[string]eventState{}
	for _, id := range []string{oldDead, pending, delivered, theirs} {
		before[id] = readState(t, b, id)
	}

	resp, err := b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{Since: timestamppb.New(time.Now().Add(-2 * time.Hour))})

	require.NoError(t, err)
	require.Equal(t, int64(1), resp.GetCount(), "only the dead event created since")
	require.Equal(t, eventState{status: execution.EventPending, deliveries: 6}, readState(t, b, newDead))
	notified("redrive")
	for id, s := range before {
		require.Equal(t, s, readState(t, b, id), "event %s untouched", id)
	}

	resp, err = b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{})

	require.NoError(t, err)
	require.Equal(t, int64(1), resp.GetCount(), "the other dead event; the first is pending now")
	require.Equal(t, execution.EventPending, readState(t, b, oldDead).status)
	require.Equal(t, execution.EventDead, readState(t, b, theirs).status)

	resp, err = b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{})
	require.NoError(t, err)
	require.Zero(t, resp.GetCount())

	_, err = b.server.RedriveEvents(b.ctx, &gatewayv1.RedriveEventsRequest{Since: &timestamppb.Timestamp{Seconds: -1 << 60}})
	c, _ := code(err)
	require.Equal(t, codes.InvalidArgument, c)
	require.Equal(t, "since", field(err))
}

// secrets opens the application's current and previous signing secrets as stored.
func secrets(t *testing.T, b *bundle) (current, previous string, until *time.Time) {
	t.Helper()
	var cur, prev []byte
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		SELECT signing_secret_enc, signing_secret_prev_enc, signing_secret_prev_until FROM applications WHERE id = $1`,
		dbtest.TestApp).Scan(&cur, &prev, &until))
	open := func(sealed []byte) string {
		if sealed == nil {
			return ""
		}
		plain, err := b.box.Open(sealed)
		require.NoError(t, err)
		return string(plain)
	}
	return open(cur), open(prev), until
}

func TestRotateSigningSecretKeepsThePreviousOneUntilTheOverlapEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	set, err := b.server.SetConsumer(b.ctx, &gatewayv1.SetConsumerRequest{
		Consumer: &gatewayv1.SetConsumerRequest_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: "https://example.com/events"}}})
	require.NoError(t, err)
	first := set.GetSigningSecret()
	require.Regexp(t, `^whsec_`, first)

	start := time.Now()
	resp, err := b.server.RotateSigningSecret(b.ctx, &gatewayv1.RotateSigningSecretRequest{})

	require.NoError(t, err)
	second := resp.GetSigningSecret()
	require.Regexp(t, `^whsec_`, second)
	require.NotEqual(t, first, second)
	require.WithinDuration(t, start.Add(testRotationOverlap), resp.GetPreviousSecretExpireTime().AsTime(), 5*time.Second)
	current, previous, until := secrets(t, b)
	require.Equal(t, second, current)
	require.Equal(t, first, previous, "the previous secret is kept, sealed")
	require.NotNil(t, until)
	require.True(t, until.Equal(resp.GetPreviousSecretExpireTime().AsTime()))

	// Registering the consumer again answers the secret in force and keeps the rotation.
	set, err = b.server.SetConsumer(b.ctx, &gatewayv1.SetConsumerRequest{
		Consumer: &gatewayv1.SetConsumerRequest_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: "https://example.com/v2"}}})
	require.NoError(t, err)
	require.Equal(t, second, set.GetSigningSecret())
	_, previous, _ = secrets(t, b)
	require.Equal(t, first, previous)

	// A second rotation replaces the previous secret: one is kept.
	resp, err = b.server.RotateSigningSecret(b.ctx, &gatewayv1.RotateSigningSecretRequest{})
	require.NoError(t, err)
	current, previous, _ = secrets(t, b)
	require.Equal(t, resp.GetSigningSecret(), current)
	require.Equal(t, second, previous)
}

func TestRotateSigningSecretWithoutOne(t *testing.T) {
	t.Parallel()
	b := setup(t)

	resp, err := b.server.RotateSigningSecret(b.ctx, &gatewayv1.RotateSigningSecretRequest{})

	require.NoError(t, err)
	require.Nil(t, resp.GetPreviousSecretExpireTime(), "nothing to keep")
	current, previous, until := secrets(t, b)
	require.Equal(t, resp.GetSigningSecret(), current)
	require.Empty(t, previous)
	require.Nil(t, until)
}

func TestSetConsumerGRPC(t *testing.T) {
	t.Parallel()
	tests := []struct {
		target       string
		allowPrivate bool
		// wantErr is false for a valid target.
		wantErr bool
	}{
		{target: "consumer.example.com:443"},
		{target: "203.0.114.7:9000"},
		{target: "[2a00:1450:4001:80b::200e]:443"},
		{target: "127.0.0.1:9000", allowPrivate: true},
		{target: "localhost:9000", allowPrivate: true},
		{target: "127.0.0.1:9000", wantErr: true},
		{target: "10.1.2.3:9000", wantErr: true},
		{target: "169.254.169.254:80", wantErr: true},
		{target: "[::1]:9000", wantErr: true},
		{target: "localhost:9000", wantErr: true},
		{target: "consumer.example.com", wantErr: true},
		{target: "consumer.example.com:0", wantErr: true},
		{target: "consumer.example.com:http", wantErr: true},
		{target: ":9000", wantErr: true},
		{target: "dns:///consumer.example.com:443", wantErr: true},
		{target: "https://consumer.example.com:443", wantErr: true},
		{target: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s private=%v", tt.target, tt.allowPrivate), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.server.opts.WebhookAllowPrivate = tt.allowPrivate

			resp, err := b.server.SetConsumer(b.ctx, &gatewayv1.SetConsumerRequest{
				Consumer: &gatewayv1.SetConsumerRequest_Grpc{Grpc: &gatewayv1.GrpcConsumer{Target: tt.target}}})

			var kind, endpoint *string
			require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
				`SELECT consumer_kind, consumer_endpoint FROM applications WHERE id = $1`, dbtest.TestApp).Scan(&kind, &endpoint))
			if tt.wantErr {
				c, _ := code(err)
				require.Equal(t, codes.InvalidArgument, c)
				require.Equal(t, "grpc.target", field(err))
				require.Nil(t, kind, "nothing written")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.target, resp.GetGrpc().GetTarget())
			require.Regexp(t, `^whsec_`, resp.GetSigningSecret())
			require.Equal(t, "grpc", *kind)
			require.Equal(t, tt.target, *endpoint)
		})
	}
}

func TestSetConsumerRequiresOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.server.SetConsumer(b.ctx, &gatewayv1.SetConsumerRequest{})
	c, _ := code(err)
	require.Equal(t, codes.InvalidArgument, c)
	require.Equal(t, "consumer", field(err))
	require.False(t, errors.Is(err, store.ErrNotFound))
}
