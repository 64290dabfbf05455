// Command gateway is the client applications' entry point (hop 1 of the flow): it validates and
// authenticates invocations, commits async executions with their first dispatch record in one
// transaction, runs sync executions inline, and serves reads — over gRPC and REST.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db"
	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/version"
	svcconfig "github.com/integrations-platform/integrations/services/gateway/internal/config"
	"github.com/integrations-platform/integrations/services/gateway/internal/console"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
	"github.com/integrations-platform/integrations/services/gateway/internal/system"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("gateway"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load[svcconfig.Config]()
	if err != nil {
		return err
	}
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", cfg.SecretKey, cfg.SecretKeyPrevious)
	if err != nil {
		return err
	}
	logger, err := log.New("gateway", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	if warning, _ := cfg.CheckAdminToken(); warning != "" { // off loopback, Validate refused it
		logger.Warn("weak admin token allowed on loopback", zap.String("problem", warning))
	}
	ctx := context.Background()
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(ctx, "gateway", logger)
	if err != nil {
		return err
	}

	// Every accept is a few round trips on its own connection: pgx's default pool (4 on a 2-core
	// host) capped accept throughput in the benchmark (docs/benchmarks.md), so the gateway
	// defaults to 16.
	maxConns := cfg.DatabaseMaxConns
	if maxConns == 0 {
		maxConns = 16
	}
	pool, err := db.Open(ctx, cfg.DatabaseURL, db.MaxConns(maxConns))
	if err != nil {
		return err
	}
	db.WarnIfAutovacuumOff(ctx, pool, logger)
	app := lifecycle.New(logger, cfg.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	app.Flush("spans", flushSpans)
	internal, err := grpcx.ServiceIdentity("gateway", cfg.InternalFiles(), logger)
	if err != nil {
		return err
	}
	if !internal.Enabled() {
		logger.Warn("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): calls to settlement and the dispatcher are plaintext")
	}
	publicTLS, err := cfg.PublicSource(grpcx.LogReloads(logger))
	if err != nil {
		return err
	}
	dispatcherConn, err := grpcx.Dial(cfg.DispatcherAddr, internal.DialOption("dispatcher"))
	if err != nil {
		return err
	}
	settlementConn, err := grpcx.Dial(cfg.SettlementAddr, internal.DialOption("settlement"))
	if err != nil {
		return err
	}
	signer, err := cfg.Platform.Signer()
	if err != nil {
		return err
	}
	adapters := adaptercall.NewPool(adaptercall.WithSigner(signer))

	// A key's last use is written at most once a minute per key and replica, off the accept path.
	st := store.New(pool).WithCache(cfg.CacheTTL).WithLastUsed(time.Minute)
	// Catalog keys are judged by catalog apply, where they are seen in clear; the rule is the
	// admin token's.
	weakApps, err := st.WeakCatalogKeys(ctx)
	if err != nil {
		return err
	}
	warning, err := cfg.CheckCatalogKeys(weakApps)
	if err != nil {
		return err
	}
	if warning != "" {
		logger.Warn("weak catalog key allowed on loopback", zap.String("problem", warning))
	}
	// A key declared by its hash is never judged: the operator is told which ones at each start.
	unjudged, err := st.UnjudgedCatalogKeys(ctx)
	if err != nil {
		return err
	}
	if len(unjudged) > 0 {
		logger.Warn("catalog keys of unknown strength: declared by their hash (or applied before migration 00021), never seen in clear; make sure each is 32 random bytes",
			zap.Strings("applications", unjudged))
	}
	app.Go("api-key-last-used", func(ctx context.Context) error { return st.RunLastUsed(ctx, logger) })
	// Rate limits: each replica holds limit ÷ live replicas, counted by a heartbeat (beaten once
	// here so that a replica joining a running fleet starts with its share, not the whole limit).
	replicas := ratelimit.NewReplicas(pool, cfg.RateLimitHeartbeat, logger)
	if err := replicas.Beat(ctx); err != nil {
		logger.Warn("rate limits: replicas not counted yet", zap.Error(err))
	}
	app.Go("replica-heartbeat", func(ctx context.Context) error { replicas.Run(ctx); return nil })
	limiter := ratelimit.New(ratelimit.NewSource(pool, cfg.RateLimits(), cfg.CacheTTL).Limits, replicas.Count)
	gate := server.NewRateGate(limiter, cfg.RateLimitRefusalDelay, server.MaxHeldPerApplication)
	// Failed authentications, counted per source address and key id by every surface that takes
	// a credential (gRPC, REST, the console's sign-in, the operator endpoints), each replica
	// holding its share like the rate limits.
	fails := ratelimit.NewFailures(cfg.AuthFailureBurst, cfg.AuthFailureWindow, replicas.Count, logger)
	// The gRPC limit leaves room for the envelope around a payload of the largest size allowed,
	// so that an oversized payload is refused by validation with a message naming the field.
	srv := grpcx.NewServer(grpcx.ServerConfig{
		Logger:         logger,
		Reflection:     cfg.GRPCReflection,
		Public:         grpcx.PublicCredentials(publicTLS),
		MaxRecvMsgSize: 2*cfg.MaxPayloadBytes + 64<<10,
		// A call over its limit is held (and one waiting for its token waits): the bound per
		// connection keeps one connection firing calls without waiting from piling them up.
		MaxConcurrentStreams: 1000,
		Interceptors:         []grpc.UnaryServerInterceptor{server.GuardedAuthInterceptor(st, fails, cfg.AdminToken), gate.Interceptor()},
	})
	gw := server.New(st, adapters,
		dispatcherv1.NewDispatcherServiceClient(dispatcherConn), settlementv1.NewSettlementServiceClient(settlementConn),
		box, server.Options{
			MaxPayloadBytes:     cfg.MaxPayloadBytes,
			Scale:               cfg.Scale,
			WebhookAllowHTTP:    cfg.WebhookAllowHTTP,
			WebhookAllowPrivate: cfg.WebhookAllowPrivate,
			WebhookDeny:         cfg.WebhookDeny(),
			// The courtesy check of consumer names. Go's own resolver, as the event router's:
			// names are looked up rooted ("name."), and Go matches a rooted name to its
			// /etc/hosts entry where the C library's resolver does not.
			Resolver: &net.Resolver{PreferGo: true},
			// Not scaled: receivers switch secrets on the wall clock.
			SecretRotationOverlap: cfg.SecretRotationOverlap,
		}, logger)
	gatewayv1.RegisterGatewayServiceServer(srv, gw)
	// Sync calls are served through the drain window; after it new ones are refused with a
	// retryable UNAVAILABLE (the client goes to another replica), and the calls in flight and
	// their outcome reports are awaited until the soft timeout — a worker's in-flight work — and
	// then, as the first closer, until the hard timeout, before the settlement connection closes.
	// A sync timeout longer than INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT cuts nothing: its report is
	// still awaited, up to INTEGRATIONS_SHUTDOWN_TIMEOUT.
	app.Drain("sync-calls", func(take, work context.Context) error {
		<-take.Done()
		gw.StopSync()
		_ = gw.WaitSync(work)
		return nil
	})
	app.CloseContext("sync-reports", gw.WaitSync)
	// Closed in this order, after the sync calls and reports that use them.
	app.Close("adapter-conns", adapters.Close)
	app.Close("dispatcher-conn", dispatcherConn.Close)
	app.Close("settlement-conn", settlementConn.Close)
	app.Close("postgres", func() error { pool.Close(); return nil })
	sys := system.Config{
		AdminToken: cfg.AdminToken,
		Keys:       st,
		Broker:     mq.Config{Provider: cfg.Broker, URL: cfg.BrokerURL(), Scope: cfg.QueueScope, TimeScale: cfg.TimeScale, Logger: logger},
		Timeout:    2 * time.Second,
		Logger:     logger,
		Failures:   fails,
	}
	extra := system.Handlers(sys)
	// The console calls gw directly with the signed-in caller's identity: it checks its session
	// itself, and gw's methods apply the caller's tenancy as to any API call.
	extra[console.Prefix], err = console.Handler(console.Config{
		API: gw, Store: st, Box: box, AdminToken: cfg.AdminToken, System: sys,
		Secure: publicTLS != nil, SessionTTL: cfg.ConsoleSessionTTL, Logger: logger, Failures: fails,
	})
	if err != nil {
		return err
	}
	// REST is registered first so that it stops first, with the gRPC server: both serve gw.
	if err := httpapi.Run(ctx, app, logger, httpapi.InProcess(gw, srv.Unary()), httpapi.Config{
		Addr: cfg.HTTPAddr, MaxBodyBytes: int64(2*cfg.MaxPayloadBytes + 64<<10),
		ReadHeaderTimeout: cfg.HTTPReadHeaderTimeout, ReadTimeout: cfg.HTTPReadTimeout,
		WriteTimeout: cfg.HTTPWriteTimeout, IdleTimeout: cfg.HTTPIdleTimeout,
		TLS: publicTLS,
		// A request over its rate limit is refused before its body is decoded.
		Precheck: gate.Precheck(st, fails),
		Extra:    extra,
	}); err != nil {
		return err
	}
	if err := srv.Run(app, "grpc", cfg.GRPCAddr); err != nil {
		return err
	}
	if err := metrics.ServeWith(app, logger, cfg.MetricsAddr, metrics.Options{Pprof: cfg.Pprof}); err != nil {
		return err
	}
	return app.Run(ctx)
}
