package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/secret"
)

// SyncWithdraw deletes a sync execution still running at attempt 1 with its attempt row, and
// leaves one that a cancellation or the sweeper settled first as it was.
func TestSyncWithdrawTakesBackOnlyARunningSyncAccept(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	ctx := context.Background()
	accept := func() string {
		t.Helper()
		id := uuid.NewString()
		_, created, err := st.ExecutionAccept(ctx, NewExecution{
			ID: id, ApplicationID: dbtest.TestApp, Capability: dbtest.TestCapability,
			Mode: execution.ModeSync, MaxAttempts: 1, Payload: []byte(`{}`), RequestHash: []byte("h"),
			IdempotencyKey: id, Budget: time.Minute, CallbackTokenHash: secret.Hash("cbt_" + id),
		})
		require.NoError(t, err)
		require.True(t, created)
		return id
	}
	count := func(table, id string) int {
		t.Helper()
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE `+
			map[string]string{"executions": "id", "execution_attempts": "execution_id"}[table]+` = $1`, id).Scan(&n))
		return n
	}

	running := accept()
	withdrawn, err := st.SyncWithdraw(ctx, running)
	require.NoError(t, err)
	require.True(t, withdrawn)
	require.Zero(t, count("executions", running))
	require.Zero(t, count("execution_attempts", running), "the attempt row goes with it")

	settled := accept()
	_, err = s.Pool.Exec(ctx, `UPDATE executions SET status = 'cancelled', settled_at = now() WHERE id = $1`, settled)
	require.NoError(t, err)
	withdrawn, err = st.SyncWithdraw(ctx, settled)
	require.NoError(t, err)
	require.False(t, withdrawn, "a settled execution keeps its outcome")
	require.Equal(t, 1, count("executions", settled))
	require.Equal(t, 1, count("execution_attempts", settled))

	async, err := uuid.NewV7()
	require.NoError(t, err)
	_, _, err = st.ExecutionAccept(ctx, NewExecution{ID: async.String(), ApplicationID: dbtest.TestApp,
		Capability: dbtest.TestCapability, Mode: execution.ModeAsync, MaxAttempts: 3, Payload: []byte(`{}`),
		RequestHash: []byte("h"), Budget: time.Minute})
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE executions SET status = 'running', attempt = 1 WHERE id = $1`, async.String())
	require.NoError(t, err)
	withdrawn, err = st.SyncWithdraw(ctx, async.String())
	require.NoError(t, err)
	require.False(t, withdrawn, "an async execution is never withdrawn")
	require.Equal(t, 1, count("executions", async.String()))
}
