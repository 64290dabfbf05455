package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/telemetry"
)

// The accept's span names the execution the caller is answered with: for an idempotent replay,
// the one its key names, sync as async (a sync replay's span named an id made for the call, which
// no execution has).
func TestAcceptSpanNamesTheExecutionAReplayAnswers(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, 10*time.Second)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	for _, mode := range []executionv1.Mode{executionv1.Mode_MODE_SYNC, executionv1.Mode_MODE_ASYNC} {
		exp.Reset()
		req := &gatewayv1.InvokeCapabilityRequest{Capability: dbtest.TestCapability, Mode: mode, IdempotencyKey: "replay-" + mode.String()}
		var ids []string
		for range 2 {
			ctx, span := tp.Tracer("test").Start(b.ctx, "accept")
			resp, err := b.server.InvokeCapability(ctx, req)
			span.End()
			require.NoError(t, err, mode)
			ids = append(ids, resp.GetExecution().GetId())
		}
		require.Equal(t, ids[0], ids[1], "%v: the replay answers the first execution", mode)
		spans := exp.GetSpans()
		require.Len(t, spans, 2)
		for i, s := range spans {
			var got string
			for _, a := range s.Attributes {
				if a.Key == telemetry.ExecutionIDKey {
					got = a.Value.AsString()
				}
			}
			assert.Equal(t, ids[0], got, "%v: call %d's span names the execution it was answered with", mode, i+1)
		}
	}
}
