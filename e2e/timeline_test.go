package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTimelineOfARetriedExecution: an execution that fails its first attempt transiently, then
// succeeds and is delivered, has every hop on its timeline in order; another application's key
// does not find it, the admin token does.
func TestTimelineOfARetriedExecution(t *testing.T) {
	s := newStackScaled(t, eventsScale)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	keyB := "appb_" + randomHex(16)
	s.schema.ApplyCatalog(t, "applications:\n  - id: app-b\n    api_key: "+keyB+"\n")
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	hook := newHook(t)
	hook.register(t, s, s.APIKey)

	code, resp := s.call(http.MethodPost, "/v1/capabilities/dummy.fast:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "idempotency_key": "timeline-1", "payload": {"dummy": {"fail_transient": 1}}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", resp)
	id := execution(resp)["id"].(string)
	receiveFor(t, hook.arrived, id)
	require.Eventually(t, func() bool {
		ev := s.eventOf(t, s.APIKey, id)
		return ev != nil && ev["status"] == "EVENT_STATUS_DELIVERED"
	}, 20*time.Second, 20*time.Millisecond, "the delivery is recorded")

	code, body := s.call(http.MethodGet, "/v1/executions/"+id+"/timeline", s.APIKey, nil)
	require.Equal(t, http.StatusOK, code, "%v", body)
	entries, _ := body["entries"].([]any)
	type step struct{ kind, attempt string }
	var got []step
	var last time.Time
	for _, e := range entries {
		m := e.(map[string]any)
		at, err := time.Parse(time.RFC3339Nano, m["at"].(string))
		require.NoError(t, err)
		assert.False(t, at.Before(last), "entries in time order: %v", m)
		last = at
		attempt := ""
		if a, ok := m["attempt"]; ok && fmt.Sprint(a) != "0" {
			attempt = fmt.Sprint(a)
		}
		got = append(got, step{m["kind"].(string), attempt})
	}
	require.Equal(t, []step{
		{"TIMELINE_ENTRY_KIND_ACCEPTED", ""},
		{"TIMELINE_ENTRY_KIND_ATTEMPT_STARTED", "1"},
		{"TIMELINE_ENTRY_KIND_ATTEMPT_ENDED", "1"},
		{"TIMELINE_ENTRY_KIND_ATTEMPT_STARTED", "2"},
		{"TIMELINE_ENTRY_KIND_ATTEMPT_ENDED", "2"},
		{"TIMELINE_ENTRY_KIND_SETTLED", "2"},
		{"TIMELINE_ENTRY_KIND_EVENT", ""},
		{"TIMELINE_ENTRY_KIND_DELIVERY", ""},
	}, got, "%v", entries)
	first := entries[0].(map[string]any)
	assert.Equal(t, "timeline-1", first["idempotency_key"])
	failed := entries[2].(map[string]any)
	assert.Equal(t, "failed", failed["outcome"])
	assert.NotEmpty(t, failed["error_class"])
	assert.EqualValues(t, 204, entries[7].(map[string]any)["status_code"])

	code, body = s.call(http.MethodGet, "/v1/executions/"+id+"/timeline", keyB, nil)
	assert.Equal(t, http.StatusNotFound, code, "another application's key: %v", body)
	code, body = s.call(http.MethodGet, "/v1/executions/"+id+"/timeline", adminToken, nil)
	assert.Equal(t, http.StatusOK, code, "the admin token: %v", body)
	code, body = s.call(http.MethodGet, "/v1/executions/"+id, adminToken, nil)
	assert.Equal(t, http.StatusForbidden, code, "the admin token reads timelines only: %v", body)
}
