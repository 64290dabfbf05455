// Command execution-consumer runs async attempts (hop 3 of the flow): it takes dispatch messages
// from the executions queue, starts each attempt with one compare of status and attempt number,
// calls the adapter, and reports the outcome to the settlement service.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db"
	dispatcherv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/dispatcher/v1"
	settlementv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/settlement/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/nudge"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/version"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/attempt"
	svcconfig "github.com/integrations-platform/integrations/services/execution-consumer/internal/config"
	"github.com/integrations-platform/integrations/services/execution-consumer/internal/store"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("execution-consumer"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "execution-consumer:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load[svcconfig.Config]()
	if err != nil {
		return err
	}
	logger, err := log.New("execution-consumer", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	ctx := context.Background()
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(ctx, "execution-consumer", logger)
	if err != nil {
		return err
	}

	pool, err := db.Open(ctx, cfg.DatabaseURL, db.MaxConns(cfg.DatabaseMaxConns))
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
	internal, err := grpcx.ServiceIdentity("execution-consumer", cfg.InternalFiles(), logger)
	if err != nil {
		return err
	}
	if !internal.Enabled() {
		logger.Warn("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): any local process may call this service")
	}
	settlementConn, err := grpcx.Dial(cfg.SettlementAddr, internal.DialOption("settlement"))
	if err != nil {
		return err
	}
	dispatcherConn, err := grpcx.Dial(cfg.DispatcherAddr, internal.DialOption("dispatcher"))
	if err != nil {
		return err
	}
	signer, err := cfg.Platform.Signer()
	if err != nil {
		return err
	}
	adapters := adaptercall.NewPool(adaptercall.WithSigner(signer))
	// An arrival early by less than the delay tolerance, time-scaled as the other delays are
	// (50 ms unscaled), starts its attempt rather than being held or deferred for the rest. Not
	// the broker's floored tolerance (at least 5 ms): that one only makes a message arrive late,
	// and in a time-scaled run 5 ms is a large part of a scaled retry delay.
	st := store.New(pool).WithEarlyTolerance(cfg.Scale(mq.DelayTolerance))
	handler := attempt.New(st, adapters, settlementv1.NewSettlementServiceClient(settlementConn), cfg.Scale, logger).
		WithNudge(nudge.Dispatcher(dispatcherv1.NewDispatcherServiceClient(dispatcherConn), logger))

	app := lifecycle.New(logger, cfg.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	app.Flush("spans", flushSpans)
	// Health only: the empty Policy refuses every other method.
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: logger, Reflection: cfg.GRPCReflection, Internal: internal, Policy: grpcx.Policy{}})
	if err := srv.Run(app, "grpc", cfg.GRPCAddr); err != nil {
		return err
	}
	if err := metrics.ServeWith(app, logger, cfg.MetricsAddr, metrics.Options{Pprof: cfg.Pprof}); err != nil {
		return err
	}
	// On SIGTERM, after the drain window, the consumer stops taking dispatches and the attempts
	// in flight — adapter calls included — finish until the soft timeout: a deploy neither cuts an
	// adapter call nor leaves an attempt to wait out its lease.
	app.Drain("consume-executions", func(take, work context.Context) error {
		return broker.Consume(take, routes.Executions.Name, cfg.Concurrency, handler.Handle, mq.Drain(work, app.Grace()))
	})
	app.CloseContext("broker", broker.CloseContext)
	app.Close("adapter-conns", adapters.Close)
	app.Close("settlement-conn", settlementConn.Close)
	app.Close("dispatcher-conn", dispatcherConn.Close)
	app.Close("postgres", func() error { pool.Close(); return nil })
	return app.Run(ctx)
}
