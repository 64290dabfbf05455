package httpapi_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/freeport"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
)

// TestRESTOverTLSSpeaksHTTP2: the REST port with a certificate negotiates HTTP/2 with a client
// that offers it, and still serves an HTTP/1.1-only client.
func TestRESTOverTLSSpeaksHTTP2(t *testing.T) {
	dir := t.TempDir()
	_, err := devca.Ensure(dir, "gateway")
	require.NoError(t, err)
	src, err := tlsx.NewSource(tlsx.Files{CertFile: devca.CertFile(dir, devca.Public), KeyFile: devca.KeyFile(dir, devca.Public)})
	require.NoError(t, err)
	roots, err := tlsx.NewSource(tlsx.Files{CAFile: devca.CAFile(dir)})
	require.NoError(t, err)

	addr, err := freeport.Addr() // outside the ephemeral range: a closed port there can connect to itself
	require.NoError(t, err)
	log := zaptest.NewLogger(t)
	app := lifecycle.New(log, lifecycle.Timeouts{Drain: 0, Soft: time.Second, Hard: 2 * time.Second})
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, httpapi.Run(ctx, app, log, neverCalled{t: t}, httpapi.Config{
		Addr: addr, MaxBodyBytes: 1 << 20, TLS: src, Extra: map[string]http.Handler{"/probe": ok},
	}))
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done }) //nolint:errcheck // Run's end after the cancel; what it served is checked below

	get := func(tr *http.Transport) *http.Response {
		t.Helper()
		client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		var resp *http.Response
		require.Eventually(t, func() bool { // the server starts serving in app.Run's goroutine
			var err error
			resp, err = client.Get("https://" + addr + "/probe")
			return err == nil
		}, 5*time.Second, 20*time.Millisecond)
		_ = resp.Body.Close()
		return resp
	}
	tlsCfg := &tls.Config{RootCAs: roots.Pool(), MinVersion: tls.VersionTLS12}
	resp := get(&http.Transport{TLSClientConfig: tlsCfg.Clone(), ForceAttemptHTTP2: true})
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, "HTTP/2.0", resp.Proto, "a client offering h2 gets HTTP/2")

	h1 := tlsCfg.Clone()
	h1.NextProtos = []string{"http/1.1"}
	resp = get(&http.Transport{TLSClientConfig: h1, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}})
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, "HTTP/1.1", resp.Proto, "an HTTP/1.1-only client is still served")
}
