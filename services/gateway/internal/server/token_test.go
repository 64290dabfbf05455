package server

import (
	"context"
	"crypto/ed25519"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/integrations-platform/integrations/pkg/adapter"
	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/pkg/platformtoken/tokentest"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// TestSyncRefusedTokenIsNotAnAttempt: a sync call to an adapter that does not trust the
// gateway's signing key (a rotation done in the wrong order) spends no attempt — the accept is
// taken back, nothing reported, the handler never ran — and the caller gets a retryable
// UNAVAILABLE; once the adapter trusts the key, the call runs, signed for the catalog's adapter id.
func TestSyncRefusedTokenIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, 10*time.Second)
	signing, stale := tokentest.New(t, dbtest.TestAdapter), tokentest.New(t, dbtest.TestAdapter)
	pool := adaptercall.NewPool(adaptercall.WithSigner(signing.Signer))
	t.Cleanup(func() { _ = pool.Close() })
	b.server = New(store.New(b.schema.Pool), pool, nil, b.settlement, b.box,
		Options{MaxPayloadBytes: 1 << 20, Scale: func(d time.Duration) time.Duration { return d },
			SecretRotationOverlap: testRotationOverlap}, zaptest.NewLogger(t))

	var ran atomic.Int32
	serveAdapter := func(keys ...ed25519.PublicKey) {
		ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result {
			ran.Add(1)
			return adapter.Complete(map[string]any{"ok": true})
		}, adapter.Options{AdapterID: dbtest.TestAdapter, PlatformKeys: keys})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ad.Close() })
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := grpc.NewServer()
		ad.Register(srv)
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		_, err = b.schema.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, lis.Addr().String())
		require.NoError(t, err)
	}

	serveAdapter(stale.Public)
	_, err := invokeSync(b)
	c, reason := code(err)
	require.Equal(t, codes.Unavailable, c, "retryable: %v", err)
	require.Equal(t, "ADAPTER_UNAVAILABLE", reason)
	require.Zero(t, countExecutions(t, b), "the execution was taken back")
	require.Empty(t, b.settlement.requests(), "nothing was reported")
	require.Zero(t, ran.Load(), "the handler never ran")

	serveAdapter(stale.Public, signing.Public)
	resp, err := invokeSync(b)
	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, resp.GetExecution().GetStatus())
	require.EqualValues(t, 1, ran.Load())
}
