// Package service runs what every platform service does before and after its own wiring — the
// prelude and the shutdown's fixed tail — so that a service's main holds only what is its own:
//
//	func main() { service.Main("settlement", service.Spec{}, wire) }
//
//	func wire(ctx context.Context, k *service.Kit, cfg config.Config) error {
//		conn, err := k.Dial("dispatcher", cfg.DispatcherAddr)
//		… build the service's parts on k.Pool, k.Broker, conn; register them on k.App …
//		return srv.Run(k.App, "grpc", cfg.GRPCAddr)
//	}
//
// The prelude, in this order: the settings (config.Load, failing with the variable's name); the
// secret box, when the settings embed config.SecretKeys; the logger; tracing (before any server
// or client is built: they trace only if it is on by then); the Postgres pool and the autovacuum
// warning; the broker, with the routes declared, when the Spec names any; the internal mTLS
// identity (and a warning when it is off); the client-facing certificate, when the settings embed
// config.PublicTLS; the lifecycle App. Then the wiring; then the metrics server, served last; then
// App.Run.
//
// The shutdown closes, in this order: the broker (it feeds the work), what the wiring registered
// with k.App.Close or CloseContext, the adapter pool (k.Adapters), the peer connections (k.Dial)
// in the order dialled, the Postgres pool; and last flushes the spans still buffered, so that
// those of the closes go out too.
package service

import (
	"cmp"
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/version"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// Settings is a service's settings struct: it embeds config.Common and config.InternalTLS.
// Embedding config.PublicTLS gives the Kit the client-facing certificate (Kit.Public);
// config.SecretKeys, the secret box (Kit.Box).
type Settings interface {
	Shared() config.Common
	InternalFiles() tlsx.Files
}

// Spec is what differs from one service's prelude to another's.
type Spec struct {
	// Routes are declared on the broker, which is dialled only for a service that names one.
	Routes []mq.Route
	// AsyncCommit makes the pool's commits not wait for the disk (db.AsyncCommit): for a service
	// whose writes, if a Postgres crash lost them, could only send a message again.
	AsyncCommit bool
	// MaxConns sizes the pool when INTEGRATIONS_DATABASE_MAX_CONNS leaves it (0); 0 keeps the
	// URL's pool_max_conns or pgx's default.
	MaxConns int
	// PlaintextWarning is logged when internal mTLS is off; empty, it says that any local process
	// may call the service.
	PlaintextWarning string
}

// Wiring builds a service's own parts on the Kit and registers them on k.App.
type Wiring[C Settings] func(ctx context.Context, k *Kit, cfg C) error

// Kit is what the prelude built, for the wiring.
type Kit struct {
	Log *zap.Logger
	App *lifecycle.App
	// Pool is the Postgres pool; closed after everything else.
	Pool *pgxpool.Pool
	// Broker is the message port, with the Spec's routes declared; nil if the Spec names none.
	Broker mq.Broker
	// Internal is the service's identity on the internal hops; nil when mTLS is off.
	Internal *grpcx.Internal
	// Public is the client-facing certificate; nil when the settings have none (plaintext).
	Public *tlsx.Source
	// Box seals and opens webhook signing secrets; nil unless the settings embed config.SecretKeys.
	Box *secret.Box

	shared   config.Common
	adapters *adaptercall.Pool
	conns    []peerConn
}

type peerConn struct {
	name string
	conn *grpc.ClientConn
}

// Main runs the service named name and exits: it prints the release for --version, and on a
// failure prints "name: error" on stderr and exits 1.
func Main[C Settings](name string, spec Spec, wire Wiring[C]) {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line(name))
		return
	}
	if err := Run(context.Background(), name, spec, wire); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Run loads the settings, runs the prelude, the wiring and the service until it stops (see the
// package comment), and returns the first failure.
func Run[C Settings](ctx context.Context, name string, spec Spec, wire Wiring[C]) error {
	cfg, err := config.Load[C]()
	if err != nil {
		return err
	}
	return run(ctx, name, spec, cfg, wire, log.New)
}

// run is Run on settings already loaded, with the logger's constructor a test replaces.
func run[C Settings](ctx context.Context, name string, spec Spec, cfg C, wire Wiring[C],
	newLogger func(service, level string) (*zap.Logger, error)) error {
	k := &Kit{shared: cfg.Shared()}
	if keys, ok := any(cfg).(interface{ Box() (*secret.Box, error) }); ok {
		box, err := keys.Box()
		if err != nil {
			return err
		}
		k.Box = box
	}
	logger, err := newLogger(name, k.shared.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	k.Log = logger
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(ctx, name, logger)
	if err != nil {
		return err
	}
	if err := k.openDependencies(ctx, spec); err != nil {
		return err
	}
	if err := k.loadIdentities(name, spec, cfg); err != nil {
		return err
	}
	k.App = lifecycle.New(logger, k.shared.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	k.App.Flush("spans", flushSpans)
	if k.Broker != nil {
		k.App.CloseContext("broker", k.Broker.CloseContext)
	}

	if err := wire(ctx, k, cfg); err != nil {
		return err
	}

	// Closed after the wiring's own closers: what the wiring built uses them.
	if k.adapters != nil {
		k.App.Close("adapter-conns", k.adapters.Close)
	}
	for _, c := range k.conns {
		k.App.Close(c.name, c.conn.Close)
	}
	k.App.Close("postgres", func() error { k.Pool.Close(); return nil })
	if err := metrics.Serve(k.App, logger, k.shared.MetricsAddr, metrics.Options{Pprof: k.shared.Pprof}); err != nil {
		return err
	}
	return k.App.Run(ctx)
}

// openDependencies opens the Postgres pool, warns if its server runs without autovacuum, and
// dials the broker when the Spec names routes, declaring them.
func (k *Kit) openDependencies(ctx context.Context, spec Spec) error {
	maxConns := cmp.Or(k.shared.DatabaseMaxConns, spec.MaxConns)
	opts := []db.Option{db.MaxConns(maxConns)}
	if spec.AsyncCommit {
		opts = append(opts, db.AsyncCommit())
	}
	pool, err := db.Open(ctx, k.shared.DatabaseURL, opts...)
	if err != nil {
		return err
	}
	k.Pool = pool
	db.WarnIfAutovacuumOff(ctx, pool, k.Log)
	if len(spec.Routes) == 0 {
		return nil
	}
	brokerCfg := k.BrokerConfig()
	brokerCfg.Registerer = prometheus.DefaultRegisterer
	broker, err := mq.Dial(ctx, brokerCfg)
	if err != nil {
		return err
	}
	k.Broker = broker
	return broker.Declare(ctx, spec.Routes...)
}

// loadIdentities loads the internal mTLS identity of the service named name and, if the settings
// have one, the client-facing certificate.
func (k *Kit) loadIdentities(name string, spec Spec, cfg Settings) error {
	internal, err := grpcx.ServiceIdentity(name, cfg.InternalFiles(), k.Log)
	if err != nil {
		return err
	}
	k.Internal = internal
	if !internal.Enabled() {
		warning := cmp.Or(spec.PlaintextWarning, "any local process may call this service")
		k.Log.Warn("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): " + warning)
	}
	if public, ok := cfg.(interface {
		PublicSource(...tlsx.Option) (*tlsx.Source, error)
	}); ok {
		k.Public, err = public.PublicSource(grpcx.LogReloads(k.Log))
		if err != nil {
			return err
		}
	}
	return nil
}

// BrokerConfig is the message port's settings (INTEGRATIONS_BROKER and its URL, the queue scope,
// the time scale), registering no metrics: for a client of the broker beside Kit.Broker.
func (k *Kit) BrokerConfig() mq.Config {
	c := k.shared
	return mq.Config{Provider: c.Broker, URL: c.BrokerURL(), Scope: c.QueueScope, TimeScale: c.TimeScale, Logger: k.Log}
}

// Dial returns a connection to the platform service peer at addr over the internal hops (mTLS
// with the service's identity, unless it is off), closed at shutdown as "<peer>-conn", after the
// wiring's own closers, in the order dialled.
func (k *Kit) Dial(peer, addr string) (*grpc.ClientConn, error) {
	conn, err := grpcx.Dial(addr, k.Internal.DialOption(peer))
	if err != nil {
		return nil, err
	}
	k.conns = append(k.conns, peerConn{name: peer + "-conn", conn: conn})
	return conn, nil
}

// Adapters returns the pool of connections to adapters, every call carrying the platform's token
// signed with the key platform names; closed at shutdown as "adapter-conns", after the wiring's
// own closers and before the peer connections. A service has one such pool: call it once.
func (k *Kit) Adapters(platform platformtoken.SignerConfig) (*adaptercall.Pool, error) {
	signer, err := platform.Signer()
	if err != nil {
		return nil, err
	}
	k.adapters = adaptercall.NewPool(adaptercall.WithSigner(signer))
	return k.adapters, nil
}

// InternalServer returns a gRPC server for the platform's own callers: mTLS with the service's
// identity, the policy saying which services may call which methods (an empty one serves health
// only).
func (k *Kit) InternalServer(policy grpcx.Policy) *grpcx.Server {
	return grpcx.NewServer(grpcx.ServerConfig{Logger: k.Log, Reflection: k.shared.GRPCReflection, Internal: k.Internal, Policy: policy})
}

// PublicServer returns a client-facing gRPC server: sc with the Kit's logger, the reflection
// setting and the client-facing certificate (plaintext without one).
func (k *Kit) PublicServer(sc grpcx.ServerConfig) *grpcx.Server {
	sc.Logger, sc.Reflection, sc.Public = k.Log, k.shared.GRPCReflection, grpcx.PublicCredentials(k.Public)
	return grpcx.NewServer(sc)
}
