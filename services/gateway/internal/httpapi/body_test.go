package httpapi_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/services/gateway/internal/httpapi"
)

// rawBodyServer serves the REST API with a read timeout over a service that fails the test when
// called: a request whose body cannot be read is refused before any call is made.
func rawBodyServer(t *testing.T, readTimeout time.Duration) string {
	t.Helper()
	h, err := httpapi.Handler(context.Background(), neverCalled{t: t}, httpapi.Config{MaxBodyBytes: 1 << 20})
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadTimeout = readTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// rawRequest writes head+body on a new connection and answers the response's status and body.
func rawRequest(t *testing.T, addr, request string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, request)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(raw)
}

// A body not received within the read timeout is 408 naming body, and any other read error 400
// naming body: neither quotes the network error (it named the server's socket).
func TestBodyReadFailuresAreNamedWithoutNetworkText(t *testing.T) {
	t.Parallel()
	addr := rawBodyServer(t, 300*time.Millisecond)
	head := "POST /v1/capabilities/test.echo:invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

	code, body := rawRequest(t, addr, head+"Content-Length: 1000\r\n\r\n{\"mode\":")
	require.Equal(t, http.StatusRequestTimeout, code, body)
	require.Contains(t, body, `"field":"body"`)
	require.Contains(t, body, "not received within the read timeout")
	for _, leak := range []string{"tcp", "127.0.0.1", "timeout:", "i/o"} {
		require.NotContains(t, body, leak)
	}

	code, body = rawRequest(t, addr, head+"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, `"field":"body"`)
	require.Contains(t, body, "could not be read")
	require.NotContains(t, body, "chunk", "the reader's error is not quoted")

	// A body cut short by the client (fewer bytes than its Content-Length, then EOF).
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, err = fmt.Fprint(conn, head+"Content-Length: 1000\r\n\r\n{\"mode\":")
	require.NoError(t, err)
	require.NoError(t, conn.(*net.TCPConn).CloseWrite())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", raw)
	require.Contains(t, string(raw), "could not be read")
	require.False(t, strings.Contains(string(raw), "EOF"), "%s", raw)
}

// Anything after the request's JSON object is refused 400 naming body: grpc-gateway decoded the
// first value and ignored the rest (`{…} xyz` was accepted, a second document dropped).
// Whitespace after the object is not data.
func TestTrailingDataAfterTheBodyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	invoke := b.url + "/v1/capabilities/" + dbtest.TestCapability + ":invoke"
	req := `{"mode":"MODE_ASYNC","payload":{}}`
	for name, body := range map[string]string{
		"a word":                   req + ` xyz`,
		"a second document":        req + `{"mode":"MODE_ASYNC","payload":{"n":2}}`,
		"a closing brace":          req + `}`,
		"a number":                 req + "\n1",
		"two documents, two lines": req + "\n" + req,
	} {
		code, _, r := send(t, http.MethodPost, invoke, body, nil)
		require.Equal(t, http.StatusBadRequest, code, "%s: %+v", name, r)
		require.Equal(t, "body", r.field(), "%s: %+v", name, r)
		require.Contains(t, r.Message, "trailing data after the JSON object", name)
	}
	code, _, r := send(t, http.MethodPut, b.url+"/v1/consumer", `{"webhook":{"url":"https://example.com/"}} x`, nil)
	require.Equal(t, http.StatusBadRequest, code, "every body is decoded whole: %+v", r)
	require.Equal(t, "body", r.field())
	require.Zero(t, executions(t, b), "nothing written")

	code, _, r = send(t, http.MethodPost, invoke, req+" \n\t\r\n", nil)
	require.Equal(t, http.StatusAccepted, code, "whitespace after the object is no data: %+v", r)
	code, _, r = send(t, http.MethodPost, invoke, "", nil)
	require.NotEqual(t, http.StatusInternalServerError, code, "an empty body is still an empty request: %+v", r)
	require.Equal(t, 1, executions(t, b))
}

// neverCalled is a gateway service whose every call fails the test (Unimplemented otherwise).
type neverCalled struct {
	gatewayv1.UnimplementedGatewayServiceServer
	t *testing.T
}

func (n neverCalled) InvokeCapability(context.Context, *gatewayv1.InvokeCapabilityRequest) (*gatewayv1.InvokeCapabilityResponse, error) {
	n.t.Error("InvokeCapability was called for a request whose body could not be read")
	return nil, status.Error(codes.Internal, "called")
}
