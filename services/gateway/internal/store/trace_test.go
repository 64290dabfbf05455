package store

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// Each row of a batched accept keeps its own request's trace context (none: NULL), and so does a
// sync accept.
func TestAcceptStoresEachRowsTraceContext(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	st := New(s.Pool)
	ctx := context.Background()

	a, b, none := newAsync("", "a"), newAsync("", "b"), newAsync("", "c")
	a.Traceparent, a.Tracestate = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "vendor=1"
	b.Traceparent = "00-11111111111111111111111111111111-2222222222222222-01"
	out, errs, err := st.acceptBatch(ctx, []NewExecution{a, b, none})
	require.NoError(t, err)
	require.Nil(t, errs)
	require.Len(t, out, 3)

	sync := newAsync("", "d")
	sync.Mode, sync.Traceparent, sync.CallbackTokenHash = execution.ModeSync, "00-33333333333333333333333333333333-4444444444444444-00", make([]byte, 32)
	_, created, err := st.ExecutionAccept(ctx, sync)
	require.NoError(t, err)
	require.True(t, created)

	for _, n := range []NewExecution{a, b, none, sync} {
		var tp, ts *string
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT traceparent, tracestate FROM executions WHERE id = $1`, n.ID).Scan(&tp, &ts))
		if n.Traceparent == "" {
			assert.Nil(t, tp, "no trace: NULL")
		} else if assert.NotNil(t, tp) {
			assert.Equal(t, n.Traceparent, *tp)
		}
		if n.Tracestate == "" {
			assert.Nil(t, ts)
		} else if assert.NotNil(t, ts) {
			assert.Equal(t, n.Tracestate, *ts)
		}
	}
}
