package server

import (
	"context"
	"crypto/ed25519"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken/tokentest"
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

// TestCancelRefusedTokenLoggedAsError: the adapter's SDK refusing the cancellation's token is a
// configuration fault, logged at error level; an adapter that merely does not cancel is not.
func TestCancelRefusedTokenLoggedAsError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	signing, stale := tokentest.New(t, dbtest.TestAdapter), tokentest.New(t, dbtest.TestAdapter)
	pool := adaptercall.NewPool(adaptercall.WithSigner(signing.Signer))
	t.Cleanup(func() { _ = pool.Close() })
	core, logs := observer.New(zap.InfoLevel)
	// A new server (and store) per adapter: the store caches the capability's endpoint.
	newServer := func() *Server {
		return New(store.New(b.schema.Pool), pool, nil, b.settlement, b.box,
			Options{MaxPayloadBytes: 1 << 20, Scale: func(d time.Duration) time.Duration { return d },
				SecretRotationOverlap: testRotationOverlap}, zap.New(core))
	}

	serve := func(register func(*grpc.Server)) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		g := grpc.NewServer()
		register(g)
		go func() { _ = g.Serve(lis) }()
		t.Cleanup(g.Stop)
		_, err = b.schema.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, lis.Addr().String())
		require.NoError(t, err)
	}
	row := &execution.Row{ID: "exec-1", Attempt: 1, Capability: dbtest.TestCapability}

	ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result { return adapter.Complete(nil) },
		adapter.Options{AdapterID: dbtest.TestAdapter, PlatformKeys: []ed25519.PublicKey{stale.Public}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ad.Close() })
	serve(func(g *grpc.Server) { ad.Register(g) })
	newServer().stopAttempt(context.Background(), row)
	errs := logs.FilterLevelExact(zap.ErrorLevel).All()
	require.Len(t, errs, 1)
	require.Equal(t, "adapter refused the platform's token on the cancellation", errs[0].Message)
	logs.TakeAll()

	// A plain UNAUTHENTICATED of an adapter not on the SDK is no token refusal of ours.
	serve(func(g *grpc.Server) { adapterv1.RegisterAdapterServiceServer(g, unauthenticatedAdapter{}) })
	newServer().stopAttempt(context.Background(), row)
	require.Empty(t, logs.FilterLevelExact(zap.ErrorLevel).All())
	require.Equal(t, 1, logs.FilterMessage("adapter did not take the cancellation").Len())
}

// unauthenticatedAdapter answers every call UNAUTHENTICATED without the SDK's marker.
type unauthenticatedAdapter struct {
	adapterv1.UnimplementedAdapterServiceServer
}

func (unauthenticatedAdapter) Cancel(context.Context, *adapterv1.CancelRequest) (*adapterv1.CancelResponse, error) {
	return nil, status.Error(codes.Unauthenticated, "provider refused our key")
}
