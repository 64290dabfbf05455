// Command dummy-adapter is the reference adapter, built with sdk/go/adapter: it serves capability
// dummy.echo, whose behaviour a test scripts through the payload (see cmd/internal/dummy).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/integrations-platform/integrations/cmd/internal/dummy"
	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/version"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("dummy-adapter"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dummy-adapter:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load[dummy.Config]()
	if err != nil {
		return err
	}
	logger, err := log.New("dummy-adapter", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	// Before any server or client is built: they trace only if tracing is on by then.
	flushSpans, err := telemetry.Setup(context.Background(), "dummy-adapter", logger)
	if err != nil {
		return err
	}

	journal, err := dummy.OpenJournal(cfg.Journal)
	if err != nil {
		return err
	}
	defer func() { _ = journal.Close() }()

	keys, err := cfg.Platform.Keys()
	if err != nil {
		return err
	}
	// The callback client traces and counts its calls as the platform's own clients do.
	callbackDial := grpcx.ClientOptions()
	if cfg.CallbackTLS || cfg.CallbackCAFile != "" {
		opt, err := grpcx.PublicDialOption(cfg.CallbackCAFile)
		if err != nil {
			return fmt.Errorf("INTEGRATIONS_CALLBACK_CA_FILE: %w", err)
		}
		callbackDial = append(callbackDial, opt)
	}
	app := lifecycle.New(logger, cfg.Shutdown())
	// The spans still buffered go out last, after every close (see lifecycle.App.Flush).
	app.Flush("spans", flushSpans)
	ad, err := adapter.New(dummy.NewHandler(logger, journal), adapter.Options{
		CallbackAddr: cfg.CallbackAddr, Credential: cfg.Credential, Logger: logger, DialOptions: callbackDial,
		AdapterID: cfg.AdapterID, PlatformKeys: keys,
	})
	if err != nil {
		return err
	}
	// Background work stops after the gRPC server stopped taking calls: it is cancelled and
	// reports a retryable failure, so the next attempt need not wait for its lease to expire.
	app.Go("background-work", func(ctx context.Context) error {
		<-ctx.Done()
		return ad.Close()
	})

	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: logger})
	ad.Register(srv)
	if err := srv.Run(app, "grpc", cfg.Addr); err != nil {
		return err
	}
	if err := metrics.Serve(app, logger, cfg.MetricsAddr, metrics.Options{}); err != nil {
		return err
	}
	return app.Run(context.Background())
}
