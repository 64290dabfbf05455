package stack

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/integrations-platform/integrations/pkg/webhook"
)

// Event is one webhook delivery the receiver got.
type Event struct {
	At     time.Time // when the request arrived
	Header http.Header
	Body   []byte
	// VerifyErr is the signature check's outcome (nil: signed with the application's secret).
	VerifyErr error
}

// Receiver is the application's webhook consumer: it verifies every delivery's signature
// (Standard Webhooks, pkg/webhook), counts, hands each to OnEvent if set, and answers 204.
type Receiver struct {
	URL string

	received atomic.Int64
	rejected atomic.Int64 // signature did not verify
	srv      *http.Server
	mu       sync.RWMutex
	secret   string
	onEvent  func(Event)
}

// NewReceiver serves a receiver on a free loopback port.
func NewReceiver() (*Receiver, error) {
	r := &Receiver{}
	srv, base, err := httpServe(http.HandlerFunc(r.serve))
	if err != nil {
		return nil, err
	}
	r.srv, r.URL = srv, base+"/webhook"
	return r, nil
}

// SetSecret sets the signing secret deliveries are verified with.
func (r *Receiver) SetSecret(secret string) {
	r.mu.Lock()
	r.secret = secret
	r.mu.Unlock()
}

// OnEvent sets (nil: clears) a function called with every delivery, from the serving goroutine.
func (r *Receiver) OnEvent(f func(Event)) {
	r.mu.Lock()
	r.onEvent = f
	r.mu.Unlock()
}

// Received is the number of deliveries so far; Rejected of those whose signature did not verify.
func (r *Receiver) Received() int64 { return r.received.Load() }

// Rejected is the number of deliveries whose signature did not verify.
func (r *Receiver) Rejected() int64 { return r.rejected.Load() }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.RLock()
	secret, on := r.secret, r.onEvent
	r.mu.RUnlock()
	ev := Event{At: at, Header: req.Header, Body: body}
	if secret != "" {
		ev.VerifyErr = webhook.Verify(secret, req.Header, body, at, 5*time.Minute)
	}
	r.received.Add(1)
	if ev.VerifyErr != nil {
		r.rejected.Add(1)
	}
	if on != nil {
		on(ev)
	}
	w.WriteHeader(http.StatusNoContent)
}

// Close stops serving.
func (r *Receiver) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}
