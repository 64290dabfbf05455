package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// progressEvent is one delivery a progressHook received and verified.
type progressEvent struct {
	WebhookID string
	Type      string
	Sequence  int
	Progress  map[string]any
}

// progressHook is a webhook receiver that verifies each request with the Standard Webhooks
// reference library (an unverified one is answered 401 and not recorded) and keeps, per
// execution, what arrived in the order it arrived. delay holds each answer that long: a slow
// consumer.
type progressHook struct {
	srv    *httptest.Server
	mu     sync.Mutex
	secret string
	delay  time.Duration
	got    map[string][]progressEvent
	// unverified counts requests whose signature did not verify.
	unverified int
}

func newProgressHook(t *testing.T, delay time.Duration) *progressHook {
	h := &progressHook{delay: delay, got: map[string][]progressEvent{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		h.mu.Lock()
		secret := h.secret
		h.mu.Unlock()
		wh, err := standardwebhooks.NewWebhook(secret)
		if err == nil {
			err = wh.Verify(body, req.Header)
		}
		if err != nil {
			h.mu.Lock()
			h.unverified++
			h.mu.Unlock()
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev struct {
			Type string `json:"type"`
			Data struct {
				ExecutionID string         `json:"execution_id"`
				Sequence    int            `json:"sequence"`
				Progress    map[string]any `json:"progress"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		time.Sleep(h.delay) // the slow consumer under test, not a wait for an event
		h.mu.Lock()
		h.got[ev.Data.ExecutionID] = append(h.got[ev.Data.ExecutionID], progressEvent{
			WebhookID: req.Header.Get("webhook-id"), Type: ev.Type, Sequence: ev.Data.Sequence, Progress: ev.Data.Progress})
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *progressHook) register(t *testing.T, s *stack, key string) {
	t.Helper()
	code, body := s.call(http.MethodPut, "/v1/consumer", key, []byte(`{"webhook": {"url": "`+h.srv.URL+`/events"}}`))
	require.Equal(t, http.StatusOK, code, "%v", body)
	h.mu.Lock()
	h.secret = body["signing_secret"].(string)
	h.mu.Unlock()
}

// awaitCompletion waits until the execution's completion event arrived and returns everything
// that arrived for it, duplicates (same webhook-id, at least once) dropped.
func (h *progressHook) awaitCompletion(t *testing.T, executionID string) []progressEvent {
	t.Helper()
	var got []progressEvent
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		got = nil
		seen := map[string]bool{}
		done := false
		for _, e := range h.got[executionID] {
			if !seen[e.WebhookID] {
				seen[e.WebhookID] = true
				got = append(got, e)
			}
			done = done || e.Type == "execution.completed"
		}
		return done
	}, 30*time.Second, 20*time.Millisecond, "the completion event of %s arrives", executionID)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Zero(t, h.unverified, "every delivery verifies with the Standard Webhooks library")
	return got
}

// requireInOrder checks the evidence on what one execution's receiver got: progress
// events, then the completion event last, in strictly increasing sequence order as they arrived,
// the last progress report among them.
func requireInOrder(t *testing.T, got []progressEvent, lastProgress map[string]any) {
	t.Helper()
	require.GreaterOrEqual(t, len(got), 2, "at least one progress event and the completion: %+v", got)
	for i, e := range got {
		if i > 0 {
			require.Greater(t, e.Sequence, got[i-1].Sequence, "arrival %d out of sequence order: %+v", i, got)
		}
		if i < len(got)-1 {
			require.Equal(t, "execution.progress", e.Type, "arrival %d: %+v", i, got)
			require.NotNil(t, e.Progress)
		}
	}
	require.Equal(t, "execution.completed", got[len(got)-1].Type, "the completion event comes last")
	require.Equal(t, lastProgress, got[len(got)-2].Progress, "the last progress report is always delivered")
}

// TestProgressEvents: an execution of a progress_events capability delivers its progress events
// and then its completion event to the receiver, in sequence order, each verifying with the
// Standard Webhooks reference library; a slow receiver gets the reports coalesced, the last one
// always; a capability without the flag, or a sync execution, delivers only the completion event.
func TestProgressEvents(t *testing.T) {
	s := newStackScaled(t, eventsScale)
	// A lease that outlasts each execution (24 h scaled is 8.6 s, against 2 s of work) even if no
	// renewal arrives in time: at 1 h (360 ms, renewed every 120 ms) a loaded machine let it expire,
	// and the attempt ran again, its progress reported twice (issue 22).
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s)+`
  - name: dummy.progress
    adapter: dummy
    modes: [async, sync]
    lease: 24h
    progress_events: true
`)
	keyB := "appb_" + randomHex(16)
	s.schema.ApplyCatalog(t, "applications:\n  - id: app-b\n    api_key: "+keyB+"\n")
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	fast, slow := newProgressHook(t, 0), newProgressHook(t, 250*time.Millisecond)
	fast.register(t, s, s.APIKey)
	slow.register(t, s, keyB)

	t.Run("progress events, then the completion event, in sequence order, each signed", func(t *testing.T) {
		id := s.invokeAs(t, s.APIKey, "dummy.progress", `{"dummy": {"complete_later_ms": 2000, "progress_steps": 4}}`)
		got := fast.awaitCompletion(t, id)
		requireInOrder(t, got, map[string]any{"percent": 80.0, "step": 4.0})
		// A receiver that answers at once gets every report: 400 ms apart, nothing to coalesce.
		require.Len(t, got, 5, "%+v", got)
		for i, e := range got[:4] {
			assert.Equal(t, float64(i+1), e.Progress["step"])
		}
		assert.Equal(t, 5, got[4].Sequence, "the completion takes the next sequence number")

		// The events API lists each with its type and sequence; the timeline shows each event.
		code, body := s.call(http.MethodGet, "/v1/events?execution_id="+id, s.APIKey, nil)
		require.Equal(t, http.StatusOK, code, "%v", body)
		types := map[string]string{}
		for _, e := range body["events"].([]any) {
			m := e.(map[string]any)
			types[fmt.Sprint(m["sequence"])] = m["type"].(string)
		}
		assert.Equal(t, map[string]string{"1": "execution.progress", "2": "execution.progress", "3": "execution.progress",
			"4": "execution.progress", "5": "execution.completed"}, types)
		var seqs []string
		require.Eventually(t, func() bool {
			code, body = s.call(http.MethodGet, "/v1/executions/"+id+"/timeline", s.APIKey, nil)
			require.Equal(t, http.StatusOK, code, "%v", body)
			seqs = nil
			delivered := 0
			for _, e := range body["entries"].([]any) {
				m := e.(map[string]any)
				switch m["kind"] {
				case "TIMELINE_ENTRY_KIND_EVENT":
					seqs = append(seqs, fmt.Sprintf("%v %v", m["event_type"], m["event_sequence"]))
				case "TIMELINE_ENTRY_KIND_DELIVERY":
					delivered++
				}
			}
			return delivered == 5 // each event's delivery is recorded once the answer is in
		}, 10*time.Second, 20*time.Millisecond)
		assert.Equal(t, []string{"execution.progress 1", "execution.progress 2", "execution.progress 3", "execution.progress 4",
			"execution.completed 5"}, seqs)
	})

	t.Run("a slow receiver gets the reports coalesced, in order, the last one always", func(t *testing.T) {
		const steps = 12
		id := s.invokeAs(t, keyB, "dummy.progress", fmt.Sprintf(`{"dummy": {"complete_later_ms": 1000, "progress_steps": %d}}`, steps))
		got := slow.awaitCompletion(t, id)
		requireInOrder(t, got, map[string]any{"percent": float64(100 * steps / (steps + 1)), "step": float64(steps)})
		// 12 reports 77 ms apart against 250 ms per delivery: while one event is delivered, the
		// reports meanwhile fold into the one waiting behind it.
		assert.Less(t, len(got)-1, steps, "coalesced: %+v", got)
		t.Logf("%d reports arrived as %d progress events", steps, len(got)-1)
		assert.Equal(t, steps+1, got[len(got)-1].Sequence, "every report took a sequence number; the completion the next")
	})

	t.Run("a capability without progress_events, or a sync execution, delivers only the completion event", func(t *testing.T) {
		id := s.invokeAs(t, s.APIKey, "dummy.long", `{"dummy": {"complete_later_ms": 300, "progress_steps": 3}}`)
		got := fast.awaitCompletion(t, id)
		require.Len(t, got, 1, "%+v", got)
		assert.Equal(t, "execution.completed", got[0].Type)
		assert.Equal(t, 1, got[0].Sequence)

		code, resp := s.call(http.MethodPost, "/v1/capabilities/dummy.progress:invoke", s.APIKey,
			[]byte(`{"mode": "MODE_SYNC", "payload": {"dummy": {"complete_later_ms": 300, "progress_steps": 3}}}`))
		require.Equal(t, http.StatusOK, code, "%v", resp)
		id = execution(resp)["id"].(string)
		got = fast.awaitCompletion(t, id)
		require.Len(t, got, 1, "%+v", got)
		assert.Equal(t, "execution.completed", got[0].Type)
		code, body := s.call(http.MethodGet, "/v1/events?execution_id="+id, s.APIKey, nil)
		require.Equal(t, http.StatusOK, code, "%v", body)
		assert.Len(t, body["events"], 1, "no progress event was written")
	})
}
