package attempt

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

type bundle struct {
	schema  *dbtest.Schema
	handler *Handler
}

// setup gives a Handler on a schema of its own. It has no adapters and no settlement client: the
// paths tested here never reach them.
func setup(t *testing.T) *bundle {
	t.Helper()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	h := New(store.New(s.Pool), nil, nil, func(d time.Duration) time.Duration { return d }, zap.NewNop())
	return &bundle{schema: s, handler: h}
}

func message(t *testing.T, id string, n int32, due time.Time) *mq.Message {
	t.Helper()
	body, err := proto.Marshal(&queuev1.ExecutionDispatch{ExecutionId: id, Attempt: n, DueTime: timestamppb.New(due)})
	require.NoError(t, err)
	return &mq.Message{ID: id, Route: "executions", Body: body, Attempt: 1}
}

// current is the execution's status and attempt, and how many attempts were recorded.
func (b *bundle) current(t *testing.T, id string) (status string, attempt, rows int32) {
	t.Helper()
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		SELECT status, attempt, (SELECT count(*) FROM execution_attempts WHERE execution_id = $1)
		FROM executions WHERE id = $1`, id).Scan(&status, &attempt, &rows))
	return status, attempt, rows
}

// TestEarlyDispatchIsDeferredWithoutStartingTheAttempt: a dispatch that arrives before its due
// time is deferred for what is left; the attempt does not start.
func TestEarlyDispatchIsDeferredWithoutStartingTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.schema.InsertExecution(t, dbtest.Execution{})

	due := time.Now().Add(90 * time.Second)
	res := b.handler.Handle(context.Background(), message(t, id, 1, due))
	require.True(t, strings.HasPrefix(res.String(), "defer "), "got %s", res)
	left, err := time.ParseDuration(strings.TrimPrefix(res.String(), "defer "))
	require.NoError(t, err)
	require.LessOrEqual(t, left, 90*time.Second)
	require.Greater(t, left, 80*time.Second)
	require.NoError(t, res.Err(), "a deferral is not a failure")

	status, attempt, rows := b.current(t, id)
	require.Equal(t, "pending", status)
	require.Zero(t, attempt)
	require.Zero(t, rows)
}

// TestEarlyObsoleteDispatchIsDropped: an early dispatch whose attempt can never start (the
// execution settled, or the attempt already started) is acked at once, changing nothing, instead
// of waiting out its delay.
func TestEarlyObsoleteDispatchIsDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cancelled := b.schema.InsertExecution(t, dbtest.Execution{Status: "cancelled"})
	started := b.schema.InsertExecution(t, dbtest.Execution{Status: "running", Attempt: 1})
	b.schema.InsertAttempts(t, started, dbtest.Attempt{N: 1})

	for _, tc := range []struct {
		name string
		id   string
		n    int32
	}{
		{"settled", cancelled, 1},
		{"attempt already started", started, 1},
	} {
		before, beforeAttempt, beforeRows := b.current(t, tc.id)
		res := b.handler.Handle(context.Background(), message(t, tc.id, tc.n, time.Now().Add(time.Hour)))
		require.Equal(t, mq.Ack().String(), res.String(), tc.name)
		after, afterAttempt, afterRows := b.current(t, tc.id)
		require.Equal(t, []any{before, beforeAttempt, beforeRows}, []any{after, afterAttempt, afterRows}, tc.name)
	}
}

// TestEarlyIsMeasuredOnTheDatabaseClock: with the database's clock an hour behind this host's, a
// dispatch due now by this host's clock is an hour early by the database's — the clock that wrote
// the due time, and that the sweeper goes by — and is deferred by that hour.
func TestEarlyIsMeasuredOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	skewed := b.schema.WithClockSkew(t, -time.Hour)
	h := New(store.New(skewed.Pool), nil, nil, func(d time.Duration) time.Duration { return d }, zap.NewNop())
	id := b.schema.InsertExecution(t, dbtest.Execution{})

	res := h.Handle(context.Background(), message(t, id, 1, time.Now()))
	require.True(t, strings.HasPrefix(res.String(), "defer "), "got %s", res)
	left, err := time.ParseDuration(strings.TrimPrefix(res.String(), "defer "))
	require.NoError(t, err)
	require.InDelta(t, time.Hour.Seconds(), left.Seconds(), 5)
	status, attempt, rows := b.current(t, id)
	require.Equal(t, []any{"pending", int32(0), int32(0)}, []any{status, attempt, rows})
}
