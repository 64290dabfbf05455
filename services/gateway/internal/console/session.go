package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// CookieName is the console's session cookie.
const CookieName = "integrations_console"

// Roles a session has.
const (
	roleApplication = "application"
	roleOperator    = "operator"
)

// session is what the sealed cookie holds: who is signed in and until when — never the key
// itself. An application's session names its key by id and hash (server.KeyRef) so that every
// request checks the key again: revoking or expiring it ends the session. An operator's holds a
// hash of the admin token it was opened with, so that changing the token ends it.
type session struct {
	// ID names the session for signing out of it (store.ConsoleSessionEnd): the cookie itself
	// cannot be taken back from wherever it was copied to.
	ID          string         `json:"i"`
	Role        string         `json:"r"`
	Application string         `json:"a,omitempty"`
	Key         *server.KeyRef `json:"k,omitempty"`
	AdminHash   []byte         `json:"o,omitempty"`
	// CSRF is sent back in every form and compared with this one.
	CSRF    string    `json:"c"`
	Expires time.Time `json:"e"`
}

// actor is who the session is in the audit log.
func (s *session) actor() store.AuditActor {
	if s.Role == roleOperator {
		return store.AuditActor{Role: store.AuditRoleOperator, ID: store.AuditOperator}
	}
	return store.AuditActor{Role: store.AuditRoleApplication, ID: s.Application}
}

// Who is the session's principal as the page header shows it.
func (s *session) Who() string {
	if s.Role == roleOperator {
		return "operator"
	}
	return "application " + s.Application
}

// Operator tells an operator's session (for templates).
func (s *session) Operator() bool { return s.Role == roleOperator }

var errNoSession = errors.New("no valid session")

func newCSRF() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("csrf token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func adminHash(token string) []byte {
	sum := sha256.Sum256([]byte("console-operator:" + token))
	return sum[:]
}

// isAdminToken compares token with the admin token through their hashes, so that the time taken
// tells nothing of the admin token, its length included (ConstantTimeCompare returns at once on
// a length mismatch).
func isAdminToken(token, admin string) bool {
	return admin != "" && subtle.ConstantTimeCompare(adminHash(token), adminHash(admin)) == 1
}

// seal encodes s into a cookie value.
func seal(box *secret.Box, s *session) (string, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("encode session: %w", err)
	}
	sealed, err := box.Seal(raw)
	if err != nil {
		return "", fmt.Errorf("seal session: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(sealed), nil
}

// open decodes a cookie value; a value not sealed by box (tampered, or sealed with a key no
// longer configured) or past its expiry is no session.
func open(box *secret.Box, value string, now time.Time) (*session, error) {
	sealed, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil {
		return nil, errNoSession
	}
	raw, err := box.Open(sealed)
	if err != nil {
		return nil, errNoSession
	}
	var s session
	if err := json.Unmarshal(raw, &s); err != nil || s.CSRF == "" || uuid.Validate(s.ID) != nil {
		return nil, errNoSession
	}
	if !now.Before(s.Expires) {
		return nil, errNoSession
	}
	return &s, nil
}

// checkCSRF compares the form's token with the session's in constant time.
func checkCSRF(s *session, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.CSRF)) == 1
}

// secure tells a request that reached the console over TLS: the listener's own, or a proxy's in
// front of it that says so. Trusting the proxy's header here can only make the cookie stricter.
func (h *handler) secure(r *http.Request) bool {
	return h.cfg.Secure || r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (h *handler) setCookie(w http.ResponseWriter, r *http.Request, value string, expires time.Time) {
	c := &http.Cookie{
		Name: CookieName, Value: value, Path: Prefix, HttpOnly: true, Secure: h.secure(r),
		SameSite: http.SameSiteStrictMode,
	}
	if value == "" {
		c.MaxAge = -1
	} else {
		c.Expires = expires
	}
	http.SetCookie(w, c)
}

// crossSite tells a request a page of another site made (a form it posted to the console): it is
// refused before anything else, the sign-in included, which has no session and so no CSRF token
// to check (a forged sign-in would put the victim in the attacker's application). Browsers say
// where a request comes from in Sec-Fetch-Site; one that does not still sends Origin on a POST.
// "same-site" is refused too: another application on a sibling host is another site here.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return true
	case "same-origin", "none":
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false // not a browser's form: a CSRF needs a browser
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return true // "null": a sandboxed or privacy-sensitive context
	}
	return !strings.EqualFold(u.Host, r.Host) && !strings.EqualFold(u.Host, r.Header.Get("X-Forwarded-Host"))
}
