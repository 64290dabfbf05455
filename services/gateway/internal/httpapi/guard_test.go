package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

type refusal struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Details []struct {
		FieldViolations []struct {
			Field string `json:"field"`
		} `json:"field_violations"`
	} `json:"details"`
}

func (r refusal) field() string {
	for _, d := range r.Details {
		for _, v := range d.FieldViolations {
			return v.Field
		}
	}
	return ""
}

// send makes one request with the given headers (Authorization defaults to the test key) and
// answers the status, the Allow header and the refusal body.
func send(t *testing.T, method, url, body string, headers map[string]string) (int, string, refusal) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+dbtest.TestAPIKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var r refusal
	if resp.StatusCode >= 400 {
		require.NoError(t, json.Unmarshal(raw, &r), "%s", raw)
	}
	return resp.StatusCode, resp.Header.Get("Allow"), r
}

func executions(t *testing.T, b *bundle) int {
	t.Helper()
	code, _, _ := send(t, http.MethodGet, b.url+"/v1/executions", "", nil)
	require.Equal(t, http.StatusOK, code)
	req, _ := http.NewRequest(http.MethodGet, b.url+"/v1/executions?page_size=100", nil)
	req.Header.Set("Authorization", "Bearer "+dbtest.TestAPIKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	var list struct {
		Executions []json.RawMessage `json:"executions"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	return len(list.Executions)
}

// What grpc-gateway dropped silently or answered 500/501 is a 400 naming the header, the path or
// the parameter — or a 405 with Allow — and nothing is written.
func TestHostileRequestsAreRefusedByName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	invoke := b.url + "/v1/capabilities/" + dbtest.TestCapability + ":invoke"
	body := `{"mode":"MODE_ASYNC","payload":{"n":1}}`

	for _, tc := range []struct {
		name, method, url string
		headers           map[string]string
		field             string
	}{
		{"non-ASCII Idempotency-Key", http.MethodPost, invoke, map[string]string{"Idempotency-Key": "clé-1"}, "Idempotency-Key"},
		// An empty key was dropped: the request ran without one, and a retry ran it again.
		{"empty Idempotency-Key", http.MethodPost, invoke, map[string]string{"Idempotency-Key": ""}, "Idempotency-Key"},
		{"all-space Idempotency-Key", http.MethodPost, invoke, map[string]string{"Idempotency-Key": "   "}, "Idempotency-Key"},
		// Named as the header too, not as the body's idempotency_key field.
		{"too long Idempotency-Key", http.MethodPost, invoke, map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, "Idempotency-Key"},
		{"Idempotency-Key with a space", http.MethodPost, invoke, map[string]string{"Idempotency-Key": "k 1"}, "Idempotency-Key"},
		{"non-ASCII Authorization", http.MethodPost, invoke, map[string]string{"Authorization": "Bearer clé"}, "Authorization"},
		{"invalid UTF-8 in the path", http.MethodGet, b.url + "/v1/executions/%ff%fe", nil, "path"},
		{"NUL in the path", http.MethodGet, b.url + "/v1/executions/a%00b", nil, "path"},
		{"invalid UTF-8 in a query parameter", http.MethodGet, b.url + "/v1/executions?capability=%ff", nil, "capability"},
		{"NUL in a query parameter", http.MethodGet, b.url + "/v1/events?execution_id=%00", nil, "execution_id"},
		{"a bad query string", http.MethodGet, b.url + "/v1/executions?capability=%zz", nil, "query"},
		{"NUL in the capability filter", http.MethodGet, b.url + "/v1/executions?capability=a%00", nil, "capability"},
		{"page size over 100", http.MethodGet, b.url + "/v1/executions?page_size=101", nil, "page_size"},
		// A long parameter name is cut on a rune boundary: cut inside é it was not UTF-8, and
		// grpc-gateway answered 500 for the refusal it could not marshal.
		{"a long parameter name cut before a rune", http.MethodGet, b.url + "/v1/executions?" + strings.Repeat("a", 63) + "%C3%A9=%00", nil, strings.Repeat("a", 63) + "..."},
		{"a long parameter name cut before a rune, bad value", http.MethodGet, b.url + "/v1/executions?" + strings.Repeat("a", 63) + "%C3%A9=%ff", nil, strings.Repeat("a", 63) + "..."},
		// Under grpc-gateway's metadata prefix the guarded headers got around the guard.
		{"Grpc-Metadata-Idempotency-Key", http.MethodPost, invoke, map[string]string{"Grpc-Metadata-Idempotency-Key": "cl\xe9"}, "Grpc-Metadata-Idempotency-Key"},
		{"Grpc-Metadata-Idempotency-Key, plain", http.MethodPost, invoke, map[string]string{"Grpc-Metadata-Idempotency-Key": "k-1"}, "Grpc-Metadata-Idempotency-Key"},
		{"Grpc-Metadata-Authorization", http.MethodPost, invoke, map[string]string{"Grpc-Metadata-Authorization": "Bearer x"}, "Grpc-Metadata-Authorization"},
	} {
		for range 2 { // twice: a dropped key would have made two executions
			code, _, r := send(t, tc.method, tc.url, body, tc.headers)
			require.Equal(t, http.StatusBadRequest, code, "%s: %+v", tc.name, r)
			require.Equal(t, 3, r.Code, tc.name)
			require.Equal(t, tc.field, r.field(), "%s: %+v", tc.name, r)
		}
	}
	require.Zero(t, executions(t, b), "nothing written")

	// A deep payload over REST: 65 and 1000 levels name payload; 20000 is past protojson's own
	// limit and is still a 400.
	for _, levels := range []int{65, 1000, 20000} {
		deep := strings.Repeat(`{"a":`, levels-1) + `{}` + strings.Repeat(`}`, levels-1)
		code, _, r := send(t, http.MethodPost, invoke, `{"mode":"MODE_ASYNC","payload":`+deep+`}`, nil)
		require.Equal(t, http.StatusBadRequest, code, "%d levels: %+v", levels, r)
		if levels < 10000 {
			require.Equal(t, "payload", r.field(), "%d levels", levels)
		}
		require.Less(t, len(r.Message), 512)
	}
	code, _, r := send(t, http.MethodPost, invoke, "{\"mode\":\"MODE_ASYNC\",\"payload\":{\"s\":\"\xff\"}}", nil)
	require.Equal(t, http.StatusBadRequest, code, "invalid UTF-8 in the body: %+v", r)
	code, _, r = send(t, http.MethodPost, invoke, `{"mode":"MODE_ASYNC","`+strings.Repeat("f", 100000)+`":1}`, nil)
	require.Equal(t, http.StatusBadRequest, code, "an unknown field of a huge name")
	require.Less(t, len(r.Message), 300, "grpc-gateway's refusal, bounded")
	code, _, r = send(t, http.MethodPost, invoke, `{"mode":"MODE_ASYNC","payload":{"k\u0000":"v"}}`, nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "payload", r.field())
	require.Zero(t, executions(t, b), "nothing written")

	// grpc-gateway's own refusals of a body name it.
	for name, payload := range map[string]string{
		"a number out of range": `{"n":1e400}`,
		"a duplicate key":       `{"n":1,"n":2}`,
		"a lone surrogate":      `{"s":"\ud800"}`,
		"invalid UTF-8":         "{\"s\":\"\xff\"}",
	} {
		code, _, r := send(t, http.MethodPost, invoke, `{"mode":"MODE_ASYNC","payload":`+payload+`}`, nil)
		require.Equal(t, http.StatusBadRequest, code, "%s: %+v", name, r)
		require.Equal(t, "body", r.field(), "%s: %+v", name, r)
	}
	// A body past the limit without a declared length (chunked) is 413, as one with it is.
	big := `{"mode":"MODE_ASYNC","payload":{"s":"` + strings.Repeat("x", 2<<20) + `"}}`
	req, err := http.NewRequest(http.MethodPost, invoke, io.NopCloser(strings.NewReader(big)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+dbtest.TestAPIKey)
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = -1
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", raw)
	require.Contains(t, string(raw), `"field":"body"`)
	require.Zero(t, executions(t, b), "nothing written")

	// A client's Grpc-Timeout is no deadline of the REST API's: it is not answered 503 with
	// Retry-After (the gateway down, retry) when it passes.
	for _, timeout := range []string{"1n", "zzz"} {
		req, err := http.NewRequest(http.MethodGet, b.url+"/v1/executions", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+dbtest.TestAPIKey)
		req.Header.Set("Grpc-Timeout", timeout)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "Grpc-Timeout %s", timeout)
		require.Empty(t, resp.Header.Get("Retry-After"))
	}

	// Wrong methods: 405 with what the path allows.
	for _, tc := range []struct{ method, url, allow string }{
		{http.MethodDelete, b.url + "/v1/executions/" + uuid.NewString(), "GET"},
		{http.MethodGet, invoke, "POST"},
		{http.MethodPost, b.url + "/v1/consumer", "PUT"},
		{"BREW", b.url + "/v1/events", "GET"},
	} {
		code, allow, r := send(t, tc.method, tc.url, "", nil)
		require.Equal(t, http.StatusMethodNotAllowed, code, "%s %s: %+v", tc.method, tc.url, r)
		require.Equal(t, tc.allow, allow, "%s %s", tc.method, tc.url)
		require.Equal(t, "method", r.field())
	}
	require.Zero(t, executions(t, b), "the probes behind Allow ran no handler")
	code, _, _ = send(t, http.MethodGet, b.url+"/v1/nowhere", "", nil)
	require.Equal(t, http.StatusNotFound, code)

	// The service still answers.
	code, _, r = send(t, http.MethodPost, invoke, body, map[string]string{"Idempotency-Key": "plain-1"})
	require.Equal(t, http.StatusAccepted, code, "%+v", r)
	require.Equal(t, 1, executions(t, b))
}
