package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// TestReceiverNeverDropsTheAwaitedEvent: however many other events arrive while the program waits
// for settlement (and reads nothing), the awaited completion event is acknowledged only once it is
// handed over, and redeliveries of it neither block the handler nor replace it.
func TestReceiverNeverDropsTheAwaitedEvent(t *testing.T) {
	secret, err := webhooks.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	var verifier atomic.Pointer[webhooks.Verifier]
	completed := make(chan *webhooks.Event, 1)
	h := receiver(&verifier, "the-key", completed, io.Discard)

	deliver := func(id, key string) int {
		t.Helper()
		body, err := json.Marshal(webhooks.Event{ID: id, Type: webhooks.TypeExecutionCompleted, Timestamp: time.Now(),
			Data: webhooks.EventData{ExecutionID: "ex-" + id, Status: "succeeded", IdempotencyKey: key}})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(string(body)))
		if err := webhooks.SetHeaders(r.Header, []string{secret}, id, time.Now(), body); err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}

	if code := deliver("evt-early", "the-key"); code != http.StatusServiceUnavailable {
		t.Fatalf("before the secret is known: %d, want 503 (delivered again later)", code)
	}
	verifier.Store(&webhooks.Verifier{Secrets: []string{secret}})

	// More events of other invocations than any buffer of the old receiver held, then the
	// awaited one, then two redeliveries of it.
	for i := range 40 {
		if code := deliver("evt-"+strconv.Itoa(i), "another-key-"+strconv.Itoa(i)); code != http.StatusNoContent {
			t.Fatalf("event %d: %d", i, code)
		}
	}
	for range 3 {
		if code := deliver("evt-awaited", "the-key"); code != http.StatusNoContent {
			t.Fatalf("the awaited event: %d", code)
		}
	}
	select {
	case event := <-completed:
		if event.ID != "evt-awaited" || event.Data.ExecutionID != "ex-evt-awaited" {
			t.Fatalf("handed over %s for %s", event.ID, event.Data.ExecutionID)
		}
	default:
		t.Fatal("the awaited event was acknowledged and dropped")
	}

	r := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(`{"id":"evt-x"}`))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("an unsigned delivery: %d, want 401", w.Code)
	}
}
