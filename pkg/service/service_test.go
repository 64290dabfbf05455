package service

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/connectivity"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// settings is the least a service's settings embed.
type settings struct {
	config.Common
	config.InternalTLS
}

// withSecrets are settings of a service that holds signing secrets.
type withSecrets struct {
	settings
	config.SecretKeys
}

// withSecretsAndPublic are settings of a service that holds signing secrets and has
// client-facing listeners.
type withSecretsAndPublic struct {
	settings
	config.SecretKeys
	config.PublicTLS
}

func amqpURL() string {
	if u := os.Getenv("INTEGRATIONS_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// testSettings reach the test database and broker, on a queue scope of the test's own, with
// internal mTLS off and a shutdown of a few seconds without a drain window.
func testSettings(t *testing.T) settings {
	t.Helper()
	scope := "servicetest-" + uuid.NewString()[:8]
	t.Cleanup(func() {
		b, err := mq.Dial(context.Background(), mq.Config{URL: amqpURL(), Scope: scope})
		if err != nil {
			return // nothing was declared
		}
		assert.NoError(t, b.DeleteRoutes(context.Background(), routes.Executions))
		assert.NoError(t, b.Close())
	})
	return settings{
		Common: config.Common{
			LogLevel: "info", DatabaseURL: dbtest.BaseURL(), Broker: config.BrokerRabbitMQ, AMQPURL: amqpURL(),
			QueueScope: scope, TimeScale: 1, ShutdownSoftTimeout: 2 * time.Second, ShutdownTimeout: 5 * time.Second,
		},
		InternalTLS: config.InternalTLS{InternalPlaintext: true},
	}
}

// observed returns a logger constructor whose lines the test reads.
func observed() (func(string, string) (*zap.Logger, error), *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	return func(string, string) (*zap.Logger, error) { return zap.New(core), nil }, logs
}

// TestShutdownClosesInOrder: the prelude opens the pool and the broker (with the Spec's routes),
// the wiring gets them; at shutdown the broker closes first, then the wiring's own closers
// (while the peer connections and the pool are still open), then the peer connections and the
// pool.
func TestShutdownClosesInOrder(t *testing.T) {
	cfg := testSettings(t)
	newLogger, logs := observed()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var k *Kit
	var own struct {
		ran                     bool
		brokerErr, poolErr      error
		peerState               connectivity.State
		peerClosedAfterOwnClose bool
	}
	err := run(ctx, "svc", Spec{Routes: []mq.Route{routes.Executions}}, cfg, func(ctx context.Context, kit *Kit, got settings) error {
		k = kit
		assert.Equal(t, cfg, got)
		require.NotNil(t, k.Pool)
		require.NotNil(t, k.Broker)
		assert.NotEmpty(t, k.Broker.DelayLevels(routes.Executions.Name), "the Spec's routes are declared")
		assert.Nil(t, k.Internal, "mTLS off")
		assert.Nil(t, k.Public, "no client-facing certificate in these settings")
		assert.Nil(t, k.Box, "no secret keys in these settings")
		peer, err := k.Dial("peer", "127.0.0.1:1") // lazy: nothing listens there
		require.NoError(t, err)
		k.App.Close("own", func() error {
			own.ran = true
			own.brokerErr = k.Broker.Declare(context.Background(), routes.Executions)
			own.poolErr = k.Pool.Ping(context.Background())
			own.peerState = peer.GetState()
			return nil
		})
		t.Cleanup(func() { assert.Equal(t, connectivity.Shutdown, peer.GetState(), "the peer connection is closed") })
		stop() // Run returns as soon as everything started
		return nil
	}, newLogger)
	require.NoError(t, err)

	require.True(t, own.ran)
	assert.ErrorIs(t, own.brokerErr, mq.ErrClosed, "the broker closed before the wiring's closers")
	assert.NoError(t, own.poolErr, "the pool is still open for the wiring's closers")
	assert.NotEqual(t, connectivity.Shutdown, own.peerState, "the peer connection is still open for the wiring's closers")
	assert.Error(t, k.Pool.Ping(context.Background()), "the pool closed last")
	assert.Equal(t, 1, logs.FilterMessage("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): any local process may call this service").Len())
	assert.Equal(t, 1, logs.FilterMessage("service started").Len())
	assert.Equal(t, 1, logs.FilterMessage("service stopped").Len())
}

// TestNoBrokerWithoutRoutes: a service that names no route never dials the broker, so a broker
// down cannot stop it; and the plaintext warning says what the Spec says.
func TestNoBrokerWithoutRoutes(t *testing.T) {
	cfg := testSettings(t)
	cfg.AMQPURL = "amqp://guest:guest@127.0.0.1:1/" // nothing listens there
	newLogger, logs := observed()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	err := run(ctx, "svc", Spec{PlaintextWarning: "calls to the peers are plaintext"}, cfg, func(_ context.Context, k *Kit, _ settings) error {
		assert.Nil(t, k.Broker)
		stop()
		return nil
	}, newLogger)
	require.NoError(t, err)
	assert.Equal(t, 1, logs.FilterMessage("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): calls to the peers are plaintext").Len())
}

// TestSecretKeysFailBeforeAnyConnection: settings embedding config.SecretKeys give the Kit its
// box; a malformed key stops the start before Postgres is dialled, naming the variable.
func TestSecretKeysFailBeforeAnyConnection(t *testing.T) {
	t.Parallel()
	cfg := withSecrets{settings: settings{Common: config.Common{LogLevel: "info", DatabaseURL: "postgres://postgres@127.0.0.1:1/none?sslmode=disable"}}}
	cfg.SecretKey = "not base64 of 32 bytes"
	newLogger, _ := observed()
	err := run(context.Background(), "svc", Spec{}, cfg, func(context.Context, *Kit, withSecrets) error {
		t.Error("wired despite a malformed key")
		return nil
	}, newLogger)
	require.ErrorContains(t, err, "INTEGRATIONS_SECRET_KEY")
}

// TestWhatTheSettingsEmbedReachesTheKit: internal mTLS on, the service's identity is loaded (and
// no warning logged); settings embedding config.PublicTLS and config.SecretKeys give the Kit the
// client-facing certificate and the box.
func TestWhatTheSettingsEmbedReachesTheKit(t *testing.T) {
	dir := t.TempDir()
	_, err := devca.Ensure(dir, "svc")
	require.NoError(t, err)
	cfg := withSecretsAndPublic{settings: testSettings(t)}
	cfg.InternalTLS = config.InternalTLS{TLSCertFile: devca.CertFile(dir, "svc"), TLSKeyFile: devca.KeyFile(dir, "svc"), TLSCAFile: devca.CAFile(dir)}
	cfg.PublicCertFile, cfg.PublicKeyFile = devca.CertFile(dir, devca.Public), devca.KeyFile(dir, devca.Public)
	cfg.SecretKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // 32 bytes
	newLogger, logs := observed()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	require.NoError(t, run(ctx, "svc", Spec{}, cfg, func(_ context.Context, k *Kit, _ withSecretsAndPublic) error {
		assert.True(t, k.Internal.Enabled())
		assert.NotNil(t, k.Public)
		assert.NotNil(t, k.Box)
		stop()
		return nil
	}, newLogger))
	assert.Zero(t, logs.FilterMessageSnippet("internal mTLS is off").Len())
}

// TestWiringFailureStopsTheStart: the wiring's error is Run's, and nothing is served.
func TestWiringFailureStopsTheStart(t *testing.T) {
	cfg := testSettings(t)
	newLogger, logs := observed()
	boom := errors.New("boom")
	var k *Kit
	err := run(context.Background(), "svc", Spec{}, cfg, func(_ context.Context, kit *Kit, _ settings) error {
		k = kit
		return boom
	}, newLogger)
	require.ErrorIs(t, err, boom)
	assert.Zero(t, logs.FilterMessage("service started").Len())
	k.Pool.Close() // the process would exit here
}
