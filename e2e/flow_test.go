package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
)

// receiver is the application's webhook consumer: it verifies every signature and hands the
// verified events to the test.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	secret string
	events chan receivedEvent
	bad    chan error
}

type receivedEvent struct {
	ID   string
	Body map[string]any
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{events: make(chan receivedEvent, 100), bad: make(chan error, 100)}
	contract := suiteContract(t)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		secret := r.secret
		r.mu.Unlock()
		if err := webhooks.Verify(req.Header, body, secret); err != nil {
			r.bad <- err
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		// And with the Standard Webhooks reference library, as a receiver would.
		reference, err := standardwebhooks.NewWebhook(secret)
		if err == nil {
			err = reference.Verify(body, req.Header)
		}
		if err != nil {
			r.bad <- fmt.Errorf("reference library: %w", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			r.bad <- fmt.Errorf("event body is not JSON: %w", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// Every delivery the suite receives is held to the document's webhooks too.
		if problem := contract.checkWebhook(req.Header, m); problem != "" {
			t.Errorf("%s", problem)
		}
		r.events <- receivedEvent{ID: req.Header.Get(webhooks.HeaderID), Body: m}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// register sets the receiver as the application's consumer through the API.
func (r *receiver) register(t *testing.T, s *stack) {
	t.Helper()
	code, body := s.call(http.MethodPut, "/v1/consumer", s.APIKey, []byte(`{"webhook": {"url": "`+r.srv.URL+`/events"}}`))
	require.Equal(t, http.StatusOK, code, "%v", body)
	secret, _ := body["signing_secret"].(string)
	require.True(t, strings.HasPrefix(secret, "whsec_"), "signing secret %q", secret)
	r.mu.Lock()
	r.secret = secret
	r.mu.Unlock()
}

// await returns the verified event of an execution.
func (r *receiver) await(t *testing.T, executionID string) receivedEvent {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-r.events:
			data, _ := ev.Body["data"].(map[string]any)
			if data["execution_id"] == executionID {
				return ev
			}
		case err := <-r.bad:
			t.Fatalf("webhook with a bad signature: %v", err)
		case <-timeout:
			t.Fatalf("no event for execution %s within 30s", executionID)
		}
	}
}

func (s *stack) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, s.schema.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

func execution(body map[string]any) map[string]any {
	e, _ := body["execution"].(map[string]any)
	return e
}

// TestFlow carries an async and a sync call through the six services, and checks that bad
// input is refused without writing anything.
func TestFlow(t *testing.T) {
	s := newStack(t)
	// The dispatcher starts later: while it is down, no path leads to the adapter, which makes
	// "answered 202 without calling the adapter" observable, and its first scheduled pass must
	// pick up the execution whose nudge was lost.
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "gateway")
	r := newReceiver(t)
	r.register(t, s)

	t.Run("async call answers 202 pending at attempt 0, then completes and is delivered", asyncCallDelivered(s, r))

	t.Run("sync call answers the result, writes no dispatch, and still delivers the event", func(t *testing.T) {
		code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
			[]byte(`{"mode": "MODE_SYNC", "payload": {"greeting": "now"}}`))
		require.Equal(t, http.StatusOK, code, "%v", body)
		e := execution(body)
		id, _ := e["id"].(string)
		assert.Equal(t, "EXECUTION_STATUS_SUCCEEDED", e["status"])
		assert.EqualValues(t, 1, e["attempt"])
		result, _ := e["result"].(map[string]any)
		assert.Equal(t, map[string]any{"greeting": "now"}, result["echo"])
		// The answer is the execution as GET shows it, its attempt included.
		_, got := s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
		attempts, _ := e["attempts"].([]any)
		require.Len(t, attempts, 1, "the sync answer's attempts: %v", e["attempts"])
		assert.Equal(t, execution(got)["attempts"], e["attempts"])
		assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM dispatches WHERE execution_id = $1`, id), "sync writes no dispatch record")

		ev := r.await(t, id)
		data := ev.Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		assert.Equal(t, result, data["result"])
	})

	t.Run("a sync call whose adapter fails settles failed and is not retried", func(t *testing.T) {
		code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
			[]byte(`{"mode": "MODE_SYNC", "payload": {"dummy": {"fail_transient": 3}}}`))
		require.Equal(t, http.StatusOK, code, "%v", body)
		e := execution(body)
		assert.Equal(t, "EXECUTION_STATUS_FAILED", e["status"])
		failure, _ := e["failure"].(map[string]any)
		assert.Equal(t, "transient", failure["class"])
		assert.Equal(t, "retry_exhausted.attempt_limit", failure["reason"])
		assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM dispatches WHERE execution_id = $1`, e["id"]))
	})

	t.Run("an async call that fails transiently is retried by the schedule and succeeds", transientFailureRetried(s, r))
	t.Run("the dispatches went through the broker and its consumer", dispatchesThroughBroker(s))

	t.Run("long-running work is accepted, then completed through the callback API", func(t *testing.T) {
		code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
			[]byte(`{"mode": "MODE_ASYNC", "payload": {"job": "export", "dummy": {"complete_later_ms": 300}}}`))
		require.Equal(t, http.StatusAccepted, code, "%v", body)
		id := execution(body)["id"].(string)
		ev := r.await(t, id)
		data := ev.Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		result, _ := data["result"].(map[string]any)
		assert.Equal(t, map[string]any{"job": "export"}, result["echo"])
		_, body = s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
		assert.Equal(t, map[string]any{"percent": float64(50)}, execution(body)["progress"], "reported progress is visible")
		assert.Contains(t, s.Log("adapter-callback"), `"attempt completed by callback"`)
	})

	t.Run("an idempotency key returns the original execution, and refuses another request", func(t *testing.T) {
		req := []byte(`{"mode": "MODE_ASYNC", "payload": {"order": 42}}`)
		code, first := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey, req, "Idempotency-Key", "order-42")
		require.Equal(t, http.StatusAccepted, code, "%v", first)
		code, again := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey, req, "Idempotency-Key", "order-42")
		require.Equal(t, http.StatusOK, code, "a replay is not a second acceptance: %v", again)
		assert.Equal(t, execution(first)["id"], execution(again)["id"])
		before := s.count(t, `SELECT count(*) FROM executions`)
		code, other := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
			[]byte(`{"mode": "MODE_ASYNC", "payload": {"order": 43}}`), "Idempotency-Key", "order-42")
		assert.Equal(t, http.StatusConflict, code, "%v", other)
		assert.Equal(t, before, s.count(t, `SELECT count(*) FROM executions`))
	})

	t.Run("the broker diagnostic answers one line per route, through the real consumers", brokerDiagnosticAnswers(s))

	t.Run("a poison dispatch is dead-lettered, listed and redriven through the operator API", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b, err := mq.Dial(ctx, s.BrokerConfig())
		require.NoError(t, err)
		defer b.Close()
		require.NoError(t, b.Declare(ctx, routes.Executions))
		require.NoError(t, b.Publish(ctx, routes.Executions.Name, mq.Outgoing{ID: "poison-1", Body: []byte("not a dispatch")}))

		admin := func(method, path, body string) (int, map[string]any) {
			req, err := http.NewRequest(method, s.RESTURL+path, strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			resp, err := s.http.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			out := map[string]any{}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
			return resp.StatusCode, out
		}
		deadIDs := func() []string {
			code, body := admin(http.MethodGet, "/api/v1/system/dead-letters?route=executions", "")
			require.Equal(t, http.StatusOK, code, "%v", body)
			var ids []string
			for _, d := range body["dead_letters"].([]any) {
				dl := d.(map[string]any)
				if dl["id"] == "poison-1" {
					assert.Equal(t, "rejected", dl["reason"])
					assert.Contains(t, dl["last_error"], "malformed dispatch message")
				}
				ids = append(ids, dl["id"].(string))
			}
			return ids
		}
		require.Eventually(t, func() bool { return slices.Contains(deadIDs(), "poison-1") }, 10*time.Second, 50*time.Millisecond,
			"the consumer rejects the poison message into the DLQ")
		code, body := admin(http.MethodPost, "/api/v1/system/dead-letters:redrive", `{"route": "executions", "ids": ["poison-1"]}`)
		require.Equal(t, http.StatusOK, code, "%v", body)
		assert.EqualValues(t, 1, body["redriven"])
		// Redriven, it goes through the consumer again and is rejected again.
		require.Eventually(t, func() bool {
			return strings.Count(s.Log("execution-consumer"), `"message_id":"poison-1"`) >= 2 && slices.Contains(deadIDs(), "poison-1")
		}, 10*time.Second, 50*time.Millisecond)
		code, _ = admin(http.MethodGet, "/api/v1/system/dead-letters?route=nope", "")
		assert.Equal(t, http.StatusBadRequest, code)
	})

	t.Run("bad input is refused naming what is wrong, and nothing is written", func(t *testing.T) {
		before := s.count(t, `SELECT count(*) FROM executions`)
		big := `{"mode": "MODE_ASYNC", "payload": {"blob": "` + strings.Repeat("x", 70000) + `"}}`
		cases := []struct {
			name     string
			path     string
			key      string
			body     string
			code     int
			contains string
		}{
			{"unknown capability", "/v1/capabilities/no.such:invoke", s.APIKey, `{"mode": "MODE_ASYNC", "payload": {}}`, 404, "no.such"},
			{"missing key", "/v1/capabilities/dummy.echo:invoke", "", `{"mode": "MODE_ASYNC", "payload": {}}`, 401, "authorization"},
			{"wrong key", "/v1/capabilities/dummy.echo:invoke", "wrong-key-0123456789", `{"mode": "MODE_ASYNC", "payload": {}}`, 401, "API key"},
			{"malformed JSON", "/v1/capabilities/dummy.echo:invoke", s.APIKey, `{"mode": "MODE_ASYNC", "payload": {`, 400, ""},
			{"missing mode", "/v1/capabilities/dummy.echo:invoke", s.APIKey, `{"payload": {}}`, 400, "mode"},
			{"unknown mode", "/v1/capabilities/dummy.echo:invoke", s.APIKey, `{"mode": "MODE_LATER", "payload": {}}`, 400, "mode"},
			{"payload not an object", "/v1/capabilities/dummy.echo:invoke", s.APIKey, `{"mode": "MODE_ASYNC", "payload": [1]}`, 400, ""},
			{"payload over the size limit", "/v1/capabilities/dummy.echo:invoke", s.APIKey, big, 400, "payload"},
			{"bad execution id", "/v1/executions/not-a-uuid", s.APIKey, ``, 400, "id"},
		}
		for _, c := range cases {
			method := http.MethodPost
			if strings.HasPrefix(c.path, "/v1/executions/") {
				method = http.MethodGet
			}
			code, body := s.call(method, c.path, c.key, []byte(c.body))
			assert.Equal(t, c.code, code, "%s: %v", c.name, body)
			if c.contains != "" {
				assert.Contains(t, body["message"], c.contains, c.name)
			}
		}
		assert.Equal(t, before, s.count(t, `SELECT count(*) FROM executions`), "no execution written")
	})

	t.Run("an application sees only its own executions", func(t *testing.T) {
		code, body := s.call(http.MethodGet, "/v1/executions?page_size=2", s.APIKey, nil)
		require.Equal(t, http.StatusOK, code, "%v", body)
		list, _ := body["executions"].([]any)
		require.Len(t, list, 2, "page_size bounds the page")
		assert.NotEmpty(t, body["next_page_token"])
		id := list[0].(map[string]any)["id"].(string)

		otherKey := "other_" + randomHex(16)
		other, err := catalog.Parse([]byte("applications:\n  - id: other-app\n    api_key: "+otherKey+"\n"), nil)
		require.NoError(t, err)
		require.NoError(t, catalog.Apply(context.Background(), s.schema.Pool, other))
		code, body = s.call(http.MethodGet, "/v1/executions/"+id, otherKey, nil)
		assert.Equal(t, http.StatusNotFound, code, "another tenant's execution reads as not found: %v", body)
		code, body = s.call(http.MethodGet, "/v1/executions", otherKey, nil)
		require.Equal(t, http.StatusOK, code)
		assert.Empty(t, body["executions"])
	})
}

// asyncCallDelivered is the async call through the whole platform: answered 202 pending at
// attempt 0 without calling the adapter while the dispatcher is down (s must not run it yet), then
// dispatched once the dispatcher starts — its first scheduled pass picks up the execution whose
// nudge was lost — completed, and its event delivered to r, signed and verified. TestFlow and
// TestFlowOnSTOMP run it.
func asyncCallDelivered(s *stack, r *receiver) func(t *testing.T) {
	return func(t *testing.T) {
		code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
			[]byte(`{"mode": "MODE_ASYNC", "payload": {"greeting": "hello", "n": 1}}`))
		require.Equal(t, http.StatusAccepted, code, "%v", body)
		e := execution(body)
		id, _ := e["id"].(string)
		require.NotEmpty(t, id)
		assert.Equal(t, "EXECUTION_STATUS_PENDING", e["status"])
		assert.EqualValues(t, 0, e["attempt"], "attempt 0 is sent: zero values are in every answer")
		assert.Equal(t, "/v1/executions/"+id, body["url"])
		assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM dispatches WHERE execution_id = $1 AND attempt = 1`, id),
			"the first dispatch record is committed with the execution")
		assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1`, id),
			"no attempt started: the adapter was not called")
		assert.NotContains(t, s.Log("dummy-adapter"), id, "the adapter has not seen the execution")

		s.start("dispatcher")
		ev := r.await(t, id)
		assert.Equal(t, ev.ID, ev.Body["id"], "webhook-id is the event id, the receiver's dedup key")
		assert.Equal(t, "execution.completed", ev.Body["type"])
		data := ev.Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		assert.EqualValues(t, 1, data["attempt"])
		result, _ := data["result"].(map[string]any)
		assert.Equal(t, map[string]any{"greeting": "hello", "n": float64(1)}, result["echo"], "the adapter's response")

		code, body = s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
		require.Equal(t, http.StatusOK, code, "%v", body)
		e = execution(body)
		assert.Equal(t, "EXECUTION_STATUS_SUCCEEDED", e["status"])
		assert.EqualValues(t, 1, e["attempt"])
		assert.Equal(t, result, e["result"])
		assert.Len(t, e["attempts"], 1)
		assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM dispatches WHERE execution_id = $1`, id), "published dispatch deleted")
		assert.Eventually(t, func() bool {
			return s.count(t, `SELECT count(*) FROM integration_events WHERE execution_id = $1 AND delivery_status = 'delivered'`, id) == 1
		}, 10*time.Second, 20*time.Millisecond, "the event is recorded delivered")
	}
}

// transientFailureRetried is an async call that fails transiently twice and succeeds at attempt 3,
// each retry no earlier than the schedule's delay: the dispatcher hands the next attempt to the
// broker's delay levels (RabbitMQ's TTL holding queues, STOMP's scheduled delivery). TestFlow and
// TestFlowOnSTOMP run it.
func transientFailureRetried(s *stack, r *receiver) func(t *testing.T) {
	return func(t *testing.T) {
		code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
			[]byte(`{"mode": "MODE_ASYNC", "payload": {"dummy": {"fail_transient": 2}}}`))
		require.Equal(t, http.StatusAccepted, code, "%v", body)
		id := execution(body)["id"].(string)
		ev := r.await(t, id)
		data := ev.Body["data"].(map[string]any)
		assert.Equal(t, "succeeded", data["status"])
		assert.EqualValues(t, 3, data["attempt"])
		// Attempt n+1 starts no earlier than the schedule's delay after attempt n ended (1m and
		// 5m, time-scaled to 60 ms and 300 ms).
		var gap1, gap2 float64
		require.NoError(t, s.schema.Pool.QueryRow(context.Background(), `
			SELECT extract(epoch FROM (SELECT started_at FROM execution_attempts WHERE execution_id = $1 AND n = 2) -
				(SELECT ended_at FROM execution_attempts WHERE execution_id = $1 AND n = 1)),
			       extract(epoch FROM (SELECT started_at FROM execution_attempts WHERE execution_id = $1 AND n = 3) -
				(SELECT ended_at FROM execution_attempts WHERE execution_id = $1 AND n = 2))`, id).Scan(&gap1, &gap2))
		assert.GreaterOrEqual(t, gap1, 0.060)
		assert.GreaterOrEqual(t, gap2, 0.300)
		assert.Equal(t, 2, s.count(t, `SELECT count(*) FROM execution_attempts WHERE execution_id = $1 AND failure_class = 'transient'`, id))
	}
}

// brokerDiagnosticAnswers is the operator's broker diagnostic: one line per route, answered
// through the real consumers, and refused without the admin token.
func brokerDiagnosticAnswers(s *stack) func(t *testing.T) {
	return func(t *testing.T) {
		post := func(token string) (int, string) {
			req, err := http.NewRequest(http.MethodPost, s.RESTURL+"/api/v1/system/mq-diagnostic", nil)
			require.NoError(t, err)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := s.http.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(body)
		}
		code, body := post(adminToken)
		require.Equal(t, http.StatusOK, code, body)
		lines := strings.Split(strings.TrimSpace(body), "\n")
		require.Len(t, lines, 2, body)
		assert.True(t, strings.HasPrefix(lines[0], "executions ok"), lines[0])
		assert.True(t, strings.HasPrefix(lines[1], "events ok"), lines[1])
		assert.Contains(t, lines[0], " answered_by=", "the execution-consumer answered with its counters")
		code, _ = post("")
		assert.Equal(t, http.StatusUnauthorized, code)
	}
}
