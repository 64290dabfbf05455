// Package democonsumer is a demo webhook receiver: it verifies the Standard Webhooks signature of
// each completion event, answers 204, and prints one human-readable line per event. Printing
// the result is the point of the demo; a real consumer would not log payloads.
package democonsumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"go.uber.org/zap"
)

// MaxBody bounds a request body; completion events are far smaller.
const MaxBody = 1 << 20

// seenCapacity bounds the memory of delivered event ids used to spot redeliveries.
const seenCapacity = 10000

// SecretSource returns the signing secret to verify with.
type SecretSource func() (string, error)

// StaticSecret is a fixed secret.
func StaticSecret(secret string) SecretSource {
	return func() (string, error) { return secret, nil }
}

// FileSecret reads the secret from path on every call, so that a script can register the
// consumer (and so learn its secret) after starting the receiver.
func FileSecret(path string) SecretSource {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("read signing secret: %w", err)
		}
		secret := strings.TrimSpace(string(b))
		if secret == "" {
			return "", fmt.Errorf("read signing secret: %s is empty", path)
		}
		return secret, nil
	}
}

// Handler receives POST /events.
type Handler struct {
	secret SecretSource
	log    *zap.Logger
	now    func() time.Time

	mu    sync.Mutex // serialises lines on out and guards the seen set
	out   io.Writer
	seen  map[string]struct{}
	order []string
}

// New returns a Handler printing to out.
func New(secret SecretSource, out io.Writer, log *zap.Logger) *Handler {
	return &Handler{secret: secret, out: out, log: log, now: time.Now, seen: map[string]struct{}{}}
}

// event is the part of the completion event the demo prints.
type event struct {
	Type string `json:"type"`
	Data struct {
		ExecutionID string          `json:"execution_id"`
		Status      string          `json:"status"`
		Attempt     json.RawMessage `json:"attempt"`
		Result      json.RawMessage `json:"result"`
		Failure     json.RawMessage `json:"failure"`
	} `json:"data"`
}

// ServeHTTP answers 204 to a correctly signed event, 401 to a bad signature, and 503 while no
// secret is available (the sender retries later).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	secret, err := h.secret()
	if err != nil {
		h.log.Warn("no signing secret yet", zap.Error(err))
		http.Error(w, "no signing secret configured yet", http.StatusServiceUnavailable)
		return
	}
	id := r.Header.Get(webhooks.HeaderID)
	v := webhooks.Verifier{Secrets: []string{secret}, Now: h.now}
	if err := v.Verify(r.Header, body); err != nil {
		h.log.Warn("webhook rejected", zap.String("webhook_id", id), zap.Error(err))
		http.Error(w, "invalid signature", http.StatusUnauthorized)
		return
	}
	var ev event
	if err := json.Unmarshal(body, &ev); err != nil {
		h.log.Warn("webhook body is not an event", zap.String("webhook_id", id), zap.Error(err))
		http.Error(w, "body is not a JSON event", http.StatusBadRequest)
		return
	}
	h.print(id, &ev)
	w.WriteHeader(http.StatusNoContent)
}

// print writes the event's line. Delivery is at least once and the webhook id is the dedup key
// (docs/architecture.md §8), so a redelivery is printed as such rather than as a new event.
func (h *Handler) print(id string, ev *event) {
	line := fmt.Sprintf("event %s %s execution=%s status=%s attempt=%s result=%s",
		id, ev.Type, ev.Data.ExecutionID, ev.Data.Status, raw(ev.Data.Attempt), raw(ev.Data.Result))
	if len(ev.Data.Failure) > 0 {
		line += " failure=" + raw(ev.Data.Failure)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.seen[id]; dup {
		line += " (duplicate, ignored)"
	} else {
		h.remember(id)
	}
	_, _ = fmt.Fprintln(h.out, line)
}

func (h *Handler) remember(id string) {
	if len(h.order) >= seenCapacity {
		delete(h.seen, h.order[0])
		h.order = h.order[1:]
	}
	h.seen[id] = struct{}{}
	h.order = append(h.order, id)
}

// raw renders a JSON value compactly, "null" when absent.
func raw(v json.RawMessage) string {
	if len(v) == 0 {
		return "null"
	}
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return string(v)
	}
	return b.String()
}
