package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eventsScale runs the delivery schedule 1m, 5m, 30m, 2h, 6h as 6 ms, 30 ms, 180 ms, 720 ms,
// 2.16 s.
const eventsScale = 0.0001

// hook is a webhook receiver whose answer the test changes as it goes. It verifies every
// request with the Standard Webhooks reference library and records what it received.
type hook struct {
	srv     *httptest.Server
	mu      sync.Mutex
	secret  string
	answer  func(w http.ResponseWriter) // nil: 204
	got     []delivery
	arrived chan delivery
	release chan struct{} // closed when the test ends: frees hanging answers
}

type delivery struct {
	WebhookID   string
	ExecutionID string
	At          time.Time
	Traceparent string // the request's W3C traceparent header, if any
}

func newHook(t *testing.T) *hook {
	h := &hook{arrived: make(chan delivery, 1000), release: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		h.mu.Lock()
		secret, answer := h.secret, h.answer
		h.mu.Unlock()
		wh, err := standardwebhooks.NewWebhook(secret)
		if err == nil {
			err = wh.Verify(body, req.Header)
		}
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev struct {
			Data struct {
				ExecutionID string `json:"execution_id"`
			} `json:"data"`
		}
		_ = json.Unmarshal(body, &ev)
		d := delivery{WebhookID: req.Header.Get("webhook-id"), ExecutionID: ev.Data.ExecutionID, At: time.Now(),
			Traceparent: req.Header.Get("traceparent")}
		h.mu.Lock()
		h.got = append(h.got, d)
		h.mu.Unlock()
		h.arrived <- d
		if answer != nil {
			answer(w)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() { close(h.release); h.srv.Close() })
	return h
}

func (h *hook) setAnswer(answer func(w http.ResponseWriter)) {
	h.mu.Lock()
	h.answer = answer
	h.mu.Unlock()
}

// register makes h the consumer of the application with key.
func (h *hook) register(t *testing.T, s *stack, key string) {
	t.Helper()
	code, body := s.call(http.MethodPut, "/v1/consumer", key, []byte(`{"webhook": {"url": "`+h.srv.URL+`/events"}}`))
	require.Equal(t, http.StatusOK, code, "%v", body)
	h.mu.Lock()
	h.secret = body["signing_secret"].(string)
	h.mu.Unlock()
}

// deliveriesOf lists what h received for an execution.
func (h *hook) deliveriesOf(executionID string) []delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []delivery
	for _, d := range h.got {
		if d.ExecutionID == executionID {
			out = append(out, d)
		}
	}
	return out
}

// eventOf returns the application's event of an execution through the events API.
func (s *stack) eventOf(t *testing.T, key, executionID string) map[string]any {
	t.Helper()
	code, body := s.call(http.MethodGet, "/v1/events?execution_id="+executionID, key, nil)
	require.Equal(t, http.StatusOK, code, "%v", body)
	list, _ := body["events"].([]any)
	if len(list) == 0 {
		return nil
	}
	code, body = s.call(http.MethodGet, "/v1/events/"+list[0].(map[string]any)["id"].(string), key, nil)
	require.Equal(t, http.StatusOK, code, "%v", body)
	ev, _ := body["event"].(map[string]any)
	return ev
}

func (s *stack) invokeAs(t *testing.T, key, capability, payload string) string {
	t.Helper()
	code, resp := s.call(http.MethodPost, "/v1/capabilities/"+capability+":invoke", key,
		[]byte(`{"mode": "MODE_ASYNC", "payload": `+payload+`}`))
	require.Equal(t, http.StatusAccepted, code, "%v", resp)
	return execution(resp)["id"].(string)
}

// TestEvents proves the event-routing evidence on six service processes, with the delivery
// schedule time-scaled.
func TestEvents(t *testing.T) {
	s := newStackScaled(t, eventsScale)
	// dummy.long: an hour's lease is 360 ms here, so attempts are not cut short on a loaded
	// machine; the deliveries are what these tests are about.
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	keyB := "appb_" + randomHex(16)
	s.schema.ApplyCatalog(t, "applications:\n  - id: app-b\n    api_key: "+keyB+"\n")
	// 6 s: B queued behind A's hanging deliveries would wait that long, twice the bound B is held
	// to below. Not longer: a killed router's deliveries are claimed for about as long, which the
	// kill -9 subtest waits out (10 s cost it 7 s more than 2 s did).
	s.Env = append(s.Env, "INTEGRATIONS_DELIVERY_TIMEOUT=6s")
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	hookA, hookB := newHook(t), newHook(t)
	hookA.register(t, s, s.APIKey)
	hookB.register(t, s, keyB)

	t.Run("the event reaches the invoking application's consumer, carrying the response, signed per Standard Webhooks", func(t *testing.T) {
		id := s.invokeAs(t, keyB, "dummy.long", `{"for": "b"}`)
		d := receiveFor(t, hookB.arrived, id)
		assert.NotEmpty(t, d.WebhookID)
		assert.Empty(t, hookA.deliveriesOf(id), "not to another application's consumer")
		// The router records the delivery once the answer is in.
		var ev map[string]any
		require.Eventually(t, func() bool {
			ev = s.eventOf(t, keyB, id)
			return ev["status"] == "EVENT_STATUS_DELIVERED"
		}, 10*time.Second, 20*time.Millisecond)
		data, _ := ev["data"].(map[string]any)
		result, _ := data["result"].(map[string]any)
		assert.Equal(t, map[string]any{"for": "b"}, result["echo"])
	})

	t.Run("a consumer that answers 500 gets six attempts at the scaled delays, then the event is dead, listed, and a redrive delivers it", func(t *testing.T) {
		hookA.setAnswer(func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) })
		id := s.invokeAs(t, s.APIKey, "dummy.long", `{"n": 500}`)
		var ev map[string]any
		require.Eventually(t, func() bool {
			ev = s.eventOf(t, s.APIKey, id)
			return ev != nil && ev["status"] == "EVENT_STATUS_DEAD"
		}, 30*time.Second, 50*time.Millisecond, "dead after six attempts")
		got := hookA.deliveriesOf(id)
		require.Len(t, got, 6, "exactly six attempts")
		for i, want := range []time.Duration{time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 6 * time.Hour} {
			gap := got[i+1].At.Sub(got[i].At)
			assert.GreaterOrEqual(t, gap, time.Duration(float64(want)*eventsScale), "gap after attempt %d", i+1)
		}
		deliveries, _ := ev["deliveries"].([]any)
		require.Len(t, deliveries, 6, "every attempt is in the history")
		assert.EqualValues(t, 500, deliveries[0].(map[string]any)["status_code"])

		code, body := s.call(http.MethodGet, "/v1/events?status=EVENT_STATUS_DEAD", s.APIKey, nil)
		require.Equal(t, http.StatusOK, code, "%v", body)
		assert.Contains(t, fmt.Sprint(body["events"]), id, "the dead event is listed")

		hookA.setAnswer(nil)
		code, body = s.call(http.MethodPost, "/v1/events:redrive", s.APIKey, []byte(`{}`))
		require.Equal(t, http.StatusOK, code, "%v", body)
		assert.EqualValues(t, "1", fmt.Sprint(body["count"]))
		receiveFor(t, hookA.arrived, id)
		require.Eventually(t, func() bool { return s.eventOf(t, s.APIKey, id)["status"] == "EVENT_STATUS_DELIVERED" },
			10*time.Second, 20*time.Millisecond)
		assert.Len(t, hookA.deliveriesOf(id), 7, "delivered once more, once")
	})

	t.Run("Retry-After is honoured", func(t *testing.T) {
		var once sync.Once
		hookA.setAnswer(func(w http.ResponseWriter) {
			answered := false
			once.Do(func() {
				// 250 s is 25 ms scaled: later than the first level (6 ms), within the next (30 ms).
				w.Header().Set("Retry-After", "250")
				w.WriteHeader(http.StatusServiceUnavailable)
				answered = true
			})
			if !answered {
				w.WriteHeader(http.StatusNoContent)
			}
		})
		defer hookA.setAnswer(nil)
		id := s.invokeAs(t, s.APIKey, "dummy.long", `{"n": 503}`)
		require.Eventually(t, func() bool { return len(hookA.deliveriesOf(id)) == 2 }, 20*time.Second, 10*time.Millisecond)
		got := hookA.deliveriesOf(id)
		assert.GreaterOrEqual(t, got[1].At.Sub(got[0].At), 25*time.Millisecond)
	})

	t.Run("application A cannot list, read or redrive application B's events", func(t *testing.T) {
		id := s.invokeAs(t, keyB, "dummy.long", `{"secret": "b"}`)
		receiveFor(t, hookB.arrived, id)
		evB := s.eventOf(t, keyB, id)
		require.NotNil(t, evB)
		assert.Nil(t, s.eventOf(t, s.APIKey, id), "not listed for A")
		code, _ := s.call(http.MethodGet, "/v1/events/"+evB["id"].(string), s.APIKey, nil)
		assert.Equal(t, http.StatusNotFound, code)
		code, _ = s.call(http.MethodPost, "/v1/events/"+evB["id"].(string)+":redeliver", s.APIKey, []byte(`{}`))
		assert.Equal(t, http.StatusNotFound, code)
	})

	t.Run("while application A's consumer hangs, application B's events are still delivered promptly", func(t *testing.T) {
		hookA.setAnswer(func(w http.ResponseWriter) {
			select {
			case <-hookA.release:
			case <-time.After(10 * time.Second): // past the delivery timeout: the router gives up first
			}
			w.WriteHeader(http.StatusNoContent)
		})
		defer hookA.setAnswer(nil)
		for i := range 12 {
			s.invokeAs(t, s.APIKey, "dummy.long", fmt.Sprintf(`{"a": %d}`, i))
		}
		// A's deliveries are in flight and hanging before B's call is made.
		receiveAny(t, hookA.arrived)
		start := time.Now()
		id := s.invokeAs(t, keyB, "dummy.long", `{"b": "prompt"}`)
		receiveFor(t, hookB.arrived, id)
		// A's deliveries hang until the 6 s delivery timeout: B's within 3 s was not queued behind
		// them, with 3 s on either side (B's path takes well under a second with two CPU hogs).
		assert.Less(t, time.Since(start), 3*time.Second, "B is not queued behind A")
	})

	t.Run("kill -9 the event-router mid-delivery: every event is still delivered, duplicates carry the same webhook-id", func(t *testing.T) {
		slow := make(chan struct{}, 100)
		hookB.setAnswer(func(w http.ResponseWriter) {
			slow <- struct{}{}
			time.Sleep(300 * time.Millisecond) // a slow receiver: the router dies while waiting on it
			w.WriteHeader(http.StatusNoContent)
		})
		defer hookB.setAnswer(nil)
		var ids []string
		for i := range 6 {
			ids = append(ids, s.invokeAs(t, keyB, "dummy.long", fmt.Sprintf(`{"k": %d}`, i)))
		}
		<-slow // at least one delivery is in flight
		s.kill("event-router")
		s.start("event-router")
		for _, id := range ids {
			require.Eventually(t, func() bool {
				return s.eventOf(t, keyB, id)["status"] == "EVENT_STATUS_DELIVERED"
			}, 30*time.Second, 50*time.Millisecond, "event of %s delivered", id)
			got := hookB.deliveriesOf(id)
			require.NotEmpty(t, got)
			for _, d := range got {
				assert.Equal(t, got[0].WebhookID, d.WebhookID, "a duplicate carries the same webhook-id")
			}
		}
	})

	t.Run("a webhook URL pointing at a private address is refused outside the dev profile", func(t *testing.T) {
		strictHTTP := freeAddr(t)
		s.ProgramEnv["gateway-strict"] = []string{"INTEGRATIONS_HTTP_ADDR=" + strictHTTP,
			"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE=false", "INTEGRATIONS_WEBHOOK_ALLOW_HTTP=false"}
		s.startInstance("gateway-strict", "gateway")
		for _, url := range []string{"https://10.0.0.7/hook", "https://127.0.0.1/hook", "https://169.254.169.254/latest", "https://localhost/x"} {
			req, err := http.NewRequest(http.MethodPut, s.Scheme()+strictHTTP+"/v1/consumer", strings.NewReader(`{"webhook": {"url": "`+url+`"}}`))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+keyB)
			resp, err := s.http.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", url, body)
			assert.Contains(t, string(body), "webhook.url", url)
		}
	})
}

func receiveFor(t *testing.T, ch <-chan delivery, executionID string) delivery {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case d := <-ch:
			if d.ExecutionID == executionID {
				return d
			}
		case <-timeout:
			t.Fatalf("no delivery for %s within 30s", executionID)
		}
	}
}

func receiveAny(t *testing.T, ch <-chan delivery) delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
	}
	return delivery{}
}
