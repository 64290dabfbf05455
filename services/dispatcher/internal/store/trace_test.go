package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// The claim answers each dispatch with its execution's trace context, which its message
// continues; none (NULL) is empty.
func TestDispatchClaimReadsTheExecutionsTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	_, err := b.schema.Pool.Exec(ctx, `UPDATE executions SET traceparent = $2, tracestate = 'v=1' WHERE id = $1`, b.execution, tp)
	require.NoError(t, err)
	untraced := b.schema.InsertExecution(t, dbtest.Execution{})
	b.insert(t, 1, 0, nil)
	_, err = b.schema.Pool.Exec(ctx, `INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, 1, now())`, untraced)
	require.NoError(t, err)

	got, err := b.claim(ctx, 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, got, 2)
	for _, d := range got {
		if d.ExecutionID == b.execution {
			assert.Equal(t, tp, d.Traceparent)
			assert.Equal(t, "v=1", d.Tracestate)
		} else {
			assert.Empty(t, d.Traceparent)
			assert.Empty(t, d.Tracestate)
		}
	}
}
