// Package console serves the operator and application console under /console/ on the gateway's
// REST listener: server-rendered pages (html/template, one CSS file, no JavaScript) over the
// gateway's own API, called in process with the signed-in caller's identity, so that the console
// shows no more than the API would. See docs/decisions.md, "The console".
package console

import (
	"cmp"
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/integrations-platform/integrations/pkg/apperr"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
	"github.com/integrations-platform/integrations/services/gateway/internal/system"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// DefaultSessionTTL is how long a sign-in lasts: a working day.
const DefaultSessionTTL = 8 * time.Hour

// maxFormBytes bounds a form body: the console's forms hold a token and a few fields.
const maxFormBytes = 16 << 10

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/console.css
var staticFS embed.FS

// Config configures the console.
type Config struct {
	// API is the gateway service, called in process with the caller's identity
	// (server.AsApplication, server.AsOperator).
	API gatewayv1.GatewayServiceServer
	// Store checks a session's API key again on every request, and holds the audit log.
	Store *store.Store
	// Box seals the session cookie (INTEGRATIONS_SECRET_KEY).
	Box *secret.Box
	// AdminToken signs an operator in (INTEGRATIONS_ADMIN_TOKEN; empty: no operator).
	AdminToken string
	// System reaches the broker for the operator's dead letters and diagnostic.
	System system.Config
	// Secure marks the cookie Secure: the listener serves TLS.
	Secure bool
	// SessionTTL is how long a sign-in lasts (0: DefaultSessionTTL).
	SessionTTL time.Duration
	Logger     *zap.Logger
	// Failures limits failed sign-ins (nil: not limited), counted with the API's failed
	// authentications: a source address or key id over its limit is answered 429 with
	// Retry-After before its token is checked.
	Failures *ratelimit.Failures
	// Now is the clock sessions expire by (nil: time.Now).
	Now func() time.Time
}

type handler struct {
	cfg   Config
	pages map[string]*template.Template
	mux   *http.ServeMux
}

// Handler returns the console, to be mounted at Prefix.
func Handler(cfg Config) (http.Handler, error) {
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, DefaultSessionTTL)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Logger = cmp.Or(cfg.Logger, zap.NewNop())
	h := &handler{cfg: cfg, pages: map[string]*template.Template{}, mux: http.NewServeMux()}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console templates: %w", err)
	}
	for _, name := range names {
		if name == "templates/layout.html" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", name)
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", name, err)
		}
		h.pages[strings.TrimSuffix(strings.TrimPrefix(name, "templates/"), ".html")] = t
	}
	h.routes()
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Pages hold an application's data: never cached, never framed, no other origin's scripts.
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	if r.Method != http.MethodGet && r.Method != http.MethodHead && crossSite(r) {
		h.fail(w, r, nil, http.StatusForbidden, "This form was sent from another site: the console takes forms from its own pages only.")
		return
	}
	h.mux.ServeHTTP(w, r)
}

func (h *handler) routes() {
	m := h.mux
	static, _ := fs.Sub(staticFS, "static")
	m.Handle("GET /console/static/", http.StripPrefix("/console/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /console/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"executions", http.StatusSeeOther)
	})
	m.HandleFunc("GET /console/login", h.loginPage)
	m.HandleFunc("POST /console/login", h.login)
	m.HandleFunc("POST /console/logout", h.authed(h.logout))
	m.HandleFunc("GET /console/executions", h.authed(h.executions))
	m.HandleFunc("GET /console/executions/{id}", h.authed(h.timeline))
	m.HandleFunc("GET /console/executions/{id}/cancel", h.authed(h.cancelConfirm))
	m.HandleFunc("POST /console/executions/{id}/cancel", h.authed(h.cancel))
	m.HandleFunc("GET /console/events", h.authed(h.events))
	m.HandleFunc("GET /console/events/redrive", h.authed(h.redriveConfirm))
	m.HandleFunc("POST /console/events/redrive", h.authed(h.redrive))
	m.HandleFunc("GET /console/events/{id}", h.authed(h.event))
	m.HandleFunc("GET /console/events/{id}/redeliver", h.authed(h.redeliverConfirm))
	m.HandleFunc("POST /console/events/{id}/redeliver", h.authed(h.redeliver))
	m.HandleFunc("GET /console/dead-letters", h.operator(h.deadLetters))
	m.HandleFunc("GET /console/dead-letters/redrive", h.operator(h.deadLetterRedriveConfirm))
	m.HandleFunc("POST /console/dead-letters/redrive", h.operator(h.deadLetterRedrive))
	m.HandleFunc("GET /console/diagnostic", h.operator(h.diagnosticPage))
	m.HandleFunc("POST /console/diagnostic", h.operator(h.diagnostic))
	m.HandleFunc("GET /console/audit", h.authed(h.audit))
	m.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, nil, http.StatusNotFound, "No such page.")
	})
}

type sessionHandler func(w http.ResponseWriter, r *http.Request, s *session)

// authed runs next for a valid session and sends anyone else to the login page. It is the one
// place a session is checked: the cookie opens and is not expired, the key it names still
// authenticates (not revoked or expired), and a POST carries the session's CSRF token.
func (h *handler) authed(next sessionHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, err := h.session(r)
		if err != nil && !errors.Is(err, errNoSession) {
			h.cfg.Logger.Warn("console session not checked", zap.Error(err))
			h.fail(w, r, nil, http.StatusServiceUnavailable, "The session could not be checked; try again.")
			return
		}
		if err != nil {
			h.setCookie(w, r, "", time.Time{})
			if r.Method == http.MethodGet {
				http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				h.fail(w, r, s, http.StatusBadRequest, "The form could not be read.")
				return
			}
			if !checkCSRF(s, r) {
				h.fail(w, r, s, http.StatusForbidden, "This form has expired or did not come from the console (CSRF token missing or wrong). Go back, reload the page and try again.")
				return
			}
		}
		next(w, r, s)
	}
}

// operator is authed for the operator's pages: an application gets 404, as for anything it may
// not see.
func (h *handler) operator(next sessionHandler) http.HandlerFunc {
	return h.authed(func(w http.ResponseWriter, r *http.Request, s *session) {
		if s.Role != roleOperator {
			h.fail(w, r, s, http.StatusNotFound, "No such page.")
			return
		}
		next(w, r, s)
	})
}

// session is the request's valid session, or errNoSession.
func (h *handler) session(r *http.Request) (*session, error) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return nil, errNoSession
	}
	s, err := open(h.cfg.Box, c.Value, h.cfg.Now())
	if err != nil {
		return nil, err
	}
	switch s.Role {
	case roleOperator:
		if h.cfg.AdminToken == "" || subtle.ConstantTimeCompare(s.AdminHash, adminHash(h.cfg.AdminToken)) != 1 {
			return nil, errNoSession
		}
	case roleApplication:
		if s.Key == nil {
			return nil, errNoSession
		}
		app, err := server.ReauthenticateKey(r.Context(), h.cfg.Store, *s.Key)
		if err != nil || app != s.Application {
			return nil, errNoSession
		}
	default:
		return nil, errNoSession
	}
	// A session signed out of is no session; an error when that cannot be read.
	ended, err := h.cfg.Store.ConsoleSessionEnded(r.Context(), s.ID)
	switch {
	case err != nil:
		return nil, err
	case ended:
		return nil, errNoSession
	}
	return s, nil
}

// as is ctx as the session's principal calls the gateway service.
func as(ctx context.Context, s *session) context.Context {
	ctx = audit.ViaConsole(ctx)
	if s.Role == roleOperator {
		return server.AsOperator(ctx)
	}
	return server.AsApplication(ctx, s.Application)
}

// view is what every page template gets.
type view struct {
	Title   string
	Nav     string
	Session *session
	Error   string
	Data    any
}

// CSRF is the session's token for the page's forms.
func (v view) CSRF() string {
	if v.Session == nil {
		return ""
	}
	return v.Session.CSRF
}

func (h *handler) render(w http.ResponseWriter, code int, page string, v view) {
	t, ok := h.pages[page]
	if !ok {
		h.cfg.Logger.Error("console page has no template", zap.String("page", page))
		http.Error(w, "console: page template missing", http.StatusInternalServerError)
		return
	}
	var sb strings.Builder
	if err := t.Execute(&sb, v); err != nil {
		h.cfg.Logger.Error("console page failed to render", zap.String("page", page), zap.Error(err))
		http.Error(w, "console: the page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(sb.String()))
}

// fail renders the error page with code and msg.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, s *session, code int, msg string) {
	h.render(w, code, "error", view{Title: http.StatusText(code), Session: s, Error: msg, Data: code})
}

// failAPI renders an error of the gateway service as its REST face would answer it: a refusal
// of the input is a 4xx page naming the field, another application's execution a 404 page.
func (h *handler) failAPI(w http.ResponseWriter, r *http.Request, s *session, err error) {
	st := grpcx.ToStatus(err)
	if st.Code() == codes.Unauthenticated {
		h.setCookie(w, r, "", time.Time{})
		http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
		return
	}
	code := runtime.HTTPStatusFromCode(st.Code())
	msg := st.Message()
	if e, ok := apperr.As(err); ok {
		msg = e.Message
		if e.Field != "" {
			msg = e.Field + ": " + e.Message
		}
	}
	if code >= 500 {
		h.cfg.Logger.Warn("console call failed", zap.String("path", r.URL.Path), zap.Error(err))
	}
	h.fail(w, r, s, code, msg)
}

// record writes the audit entry of a sign-in or a sign-out, the console's own actions. Every
// other action is audited where it is carried out (the gateway's methods, the system functions),
// as taken via the console (as).
func (h *handler) record(ctx context.Context, s *session, action string) {
	audit.Write(ctx, h.cfg.Store, h.cfg.Logger, store.Audit{Who: s.actor(), Via: store.AuditViaConsole, Action: action})
}

// badInput is a filter the console itself could not read: the field and why.
type badInput struct{ field, msg string }

func (e *badInput) Error() string { return e.field + ": " + e.msg }

func asBadInput(err error) (*badInput, bool) {
	var b *badInput
	return b, errors.As(err, &b)
}
