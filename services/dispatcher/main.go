// Command dispatcher moves dispatch records from Postgres to the executions queue (hop 2 of the
// flow): claimed with SKIP LOCKED and a claim expiry once they are due within the route's largest
// delay level, published into the delay level that holds each until it is due, with publisher
// confirms, deleted once confirmed. It passes on a schedule, when the next record comes within
// reach, and when the gateway or settlement nudges it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db"
	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/version"
	svcconfig "github.com/integrations-platform/integrations/services/dispatcher/internal/config"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/dispatch"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/store"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("dispatcher"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load[svcconfig.Config]()
	if err != nil {
		return err
	}
	logger, err := log.New("dispatcher", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	ctx := context.Background()
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(ctx, "dispatcher", logger)
	if err != nil {
		return err
	}

	// The dispatcher writes only claims and deletions of published records: losing them in a
	// Postgres crash publishes a dispatch twice, which the consumer's compare makes harmless, so
	// its commits do not wait for the disk (db.AsyncCommit).
	pool, err := db.Open(ctx, cfg.DatabaseURL, db.MaxConns(cfg.DatabaseMaxConns), db.AsyncCommit())
	if err != nil {
		return err
	}
	db.WarnIfAutovacuumOff(ctx, pool, logger)
	broker, err := mq.Dial(ctx, mq.Config{Provider: cfg.Broker, URL: cfg.BrokerURL(), Scope: cfg.QueueScope, TimeScale: cfg.TimeScale,
		Logger: logger, Registerer: prometheus.DefaultRegisterer})
	if err != nil {
		return err
	}
	if err := broker.Declare(ctx, routes.Executions); err != nil {
		return err
	}
	app := lifecycle.New(logger, cfg.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	app.Flush("spans", flushSpans)
	// Records due within the largest delay level are published into the broker's holding queues;
	// later ones wait in Postgres.
	var horizon time.Duration
	if levels := broker.DelayLevels(routes.Executions.Name); len(levels) > 0 {
		horizon = levels[len(levels)-1]
	}
	d := dispatch.New(store.New(pool), broker, logger, dispatch.Config{
		Interval: cfg.Interval, ClaimTTL: cfg.ClaimTTL, Horizon: horizon, BatchSize: cfg.BatchSize,
	})

	internal, err := grpcx.ServiceIdentity("dispatcher", cfg.InternalFiles(), logger)
	if err != nil {
		return err
	}
	if !internal.Enabled() {
		logger.Warn("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): any local process may call this service")
	}
	// Nudged by the gateway (a new dispatch), settlement (a next attempt) and the consumer (a
	// dispatch rescheduled after its adapter was unreachable).
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: logger, Reflection: cfg.GRPCReflection, Internal: internal, Policy: grpcx.Policy{
		dispatcherv1.DispatcherService_Nudge_FullMethodName: {"gateway", "settlement", "execution-consumer"},
	}})
	dispatcherv1.RegisterDispatcherServiceServer(srv, d)
	if err := srv.Run(app, "grpc", cfg.GRPCAddr); err != nil {
		return err
	}
	if err := metrics.ServeWith(app, logger, cfg.MetricsAddr, metrics.Options{Pprof: cfg.Pprof}); err != nil {
		return err
	}
	app.Go("dispatch-loop", d.Run)
	app.Go("dead-letter recovery", dispatch.NewRecoverer(store.New(pool), broker, logger, cfg.RecoverEvery()).Run)
	app.CloseContext("broker", broker.CloseContext)
	app.Close("postgres", func() error { pool.Close(); return nil })
	return app.Run(ctx)
}
