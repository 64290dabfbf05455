// Command event-router relays completion events from the Postgres outbox to the broker and
// delivers each to the invoking application's consumer (hop 6 of the flow).
package main

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/version"
	svcconfig "github.com/integrations-platform/integrations/services/event-router/internal/config"
	"github.com/integrations-platform/integrations/services/event-router/internal/deliver"
	"github.com/integrations-platform/integrations/services/event-router/internal/relay"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("event-router"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "event-router:", err)
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
	logger, err := log.New("event-router", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	ctx := context.Background()
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(ctx, "event-router", logger)
	if err != nil {
		return err
	}

	// Everything the router writes — relay claims and marks, delivery claims, the records of
	// delivery attempts — only sends a notice or a webhook again if a Postgres crash loses it (a
	// lost record leaves the event pending; receivers deduplicate by webhook-id), so its commits
	// do not wait for the disk (db.AsyncCommit). The events themselves are written durably by the
	// settlement service, in the transaction that settles their execution.
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
	if err := broker.Declare(ctx, routes.Events); err != nil {
		return err
	}
	st := store.New(pool)
	// The events route's port-level budget, as the port applies it (floored: routes.BlipFloor),
	// sizes how soon a notice may be taken for lost.
	_, noticeBudget, err := mq.RetryDelays(routes.Events, cfg.TimeScale)
	if err != nil {
		return err
	}
	levels := broker.DelayLevels(routes.Events.Name)
	del := deliver.New(st, box, deliver.Config{
		Delays:       cfg.ScaledRetryDelays(),
		Timeout:      cfg.DeliveryTimeout,
		AllowPrivate: cfg.WebhookAllowPrivate,
		Deny:         cfg.WebhookDeny(),
		// Go's own resolver: consumer names are dialled rooted ("name.", never under the search
		// domains), and Go matches a rooted name to its /etc/hosts entry where the C library's
		// resolver does not.
		Resolver:     &net.Resolver{PreferGo: true},
		PerApp:       cfg.PerAppConcurrency,
		Busy:         levels[0],
		BusyPatience: cfg.PerAppPatience,
		TimeScale:    cfg.TimeScale,
	}, logger)
	// The relay hands freshly relayed events to this process's deliverer (its claim is their
	// delivery claim): Concurrency workers beside the broker consumer's, a queue of twice that;
	// what does not fit is published as before.
	local := del.Local(broker, routes.Events.Name, 2*cfg.Concurrency)
	rel := relay.New(st, broker, logger, relay.Options{
		Handoff:      local,
		Interval:     cfg.RelayInterval,
		StaleAfter:   cfg.StaleAfter(noticeBudget),
		RecoverEvery: cfg.RecoverEvery(),
		DeadLetters:  broker,
		NoticeBudget: noticeBudget,
		ClaimTTL:     cfg.RelayClaimTTL(relay.DefaultClaimTTL),
	})

	app := lifecycle.New(logger, cfg.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	app.Flush("spans", flushSpans)
	internal, err := grpcx.ServiceIdentity("event-router", cfg.InternalFiles(), logger)
	if err != nil {
		return err
	}
	if !internal.Enabled() {
		logger.Warn("internal mTLS is off (INTEGRATIONS_INTERNAL_PLAINTEXT): any local process may call this service")
	}
	// Health only: the empty Policy refuses every other method.
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: logger, Reflection: cfg.GRPCReflection, Internal: internal, Policy: grpcx.Policy{}})
	if err := srv.Run(app, "grpc", cfg.GRPCAddr); err != nil {
		return err
	}
	if err := metrics.ServeWith(app, logger, cfg.MetricsAddr, metrics.Options{Pprof: cfg.Pprof}); err != nil {
		return err
	}
	app.Go("relay", rel.Run)
	// Deliveries in flight finish (until the soft timeout) rather than being cut and sent again.
	app.Drain("deliver", func(take, work context.Context) error {
		return broker.Consume(take, routes.Events.Name, cfg.Concurrency, del.Handle, mq.Drain(work, app.Grace()))
	})
	app.Drain("deliver in process", func(take, work context.Context) error {
		return local.Run(take, work, cfg.Concurrency)
	})
	app.CloseContext("broker", broker.CloseContext)
	app.Close("consumer connections", del.Close)
	app.Close("postgres", func() error { pool.Close(); return nil })
	return app.Run(ctx)
}
