// Package metrics serves Prometheus metrics. Every service registers its collectors on the
// default registry and serves them with Serve.
package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/lifecycle"
)

// Options are the optional parts of the metrics listener.
type Options struct {
	// Pprof also serves net/http/pprof under /debug/pprof/ (for profiling, e.g. a benchmark; off
	// by default: profiles expose internals and cost CPU while taken).
	Pprof bool
}

// Serve exposes /metrics on addr under app. An empty addr serves nothing.
func Serve(app *lifecycle.App, log *zap.Logger, addr string, o Options) error {
	if addr == "" {
		if o.Pprof {
			return errors.New("pprof needs a metrics address (INTEGRATIONS_METRICS_ADDR)")
		}
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s for metrics: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	if o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		log.Warn("pprof enabled on the metrics listener", zap.String("path", "/debug/pprof/"))
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("metrics listening", zap.String("addr", lis.Addr().String()))
	app.HTTP("metrics", srv, lis)
	return nil
}
