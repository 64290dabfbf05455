package attempt

import (
	"context"
	"crypto/ed25519"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken/tokentest"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

// TestRefusedPlatformTokenSpendsNoAttempt: an adapter that does not trust the consumer's signing
// key (a rotation that reached the consumer first) refuses the call before its handler; the
// attempt is not spent and is rescheduled as for an unreachable adapter, nothing is settled.
// Once the adapter trusts the key, the same dispatch runs attempt 1 with a token whose audience
// is the catalog's adapter id.
func TestRefusedPlatformTokenSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	signing := tokentest.New(t, dbtest.TestAdapter)
	stale := tokentest.New(t, dbtest.TestAdapter)

	var ran atomic.Int32
	serveAdapter := func(keys ...ed25519.PublicKey) string {
		ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result {
			ran.Add(1)
			return adapter.Complete(map[string]any{"ok": true})
		}, adapter.Options{AdapterID: dbtest.TestAdapter, PlatformKeys: keys})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ad.Close() })
		srv := grpc.NewServer()
		ad.Register(srv)
		lis := listen(t, "127.0.0.1:0")
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		return lis.Addr().String()
	}
	_, err := s.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, serveAdapter(stale.Public))
	require.NoError(t, err)

	settlement := &recordingSettlement{}
	slis := listen(t, "127.0.0.1:0")
	ssrv := grpc.NewServer()
	settlementv1.RegisterSettlementServiceServer(ssrv, settlement)
	go func() { _ = ssrv.Serve(slis) }()
	t.Cleanup(ssrv.Stop)
	sconn, err := grpc.NewClient(slis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sconn.Close() })
	pool := adaptercall.NewPool(adaptercall.WithSigner(signing.Signer))
	t.Cleanup(func() { _ = pool.Close() })
	h := New(store.New(s.Pool), pool, settlementv1.NewSettlementServiceClient(sconn),
		func(d time.Duration) time.Duration { return d }, zap.NewNop())
	b := &bundle{schema: s, handler: h}

	id := s.InsertExecution(t, dbtest.Execution{})
	msg := message(t, id, 1, time.Now())
	require.Equal(t, mq.Ack().String(), h.Handle(context.Background(), msg).String())
	status, attempt, rows := b.current(t, id)
	require.Equal(t, "pending", status)
	require.EqualValues(t, 0, attempt, "the attempt is not spent")
	require.EqualValues(t, 0, rows)
	require.NotNil(t, b.dispatchDueIn(t, id, 1), "the attempt is rescheduled")
	require.Zero(t, ran.Load(), "the adapter's handler never ran")
	settlement.mu.Lock()
	require.Empty(t, settlement.settled)
	require.Empty(t, settlement.failed)
	settlement.mu.Unlock()
	b.deleteDispatches(t, id)

	// The rotation reaches the adapter: it trusts both keys.
	_, err = s.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, serveAdapter(stale.Public, signing.Public))
	require.NoError(t, err)
	require.Equal(t, mq.Ack().String(), h.Handle(context.Background(), msg).String())
	require.EqualValues(t, 1, ran.Load())
	settlement.mu.Lock()
	defer settlement.mu.Unlock()
	require.Len(t, settlement.settled, 1)
	require.EqualValues(t, 1, settlement.settled[0].GetAttempt())
}

// TestRefusedPlatformTokenLogsWhatBecameOfTheAttempt: the error line of a refused token says what
// unreachable() did with the attempt — rescheduled, not spent, while there is time; spent and
// reported at the deadline — never "not spent" before that is decided.
func TestRefusedPlatformTokenLogsWhatBecameOfTheAttempt(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	signing, stale := tokentest.New(t, dbtest.TestAdapter), tokentest.New(t, dbtest.TestAdapter)
	ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result { return adapter.Complete(nil) },
		adapter.Options{AdapterID: dbtest.TestAdapter, PlatformKeys: []ed25519.PublicKey{stale.Public}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ad.Close() })
	srv := grpc.NewServer()
	ad.Register(srv)
	lis := listen(t, "127.0.0.1:0")
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	_, err = s.Pool.Exec(context.Background(), `UPDATE adapters SET endpoint = $1`, lis.Addr().String())
	require.NoError(t, err)

	settlement := &recordingSettlement{}
	slis := listen(t, "127.0.0.1:0")
	ssrv := grpc.NewServer()
	settlementv1.RegisterSettlementServiceServer(ssrv, settlement)
	go func() { _ = ssrv.Serve(slis) }()
	t.Cleanup(ssrv.Stop)
	sconn, err := grpc.NewClient(slis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sconn.Close() })
	pool := adaptercall.NewPool(adaptercall.WithSigner(signing.Signer))
	t.Cleanup(func() { _ = pool.Close() })

	for name, tc := range map[string]struct {
		deadline time.Duration
		want     string
	}{
		"time left":       {time.Hour, "adapter refused the platform's token; attempt not spent, dispatch rescheduled"},
		"at the deadline": {900 * time.Millisecond, "adapter refused the platform's token; at the deadline: attempt spent, failure reported"},
	} {
		core, logs := observer.New(zap.InfoLevel)
		h := New(store.New(s.Pool), pool, settlementv1.NewSettlementServiceClient(sconn),
			func(d time.Duration) time.Duration { return d }, zap.New(core))
		id := s.InsertExecution(t, dbtest.Execution{Deadline: time.Now().Add(tc.deadline)})
		require.Equal(t, mq.Ack().String(), h.Handle(context.Background(), message(t, id, 1, time.Now())).String(), name)
		errs := logs.FilterLevelExact(zap.ErrorLevel).All()
		require.Len(t, errs, 1, name)
		require.Equal(t, tc.want, errs[0].Message, name)
		require.Equal(t, dbtest.TestAdapter, errs[0].ContextMap()["adapter_id"], name)
	}
}
