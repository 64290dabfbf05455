// Command settlement writes each execution's final outcome exactly once, with its completion
// event, in one transaction (hop 5 of the flow), and sweeps running executions whose lease expired
// or whose deadline passed.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db"
	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/version"
	svcconfig "github.com/integrations-platform/integrations/services/settlement/internal/config"
	"github.com/integrations-platform/integrations/services/settlement/internal/server"
	"github.com/integrations-platform/integrations/services/settlement/internal/store"
	"github.com/integrations-platform/integrations/services/settlement/internal/sweeper"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("settlement"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "settlement:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load[svcconfig.Config]()
	if err != nil {
		return err
	}
	logger, err := log.New("settlement", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	ctx := context.Background()
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(ctx, "settlement", logger)
	if err != nil {
		return err
	}

	pool, err := db.Open(ctx, cfg.DatabaseURL, db.MaxConns(cfg.DatabaseMaxConns))
	if err != nil {
		return err
	}
	db.WarnIfAutovacuumOff(ctx, pool, logger)
	internal, err := grpcx.ServiceIdentity("settlement", cfg.InternalFiles(), logger)
	if err != nil {
		return err
	}
	if !internal.Enabled() {
		logger.Warn("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): any local process may call this service")
	}
	dispatcherConn, err := grpcx.Dial(cfg.DispatcherAddr, internal.DialOption("dispatcher"))
	if err != nil {
		return err
	}
	app := lifecycle.New(logger, cfg.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	app.Flush("spans", flushSpans)
	app.Close("dispatcher-conn", dispatcherConn.Close)
	app.Close("postgres", func() error { pool.Close(); return nil })

	st := store.New(pool)
	settlement := server.New(st, dispatcherv1.NewDispatcherServiceClient(dispatcherConn), cfg.Scale, logger)
	// Settling is the callers' of the flow only (the sweeper settles in-process, not over gRPC).
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: logger, Reflection: cfg.GRPCReflection, Internal: internal, Policy: grpcx.Policy{
		settlementv1.SettlementService_Settle_FullMethodName:      {"gateway", "execution-consumer", "adapter-callback"},
		settlementv1.SettlementService_FailAttempt_FullMethodName: {"gateway", "execution-consumer", "adapter-callback"},
	}})
	settlementv1.RegisterSettlementServiceServer(srv, settlement)
	if err := srv.Run(app, "grpc", cfg.GRPCAddr); err != nil {
		return err
	}
	sw := sweeper.New(st, sweeper.Options{Interval: cfg.SweepInterval, Grace: cfg.SweepGrace, Scale: cfg.Scale, Nudge: settlement.Nudge, Logger: logger})
	app.Go("sweeper", sw.Run)
	if err := metrics.ServeWith(app, logger, cfg.MetricsAddr, metrics.Options{Pprof: cfg.Pprof}); err != nil {
		return err
	}
	return app.Run(ctx)
}
