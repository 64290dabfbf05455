// Command adapter-callback serves the callbacks adapters make for long-running work (hop 4 of the
// flow): lease renewals, progress, and completion.
package main

import (
	"context"
	"fmt"
	"os"

	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/version"
	svcconfig "github.com/integrations-platform/integrations/services/adapter-callback/internal/config"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/server"
	"github.com/integrations-platform/integrations/services/adapter-callback/internal/store"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("adapter-callback"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "adapter-callback:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load[svcconfig.Config]()
	if err != nil {
		return err
	}
	logger, err := log.New("adapter-callback", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	ctx := context.Background()
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(ctx, "adapter-callback", logger)
	if err != nil {
		return err
	}

	pool, err := db.Open(ctx, cfg.DatabaseURL, db.MaxConns(cfg.DatabaseMaxConns))
	if err != nil {
		return err
	}
	db.WarnIfAutovacuumOff(ctx, pool, logger)
	internal, err := grpcx.ServiceIdentity("adapter-callback", cfg.InternalFiles(), logger)
	if err != nil {
		return err
	}
	if !internal.Enabled() {
		logger.Warn("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): any local process may call this service")
	}
	publicTLS, err := cfg.PublicSource(grpcx.LogReloads(logger))
	if err != nil {
		return err
	}
	settlementConn, err := grpcx.Dial(cfg.SettlementAddr, internal.DialOption("settlement"))
	if err != nil {
		return err
	}
	app := lifecycle.New(logger, cfg.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	app.Flush("spans", flushSpans)
	app.Close("settlement-conn", settlementConn.Close)
	app.Close("postgres", func() error { pool.Close(); return nil })

	st := store.New(pool)
	// Client-facing: adapters call it with their credential, over TLS when a certificate is set.
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: logger, Reflection: cfg.GRPCReflection, Public: grpcx.PublicCredentials(publicTLS), Interceptors: []grpc.UnaryServerInterceptor{server.AuthInterceptor(st)}})
	adapterv1.RegisterAdapterCallbackServiceServer(srv, server.New(st, settlementv1.NewSettlementServiceClient(settlementConn), cfg.Scale, logger))
	if err := srv.Run(app, "grpc", cfg.GRPCAddr); err != nil {
		return err
	}
	if err := metrics.ServeWith(app, logger, cfg.MetricsAddr, metrics.Options{Pprof: cfg.Pprof}); err != nil {
		return err
	}
	return app.Run(ctx)
}
