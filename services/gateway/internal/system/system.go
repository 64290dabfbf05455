// Package system serves the gateway's operator endpoints under /api/v1/system/, authenticated
// with the deployment's admin token.
package system

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
)

// DiagnosticPath is the broker round-trip diagnostic.
const DiagnosticPath = "/api/v1/system/mq-diagnostic"

// Config configures the system endpoints.
type Config struct {
	// AdminToken authenticates operators (Authorization: Bearer <token>); empty disables the
	// endpoints.
	AdminToken string
	// Broker is how to reach RabbitMQ. The gateway itself does not use the broker, so it connects
	// only for a diagnostic: a broker outage never stops it from accepting executions.
	Broker mq.Config
	// Timeout bounds each route's round trip.
	Timeout time.Duration
	Logger  *zap.Logger
}

// Handlers returns the system routes.
func Handlers(cfg Config) map[string]http.Handler {
	return map[string]http.Handler{DiagnosticPath: admin(cfg.AdminToken, diagnostic(cfg))}
}

func admin(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			http.Error(w, "system endpoints are disabled: set INTEGRATIONS_ADMIN_TOKEN", http.StatusForbidden)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			http.Error(w, "missing or wrong admin token (Authorization: Bearer <INTEGRATIONS_ADMIN_TOKEN>)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// diagnostic answers one line per configured route: a publish + consume round trip through the
// route's work queue, its queues' presence, depths and this process's durability counters.
func diagnostic(cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 3*cfg.Timeout+5*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		b, err := mq.Dial(ctx, cfg.Broker)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "broker FAIL: %v\n", err)
			return
		}
		defer func() { _ = b.Close() }()
		results := b.Diagnose(ctx, []mq.Route{routes.Executions, routes.Events}, cfg.Timeout)
		code := http.StatusOK
		for _, d := range results {
			if !d.OK {
				code = http.StatusServiceUnavailable
			}
		}
		w.WriteHeader(code)
		for _, d := range results {
			fmt.Fprintln(w, d.String())
		}
		cfg.Logger.Info("mq diagnostic run", zap.Int("routes", len(results)), zap.Int("status", code))
	})
}
