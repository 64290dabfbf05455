// Package system serves the gateway's operator endpoints under /api/v1/system/, authenticated
// with the deployment's admin token.
package system

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
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
	// Keys serves the API key endpoints (nil: not served) and holds the audit log every action
	// here is written to (nil: the entries are logged at error as not written).
	Keys   *store.Store
	Logger *zap.Logger
	// Failures limits failed authentications (nil: not limited): a source address that sent
	// wrong admin tokens too often is answered 429 with Retry-After before its token is compared.
	Failures *ratelimit.Failures
}

// Handlers returns the system routes.
func Handlers(cfg Config) map[string]http.Handler {
	return map[string]http.Handler{
		DiagnosticPath:   admin(cfg, diagnostic(cfg)),
		DeadLettersPath:  admin(cfg, deadLetters(cfg)),
		RedrivePath:      admin(cfg, redrive(cfg)),
		ApplicationsPath: admin(cfg, keys(cfg)),
	}
}

func admin(cfg Config, next http.Handler) http.Handler {
	token := cfg.AdminToken
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			http.Error(w, "system endpoints are disabled: set INTEGRATIONS_ADMIN_TOKEN", http.StatusForbidden)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			http.Error(w, "missing or wrong admin token (Authorization: Bearer <INTEGRATIONS_ADMIN_TOKEN>)", http.StatusUnauthorized)
			return
		}
		err := cfg.Failures.Guard(r.Context(), ratelimit.SourceOfRequest(r), got, func() error {
			if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				return apperr.Unauthenticated("wrong admin token")
			}
			return nil
		})
		if e, ok := apperr.As(err); ok && e.Kind == apperr.KindResourceExhausted {
			w.Header().Set("Retry-After", ratelimit.RetryAfterSeconds(e.RetryAfter))
			http.Error(w, e.Message, http.StatusTooManyRequests)
			return
		}
		if err != nil {
			http.Error(w, "missing or wrong admin token (Authorization: Bearer <INTEGRATIONS_ADMIN_TOKEN>)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Routes are the routes the system endpoints and the console act on, by name.
func Routes() []string { return []string{routes.Executions.Name, routes.Events.Name} }

// Diagnose runs the broker diagnostic: per route, a publish + consume round trip through its work
// queue, its queues' presence and depths, and this process's durability counters. The run is
// audited as the operator's (the only caller allowed), through the surface ctx came from.
func Diagnose(ctx context.Context, cfg Config) ([]mq.Diagnosis, error) {
	results, err := diagnose(ctx, cfg)
	ok := err == nil
	for _, d := range results {
		ok = ok && d.OK
	}
	audit.Write(ctx, cfg.Keys, cfg.Logger, store.Audit{Who: audit.Operator, Via: audit.Via(ctx), Action: "diagnostic.run",
		Detail: map[string]any{"ok": ok}})
	return results, err
}

func diagnose(ctx context.Context, cfg Config) ([]mq.Diagnosis, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*cfg.Timeout+5*time.Second)
	defer cancel()
	b, err := mq.Dial(ctx, cfg.Broker)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	defer func() { _ = b.Close() }()
	return b.Diagnose(ctx, []mq.Route{routes.Executions, routes.Events}, cfg.Timeout), nil
}

// diagnostic answers one line per configured route (Diagnose).
func diagnostic(cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		results, err := Diagnose(r.Context(), cfg)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "broker FAIL: %v\n", err)
			return
		}
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

// DeadLetter is a dead letter as the API and the console show it: why it died, not its body
// (which may hold an application's data).
type DeadLetter struct {
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

// ErrUnknownRoute is a route name other than executions and events.
var ErrUnknownRoute = errors.New("route: must be one of executions, events")

// DeadLetters lists up to limit of the route's dead letters, oldest first, leaving them queued.
func DeadLetters(ctx context.Context, cfg Config, route string, limit int) ([]DeadLetter, error) {
	rt, ok := knownRoutes[route]
	if !ok {
		return nil, ErrUnknownRoute
	}
	var out []DeadLetter
	err := withBroker(ctx, cfg, func(ctx context.Context, b mq.Broker) error {
		list, err := b.DeadLetters(ctx, rt.Name, limit)
		if err != nil {
			return err
		}
		out = make([]DeadLetter, 0, len(list))
		for _, d := range list {
			out = append(out, DeadLetter{ID: d.ID, Reason: d.Reason, LastError: d.LastError, Attempts: d.Attempts,
				FirstFailureAt: d.FirstFailureAt, LastFailureAt: d.LastFailureAt, DeadAt: d.DeadAt,
				SourceQueue: d.SourceQueue, BodyBytes: len(d.Body)})
		}
		return nil
	})
	return out, err
}

// RedriveDeadLetters moves the route's dead letters with the given ids (none: all of them) back
// to its work queue with a fresh attempt budget, and answers how many moved. The move is audited
// as the operator's (the only caller allowed), through the surface ctx came from.
func RedriveDeadLetters(ctx context.Context, cfg Config, route string, ids []string) (int, error) {
	rt, ok := knownRoutes[route]
	if !ok {
		return 0, ErrUnknownRoute
	}
	var moved int
	err := withBroker(ctx, cfg, func(ctx context.Context, b mq.Broker) error {
		var err error
		moved, err = b.Redrive(ctx, rt.Name, ids)
		return err
	})
	if err == nil {
		cfg.Logger.Info("dead letters redriven", zap.String("route", rt.Name), zap.Int("moved", moved))
	}
	// The broker is no transaction of the audit log: the entry is written after the move, and for
	// a move cut short too when letters did move.
	if err == nil || moved > 0 {
		detail := map[string]any{"count": moved}
		if len(ids) > 0 {
			detail["requested"] = len(ids)
		}
		if err != nil {
			detail["failed"] = true
		}
		audit.Write(ctx, cfg.Keys, cfg.Logger, store.Audit{Who: audit.Operator, Via: audit.Via(ctx), Action: "dead_letters.redrive",
			Target: rt.Name, Detail: detail})
	}
	return moved, err
}

func deadLetters(cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, http.StatusMethodNotAllowed, "use GET")
			return
		}
		route := r.URL.Query().Get("route")
		if _, ok := knownRoutes[route]; !ok {
			writeError(w, http.StatusBadRequest, ErrUnknownRoute.Error())
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
		out, err := DeadLetters(r.Context(), cfg, route, limit)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"route": route, "dead_letters": out})
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
		if _, ok := knownRoutes[req.Route]; !ok {
			writeError(w, http.StatusBadRequest, ErrUnknownRoute.Error())
			return
		}
		moved, err := RedriveDeadLetters(r.Context(), cfg, req.Route, req.IDs)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"route": req.Route, "redriven": moved})
	})
}

// withBroker connects for one request: the gateway holds no broker connection of its own.
func withBroker(ctx context.Context, cfg Config, fn func(ctx context.Context, b mq.Broker) error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := mq.Dial(ctx, cfg.Broker)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	defer func() { _ = b.Close() }()
	return fn(ctx, b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"code": code, "message": msg})
}
