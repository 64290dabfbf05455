package system

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// ApplicationsPath is the root of the API key endpoints:
//
//	POST   /api/v1/system/applications/{app}/keys            create: the key is in the answer, once
//	GET    /api/v1/system/applications/{app}/keys            list: ids, prefixes and times, never a secret
//	POST   /api/v1/system/applications/{app}/keys/{id}:revoke
//	DELETE /api/v1/system/applications/{app}/keys/{id}       revoke (either form)
const ApplicationsPath = "/api/v1/system/applications/"

// MaxKeyLifetime bounds expires_in and expires_at.
const MaxKeyLifetime = 10 * 365 * 24 * time.Hour

var (
	appIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)
	keyIDPattern = regexp.MustCompile(`^([0-9A-Za-z]{12}|chosen_[0-9a-f]{12})$`)
)

// createKeyRequest is the body of a create; every field is optional.
type createKeyRequest struct {
	Description string `json:"description"`
	CreatedBy   string `json:"created_by"`
	// ExpiresIn is a Go duration ("720h"), counted from the database's now().
	ExpiresIn string `json:"expires_in"`
	// ExpiresAt is an RFC 3339 time.
	ExpiresAt string `json:"expires_at"`
}

// createdKey is a create's answer: the key in clear, the only time it is shown.
type createdKey struct {
	store.KeyInfo
	Key string `json:"key"`
}

func keys(cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cfg.Keys == nil {
			writeError(w, http.StatusNotFound, "API key endpoints are not served here")
			return
		}
		rest := strings.TrimPrefix(r.URL.Path, ApplicationsPath)
		parts := strings.Split(rest, "/")
		if len(parts) < 2 || parts[1] != "keys" || len(parts) > 3 {
			writeError(w, http.StatusNotFound, "no such endpoint: use "+ApplicationsPath+"{application}/keys[/{id}[:revoke]]")
			return
		}
		app := parts[0]
		if !appIDPattern.MatchString(app) {
			writeError(w, http.StatusBadRequest, "application: must match "+appIDPattern.String())
			return
		}
		if len(parts) == 2 {
			switch r.Method {
			case http.MethodGet:
				listKeys(w, r, cfg, app)
			case http.MethodPost:
				createKey(w, r, cfg, app)
			default:
				w.Header().Set("Allow", "GET, POST")
				writeError(w, http.StatusMethodNotAllowed, "use GET to list keys or POST to create one")
			}
			return
		}
		id, revoke := strings.CutSuffix(parts[2], ":revoke")
		if !keyIDPattern.MatchString(id) {
			writeError(w, http.StatusBadRequest, "key id: must be the id a listing shows (12 letters and digits, or chosen_ and 12 hex digits)")
			return
		}
		want := http.MethodDelete
		if revoke {
			want = http.MethodPost
		}
		if r.Method != want {
			w.Header().Set("Allow", want)
			writeError(w, http.StatusMethodNotAllowed, "use "+want+" to revoke a key")
			return
		}
		revokeKey(w, r, cfg, app, id)
	})
}

func listKeys(w http.ResponseWriter, r *http.Request, cfg Config, app string) {
	list, err := cfg.Keys.ListKeys(r.Context(), app)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "application: no application "+app)
		return
	}
	if err != nil {
		storeFailed(w, cfg, "list API keys", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"application": app, "keys": list})
}

func createKey(w http.ResponseWriter, r *http.Request, cfg Config, app string) {
	var req createKeyRequest
	if code, msg := decodeBody(w, r, &req); msg != "" {
		writeError(w, code, msg)
		return
	}
	nk := store.NewKey{ApplicationID: app, Description: req.Description, CreatedBy: req.CreatedBy}
	if msg := checkText(req.Description, 256); msg != "" {
		writeError(w, http.StatusBadRequest, "description: "+msg)
		return
	}
	if msg := checkText(req.CreatedBy, 128); msg != "" {
		writeError(w, http.StatusBadRequest, "created_by: "+msg)
		return
	}
	switch {
	case req.ExpiresIn != "" && req.ExpiresAt != "":
		writeError(w, http.StatusBadRequest, "expires_in, expires_at: give one, not both")
		return
	case req.ExpiresIn != "":
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d < time.Second || d > MaxKeyLifetime {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("expires_in: must be a duration (e.g. 720h) between 1s and %s", MaxKeyLifetime))
			return
		}
		nk.ExpiresIn = d
	case req.ExpiresAt != "":
		t, err := time.Parse(time.RFC3339, req.ExpiresAt)
		if err != nil {
			writeError(w, http.StatusBadRequest, "expires_at: must be an RFC 3339 time (e.g. 2027-01-31T00:00:00Z)")
			return
		}
		if time.Until(t) > MaxKeyLifetime {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("expires_at: must be within %s", MaxKeyLifetime))
			return
		}
		nk.ExpiresAt = &t
	}
	detail := map[string]any{}
	if req.CreatedBy != "" {
		detail["created_by"] = req.CreatedBy
	}
	nk.Audit = &store.Audit{Who: audit.Operator, Via: audit.Via(r.Context()), Action: "api_key.create", Target: app, Detail: detail}
	info, token, err := cfg.Keys.CreateKey(r.Context(), nk)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "application: no application "+app)
		return
	case errors.Is(err, store.ErrExpiryNotInFuture):
		writeError(w, http.StatusBadRequest, "expires_at: must be in the future")
		return
	case err != nil:
		storeFailed(w, cfg, "create API key", err)
		return
	}
	cfg.Logger.Info("API key created", zap.String("application", app), zap.String("key_id", info.ID))
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, createdKey{KeyInfo: info, Key: token})
}

func revokeKey(w http.ResponseWriter, r *http.Request, cfg Config, app, id string) {
	info, err := cfg.Keys.RevokeKey(r.Context(), app, id, &store.Audit{Who: audit.Operator, Via: audit.Via(r.Context()),
		Action: "api_key.revoke", Target: app, Detail: map[string]any{"key_id": id}})
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "key id: application "+app+" has no key "+id)
		return
	}
	if err != nil {
		storeFailed(w, cfg, "revoke API key", err)
		return
	}
	cfg.Logger.Info("API key revoked", zap.String("application", app), zap.String("key_id", id))
	writeJSON(w, http.StatusOK, info)
}

// storeFailed answers a database failure as retryable.
func storeFailed(w http.ResponseWriter, cfg Config, what string, err error) {
	cfg.Logger.Warn(what+" failed", zap.Error(err))
	writeError(w, http.StatusServiceUnavailable, what+": the database did not answer; try again")
}

// maxCreateBody bounds a create's body: its fields are short.
const maxCreateBody = 64 << 10

// decodeBody reads an optional JSON object (an empty body is one with no fields) and nothing
// after it into v. On bad input it returns the status and the message naming `body`; it never
// echoes the input unbounded.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) (int, string) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCreateBody))
	if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("body: at most %d bytes", maxCreateBody)
	}
	if err != nil {
		return http.StatusBadRequest, "body: could not be read"
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, ""
	}
	if raw[0] != '{' {
		err = errors.New("not an object")
	} else {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err = dec.Decode(v); err == nil && dec.InputOffset() != int64(len(raw)) {
			// Anything after the object is refused, not ignored.
			err = errors.New("data after the JSON object")
		}
	}
	if err == nil {
		return 0, ""
	}
	msg := err.Error() // may quote an unknown field's name: bounded
	if len(msg) > 120 {
		msg = strings.ToValidUTF8(msg[:120], "") + "…"
	}
	return http.StatusBadRequest, "body: must be one JSON object with the fields description, created_by, " +
		"expires_in, expires_at: " + msg
}

// checkText says what is wrong with a free-text field, or "" if nothing. Control and format
// characters are refused: a bidi override or zero-width character would make a listing lie about
// what a key is for.
func checkText(s string, maxLen int) string {
	if len(s) > maxLen {
		return fmt.Sprintf("at most %d bytes", maxLen)
	}
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	for _, c := range s {
		if unicode.IsControl(c) || unicode.In(c, unicode.Cf, unicode.Zl, unicode.Zp) {
			return fmt.Sprintf("must not hold control or format characters (found U+%04X)", c)
		}
	}
	return ""
}
