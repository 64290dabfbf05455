// Command demo-consumer is a demo webhook receiver for completion events: POST /events is
// verified with the Standard Webhooks signature and printed as one line per event on stdout
// (logs go to stderr).
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/cmd/internal/democonsumer"
	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/version"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.Line("demo-consumer"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo-consumer:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load[democonsumer.Config]()
	if err != nil {
		return err
	}
	logger, err := log.New("demo-consumer", cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()

	mux := http.NewServeMux()
	mux.Handle("POST /events", democonsumer.New(cfg.SecretSource(), os.Stdout, logger))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Addr, err)
	}
	logger.Info("demo consumer listening", zap.String("addr", lis.Addr().String()))

	app := lifecycle.New(logger, cfg.Shutdown())
	app.HTTP("http", srv, lis)
	return app.Run(context.Background())
}
