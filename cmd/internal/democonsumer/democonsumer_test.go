package democonsumer_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/cmd/internal/democonsumer"
)

const body = `{"id":"evt_1","type":"execution.completed","timestamp":"2026-01-01T00:00:00Z",
  "data":{"execution_id":"exec_1","capability":"dummy.echo","status":"succeeded","attempt":2,
          "result":{ "echo": {"msg": "hi"}, "attempt": 2 }}}`

// lockedBuffer is an io.Writer safe for the handler's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func post(t *testing.T, h http.Handler, secret, id string) int {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/events", strings.NewReader(body))
	require.NoError(t, webhooks.SetHeaders(req.Header, []string{secret}, id, time.Now(), []byte(body)))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

func TestEvents(t *testing.T) {
	t.Parallel()
	secret, err := webhooks.NewSecret()
	require.NoError(t, err)
	other, err := webhooks.NewSecret()
	require.NoError(t, err)
	out := &lockedBuffer{}
	h := democonsumer.New(democonsumer.StaticSecret(secret), out, zaptest.NewLogger(t))

	require.Equal(t, http.StatusNoContent, post(t, h, secret, "evt_1"))
	require.Equal(t, http.StatusUnauthorized, post(t, h, other, "evt_2"))
	require.Equal(t, http.StatusNoContent, post(t, h, secret, "evt_1"))

	require.Equal(t,
		`event evt_1 execution.completed execution=exec_1 status=succeeded attempt=2 result={"echo":{"msg":"hi"},"attempt":2}`+"\n"+
			`event evt_1 execution.completed execution=exec_1 status=succeeded attempt=2 result={"echo":{"msg":"hi"},"attempt":2} (duplicate, ignored)`+"\n",
		out.String())
}

func TestSecretFileIsReadOnEachRequest(t *testing.T) {
	t.Parallel()
	secret, err := webhooks.NewSecret()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "secret")
	h := democonsumer.New(democonsumer.FileSecret(path), &lockedBuffer{}, zaptest.NewLogger(t))

	require.Equal(t, http.StatusServiceUnavailable, post(t, h, secret, "evt_1"))
	require.NoError(t, os.WriteFile(path, []byte(secret+"\n"), 0o600))
	require.Equal(t, http.StatusNoContent, post(t, h, secret, "evt_1"))
}
