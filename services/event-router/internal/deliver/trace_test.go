package deliver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// A webhook request continues its event's trace (the execution's, from the event's row, through
// the relay and the notice): its traceparent names the event's trace id. An event without a trace
// is sent without a traceparent, and no baggage is ever sent.
func TestWebhookCarriesTheEventsTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	// Written with its trace context in one statement, as settlement writes it: the relay may
	// take an event the moment it exists.
	exec := b.s.InsertExecution(t, dbtest.Execution{Application: dbtest.TestApp})
	traced := uuid.NewString()
	payload, err := json.Marshal(map[string]any{"id": traced, "type": "execution.completed",
		"timestamp": time.Now().UTC().Format(time.RFC3339Nano), "data": map[string]any{"execution_id": exec, "status": "succeeded"}})
	require.NoError(t, err)
	_, err = b.s.Pool.Exec(context.Background(), `
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, traceparent)
		VALUES ($1, $2, $3, 'execution.completed', $4, $5)`,
		traced, dbtest.TestApp, exec, payload, "00-"+traceID+"-b7ad6b7169203331-01")
	require.NoError(t, err)
	untraced := b.newEvent(t, dbtest.TestApp)
	b.awaitStatus(t, traced, "delivered", 10*time.Second)
	b.awaitStatus(t, untraced, "delivered", 10*time.Second)

	byEvent := map[string]http.Header{}
	for _, r := range rc.requests() {
		var ev struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal(r.body, &ev))
		byEvent[ev.ID] = r.header
	}
	require.Contains(t, byEvent, traced)
	require.Contains(t, byEvent, untraced)
	parts := strings.Split(byEvent[traced].Get("traceparent"), "-")
	require.Len(t, parts, 4, "traceparent %q", byEvent[traced].Get("traceparent"))
	assert.Equal(t, traceID, parts[1], "the event's trace")
	assert.Empty(t, byEvent[untraced].Get("traceparent"), "no trace, no traceparent")
	for _, h := range byEvent {
		assert.Empty(t, h.Get("baggage"))
	}
}
