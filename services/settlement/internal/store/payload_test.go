package store

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// goEventPayload is the completion event's body as the settlement built it in Go from the row it
// read back, before the statement built it in SQL: the reference the SQL must agree with.
func goEventPayload(t *testing.T, eventID string, r *execution.Row) []byte {
	t.Helper()
	type failure struct {
		Class   string `json:"class,omitempty"`
		Reason  string `json:"reason,omitempty"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message,omitempty"`
	}
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	data := map[string]any{
		"execution_id": r.ID,
		"capability":   r.Capability,
		"mode":         r.Mode,
		"status":       r.Status,
		"attempt":      r.Attempt,
		"sequence":     1, // the execution's only event here (progress events come first: TestCompletionFollowsProgressEvents)
	}
	if r.IdempotencyKey != nil {
		data["idempotency_key"] = *r.IdempotencyKey
	}
	if r.Result != nil {
		data["result"] = json.RawMessage(r.Result)
	}
	if r.FailureReason != nil || r.FailureClass != nil {
		data["failure"] = failure{Class: deref(r.FailureClass), Reason: deref(r.FailureReason), Code: deref(r.FailureCode), Message: deref(r.FailureMessage)}
	}
	body, err := json.Marshal(map[string]any{
		"id":        eventID,
		"type":      execution.EventTypeExecutionComplete,
		"timestamp": r.SettledAt.UTC().Format(time.RFC3339Nano),
		"data":      data,
	})
	require.NoError(t, err)
	return body
}

// The completion event's payload built in SQL is the one the Go code built from the settled row,
// for every shape: a result with nulls and nesting, a failure with some texts empty, an
// idempotency key or none, a settlement from pending, a failed attempt that settles.
func TestEventPayloadIsTheGoPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := func(id, k string) {
		_, err := b.schema.Pool.Exec(ctx, `UPDATE executions SET idempotency_key = $2 WHERE id = $1`, id, k)
		require.NoError(t, err)
	}
	check := func(t *testing.T, id, eventID string, answered *execution.Row) {
		t.Helper()
		// The answer, built from what the statement returned and what the request held, is the
		// row as stored (Proto without the payload: what the callers get).
		want, err := b.execution(t, id).Proto(false)
		require.NoError(t, err)
		got, err := answered.Proto(false)
		require.NoError(t, err)
		require.True(t, proto.Equal(want, got), "answer %v, stored %v", got, want)
		evs := b.events(t, id)
		require.Len(t, evs, 1)
		require.Equal(t, eventID, evs[0].ID)
		require.JSONEq(t, string(goEventPayload(t, eventID, b.execution(t, id))), string(evs[0].Payload))
	}

	t.Run("succeeded with a result and a key", func(t *testing.T) {
		id := b.insertRunning(t, 1, dayFromNow())
		key(id, "order-42 ünïcode \"quoted\"")
		out, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning,
			Status: execution.StatusSucceeded, Result: []byte(`{"a":null,"n":1.5e3,"deep":{"x":[1,"two",{"y":false}]},"s":"\u00e9"}`)})
		require.NoError(t, err)
		check(t, id, out.EventID, out.Execution)
	})
	t.Run("failed with some texts empty, no key", func(t *testing.T) {
		id := b.insertRunning(t, 1, dayFromNow())
		out, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning,
			Status: execution.StatusFailed, Failure: execution.Failure{Class: execution.ClassPermanent, Reason: execution.ReasonAdapterPermanent, Message: "no"}})
		require.NoError(t, err)
		check(t, id, out.EventID, out.Execution)
	})
	t.Run("cancelled from pending", func(t *testing.T) {
		id := b.schema.InsertExecution(t, dbtest.Execution{Status: execution.StatusPending})
		out, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 0, FromStatus: execution.StatusPending,
			Status: execution.StatusCancelled, Failure: execution.Failure{Reason: execution.ReasonCancelled, Message: "cancelled by the application"}})
		require.NoError(t, err)
		check(t, id, out.EventID, out.Execution)
	})
	t.Run("a failed attempt that settles", func(t *testing.T) {
		id := b.insertRunning(t, maxAttempts, dayFromNow())
		key(id, "k")
		out, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: id, Attempt: maxAttempts, Retryable: true, Scale: identity,
			Failure: execution.Failure{Class: execution.ClassTransient, Code: "E42", Message: "down"}})
		require.NoError(t, err)
		require.Nil(t, out.NextAttemptAt)
		check(t, id, out.EventID, out.Execution)
	})
	t.Run("a failed attempt that retries answers the row", func(t *testing.T) {
		id := b.insertRunning(t, 1, dayFromNow())
		out, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: id, Attempt: 1, Retryable: true, Scale: identity,
			Failure: execution.Failure{Class: execution.ClassTransient, Message: "down"}})
		require.NoError(t, err)
		require.NotNil(t, out.NextAttemptAt)
		want, err := b.execution(t, id).Proto(false)
		require.NoError(t, err)
		got, err := out.Execution.Proto(false)
		require.NoError(t, err)
		require.True(t, proto.Equal(want, got), "answer %v, stored %v", got, want)
		require.Empty(t, b.events(t, id))
	})
	t.Run("the timestamp's fraction trimmed as Go trims it", func(t *testing.T) {
		for _, at := range []string{"2026-12-02 13:37:14.1234+00", "2026-12-02 13:37:14+00", "2026-12-02 13:37:14.000001+00", "2026-12-02 13:37:14.5+02"} {
			var got string
			var ts time.Time
			require.NoError(t, b.schema.Pool.QueryRow(ctx, `
				SELECT to_char(s.settled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
					|| rtrim(rtrim(to_char(s.settled_at AT TIME ZONE 'UTC', '.US'), '0'), '.') || 'Z', s.settled_at
				FROM (SELECT $1::timestamptz AS settled_at) s`, at).Scan(&got, &ts))
			require.Equal(t, ts.UTC().Format(time.RFC3339Nano), got, at)
		}
	})
}

// A winning settlement wakes the event relay: a notification on the events channel carrying the
// event id, from Settle and from a failed attempt that settles.
func TestSettlementNotifiesTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.schema.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, "LISTEN "+execution.EventsNotifyChannel)
	require.NoError(t, err)

	id := b.insertRunning(t, 1, dayFromNow())
	out, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning,
		Status: execution.StatusSucceeded, Result: []byte(`{}`)})
	require.NoError(t, err)
	_, err = b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 1, FromStatus: execution.StatusRunning,
		Status: execution.StatusSucceeded, Result: []byte(`{}`)})
	var conflict *ConflictError
	require.ErrorAs(t, err, &conflict)
	failing := b.insertRunning(t, 1, dayFromNow())
	failed, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: failing, Attempt: 1, Scale: identity,
		Failure: execution.Failure{Class: execution.ClassPermanent}})
	require.NoError(t, err)

	// Other tests' settlements notify on the same channel (it is the database's): only ours count.
	want := map[string]int{out.EventID: 0, failed.EventID: 0}
	for want[out.EventID] == 0 || want[failed.EventID] == 0 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err, "notifications of ours seen: %v", want)
		if _, ok := want[n.Payload]; ok {
			want[n.Payload]++
		}
	}
	require.Equal(t, map[string]int{out.EventID: 1, failed.EventID: 1}, want)
}

// The completion event takes the sequence number after the execution's progress events (the
// counter on its row); a failed attempt that retries writes no event and takes no number.
func TestCompletionFollowsProgressEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insertRunning(t, 1, dayFromNow())
	// Two progress events, as adapter-callback writes them.
	_, err := b.schema.Pool.Exec(ctx, `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, sequence)
		SELECT gen_random_uuid(), application_id, id, 'execution.progress', '{}', s FROM executions, generate_series(1, 2) s
		WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(ctx, `UPDATE executions SET event_seq = 2 WHERE id = $1`, id)
	require.NoError(t, err)

	failed, err := b.store.AttemptFail(ctx, AttemptFailure{ExecutionID: id, Attempt: 1, Retryable: true, Scale: identity,
		Failure: execution.Failure{Class: execution.ClassTransient, Message: "down"}})
	require.NoError(t, err)
	require.NotNil(t, failed.NextAttemptAt)
	var seq int32
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT event_seq FROM executions WHERE id = $1`, id).Scan(&seq))
	require.Equal(t, int32(2), seq, "a retry writes no event")

	_, err = b.schema.Pool.Exec(ctx, `UPDATE executions SET status = 'running', attempt = 2, lease_expires_at = now() + interval '1 minute' WHERE id = $1`, id)
	require.NoError(t, err)
	b.schema.InsertAttempts(t, id, dbtest.Attempt{N: 2})
	out, err := b.store.ExecutionSettle(ctx, Outcome{ExecutionID: id, Attempt: 2, FromStatus: execution.StatusRunning,
		Status: execution.StatusSucceeded, Result: []byte(`{}`)})
	require.NoError(t, err)
	var payload []byte
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT sequence, payload FROM integration_events WHERE id = $1`, out.EventID).
		Scan(&seq, &payload))
	require.Equal(t, int32(3), seq)
	var body struct {
		Data struct {
			Sequence int32 `json:"sequence"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(payload, &body))
	require.Equal(t, int32(3), body.Data.Sequence)
}
