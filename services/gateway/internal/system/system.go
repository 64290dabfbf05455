// Package system serves the gateway's operator endpoints under /api/v1/system/, authenticated
// with the deployment's admin token.
package system

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// Operator endpoints.
const (
	// DiagnosticPath is the broker round-trip diagnostic.
	DiagnosticPath = "/api/v1/system/mq-diagnostic"
	// DeadLettersPath lists a route's dead letters: GET ?route=executions&limit=50.
	DeadLettersPath = "/api/v1/system/dead-letters"
	// RedrivePath moves dead letters back to their route's work queue with a fresh attempt budget:
	// POST {"route": "executions", "ids": ["..."]} (no ids: all of them).
	RedrivePath = "/api/v1/system/dead-letters:redrive"
)

// knownRoutes are the routes the endpoints accept.
var knownRoutes = map[string]mq.Route{routes.Executions.Name: routes.Executions, routes.Events.Name: routes.Events}

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
	// Keys serves the API key endpoints (nil: not served).
	Keys   *store.Store
	Logger *zap.Logger
}

// Handlers returns the system routes.
func Handlers(cfg Config) map[string]http.Handler {
	return map[string]http.Handler{
		DiagnosticPath:   admin(cfg.AdminToken, diagnostic(cfg)),
		DeadLettersPath:  admin(cfg.AdminToken, deadLetters(cfg)),
		RedrivePath:      admin(cfg.AdminToken, redrive(cfg)),
		ApplicationsPath: admin(cfg.AdminToken, keys(cfg)),
	}
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

// deadLetter is a dead letter as the API shows it: why it died, not its body (which may hold an
// application's data).
type deadLetter struct {
	ID             string    `json:"id"`
	Reason         string    `json:"reason"`
	LastError      string    `json:"last_error,omitempty"`
	Attempts       int       `json:"attempts"`
	FirstFailureAt time.Time `json:"first_failure_at,omitzero"`
	LastFailureAt  time.Time `json:"last_failure_at,omitzero"`
	DeadAt         time.Time `json:"dead_at,omitzero"`
	SourceQueue    string    `json:"source_queue"`
	BodyBytes      int       `json:"body_bytes"`
}

func deadLetters(cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, http.StatusMethodNotAllowed, "use GET")
			return
		}
		route, ok := knownRoutes[r.URL.Query().Get("route")]
		if !ok {
			writeError(w, http.StatusBadRequest, "route: must be one of executions, events")
			return
		}
		limit := 50
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1000 {
				writeError(w, http.StatusBadRequest, "limit: must be between 1 and 1000")
				return
			}
			limit = n
		}
		withBroker(w, r, cfg, func(ctx context.Context, b *mq.Broker) {
			list, err := b.DeadLetters(ctx, route.Name, limit)
			if err != nil {
				writeError(w, http.StatusServiceUnavailable, err.Error())
				return
			}
			out := make([]deadLetter, 0, len(list))
			for _, d := range list {
				out = append(out, deadLetter{ID: d.ID, Reason: d.Reason, LastError: d.LastError, Attempts: d.Attempts,
					FirstFailureAt: d.FirstFailureAt, LastFailureAt: d.LastFailureAt, DeadAt: d.DeadAt,
					SourceQueue: d.SourceQueue, BodyBytes: len(d.Body)})
			}
			writeJSON(w, http.StatusOK, map[string]any{"route": route.Name, "dead_letters": out})
		})
	})
}

func redrive(cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		var req struct {
			Route string   `json:"route"`
			IDs   []string `json:"ids"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "body: "+err.Error())
			return
		}
		route, ok := knownRoutes[req.Route]
		if !ok {
			writeError(w, http.StatusBadRequest, "route: must be one of executions, events")
			return
		}
		withBroker(w, r, cfg, func(ctx context.Context, b *mq.Broker) {
			moved, err := b.Redrive(ctx, route.Name, req.IDs)
			if err != nil {
				writeError(w, http.StatusServiceUnavailable, err.Error())
				return
			}
			cfg.Logger.Info("dead letters redriven", zap.String("route", route.Name), zap.Int("moved", moved))
			writeJSON(w, http.StatusOK, map[string]any{"route": route.Name, "redriven": moved})
		})
	})
}

// withBroker connects for one request: the gateway holds no broker connection of its own.
func withBroker(w http.ResponseWriter, r *http.Request, cfg Config, fn func(ctx context.Context, b *mq.Broker)) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	b, err := mq.Dial(ctx, cfg.Broker)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "broker: "+err.Error())
		return
	}
	defer func() { _ = b.Close() }()
	fn(ctx, b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"code": code, "message": msg})
}
