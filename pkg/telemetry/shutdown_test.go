package telemetry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/freeport"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A collector that is down costs spans, never the shutdown: the flush gives up within
// flushTimeout, however long the caller's ctx (the hard timeout) runs, and leaves no exporter
// goroutine behind. (Before, it waited on the exporter's retries until ctx ended: every deploy
// with the collector down took the whole hard timeout and exited unclean.)
func TestShutdownWithTheCollectorDownIsBounded(t *testing.T) {
	clearEnv(t)
	addr, err := freeport.Addr() // outside the ephemeral range: a closed port there can connect to itself; nothing listens there: every export is refused
	require.NoError(t, err)
	t.Setenv(envEndpoint, "http://"+addr)
	t.Setenv(envProtocol, "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000") // only the shutdown's flush tries to send
	shutdown, err := Setup(context.Background(), "test", zap.NewNop())
	require.NoError(t, err)
	_, span := Start(context.Background(), "work", trace.SpanKindInternal)
	span.End()

	// The caller's ctx runs two minutes, flushTimeout 3 s: a shutdown within flushTimeout+20 s
	// can only be flushTimeout's doing, and a loaded machine cannot add 20 s.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	err = shutdown(ctx)
	took := time.Since(start)
	require.Error(t, err, "the spans were not sent")
	assert.Less(t, took, flushTimeout+20*time.Second, "bounded by flushTimeout, not by the caller's two minutes")
	assert.NoError(t, ctx.Err(), "the caller's ctx still runs")
}
