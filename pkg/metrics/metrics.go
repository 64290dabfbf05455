// Package metrics serves Prometheus metrics. Every service registers its collectors on the
// default registry and serves them with Serve.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/lifecycle"
)

// Serve exposes /metrics on addr under app. An empty addr serves nothing.
func Serve(app *lifecycle.App, log *zap.Logger, addr string) error {
	if addr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s for metrics: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("metrics listening", zap.String("addr", lis.Addr().String()))
	app.Serve("metrics",
		func() error {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve metrics: %w", err)
			}
			return nil
		},
		func(ctx context.Context) error { return srv.Shutdown(ctx) })
	return nil
}
