package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// acceptCounter is a loopback listener that counts the connections it accepts and answers each
// with HTTP 204, so a connection that got through would deliver: the target that must never be
// reached.
type acceptCounter struct {
	ln      net.Listener
	accepts atomic.Int32
}

func newAcceptCounter(t *testing.T) *acceptCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := &acceptCounter{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.accepts.Add(1)
			_, _ = c.Write([]byte("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"))
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return a
}

func (a *acceptCounter) port() string {
	_, port, _ := net.SplitHostPort(a.ln.Addr().String())
	return port
}

// TestSSRFGuard proves, on the running services with INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE off in
// the gateway and the event router, that a zoned, numeric, mapped or trailing-dot loopback,
// private, link-local or metadata target is refused at registration (400 naming the field,
// nothing written), and that a consumer row pointing at a loopback listener written straight
// into the database — bypassing registration — is never connected to: every delivery attempt is
// recorded as refused_address, which is all the tenant is shown. Addresses in
// INTEGRATIONS_WEBHOOK_DENY_CIDRS are refused at registration too.
func TestSSRFGuard(t *testing.T) {
	s := newStackScaled(t, eventsScale)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	s.Env = append(s.Env, "INTEGRATIONS_DELIVERY_TIMEOUT=2s")
	// The operator's deny list (here a public range) is read by both services and refused at
	// registration like the built-in special-purpose ranges.
	strict := []string{"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE=false", "INTEGRATIONS_WEBHOOK_DENY_CIDRS=93.184.216.0/24, 2606:4700::/32"}
	s.ProgramEnv["gateway"] = strict
	s.ProgramEnv["event-router"] = strict
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	target := newAcceptCounter(t)
	port := target.port()
	ctx := context.Background()

	endpoint := func() (kind, endpoint *string) {
		require.NoError(t, s.schema.Pool.QueryRow(ctx,
			`SELECT consumer_kind, consumer_endpoint FROM applications WHERE id = 'dev-app'`).Scan(&kind, &endpoint))
		return kind, endpoint
	}

	t.Run("registration refuses every form of a private target with 400 naming the field", func(t *testing.T) {
		urls := []string{
			"http://[::1%25lo]:" + port + "/hook", "http://[fe80::1%25eth0]/", "http://[fd00:ec2::254%25eth0]/latest",
			"http://2130706433:" + port + "/", "http://0x7f000001:" + port + "/", "http://0177.0.0.1:" + port + "/",
			"http://127.1:" + port + "/", "http://0:" + port + "/", "http://localhost.:" + port + "/",
			"http://127.0.0.1.:" + port + "/", "http://[::ffff:127.0.0.1]:" + port + "/", "http://127.0.0.1:" + port + "/",
			"http://localhost:" + port + "/", "http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/",
			"http://[fd00:ec2::254]/", "http://100.100.100.200/", "http://user:pw@hooks.example.com/",
			"https://hooks.example.com/" + strings.Repeat("a", 2100),
			"https://93.184.216.34/hook", "https://[2606:4700::1111]/hook", // INTEGRATIONS_WEBHOOK_DENY_CIDRS
		}
		for _, url := range urls {
			code, body := s.call(http.MethodPut, "/v1/consumer", s.APIKey, []byte(`{"webhook": {"url": "`+url+`"}}`))
			assert.Equal(t, http.StatusBadRequest, code, "%s: %v", url, body)
			assert.Contains(t, fmt.Sprint(body), "webhook.url", url)
		}
		for _, tg := range []string{"[::1%25lo]:" + port, "[::1%lo]:" + port, "2130706433:" + port, "localhost.:" + port,
			"127.0.0.1:" + port, "[fe80::1%eth0]:" + port} {
			code, body := s.call(http.MethodPut, "/v1/consumer", s.APIKey, []byte(`{"grpc": {"target": "`+tg+`"}}`))
			assert.Equal(t, http.StatusBadRequest, code, "%s: %v", tg, body)
			assert.Contains(t, fmt.Sprint(body), "grpc.target", tg)
		}
		kind, ep := endpoint()
		assert.Nil(t, kind, "nothing written")
		assert.Nil(t, ep, "nothing written")
	})

	t.Run("a consumer row written past registration is never dialled; the tenant sees refused_address", func(t *testing.T) {
		// A registration through the API gives the application its signing secret, so the
		// deliverer gets as far as dialling; then the endpoint is rewritten in the database.
		code, body := s.call(http.MethodPut, "/v1/consumer", s.APIKey, []byte(`{"webhook": {"url": "https://hooks.example.com/in"}}`))
		require.Equal(t, http.StatusOK, code, "%v", body)
		for _, c := range []struct{ kind, endpoint string }{
			{"webhook", "http://127.0.0.1:" + port + "/hook"},
			{"webhook", "http://localhost:" + port + "/hook"},
			{"webhook", "http://[::1%25lo]:" + port + "/hook"},
			{"webhook", "http://2130706433:" + port + "/hook"},
			{"webhook", "http://localhost.:" + port + "/hook"},
			{"grpc", "127.0.0.1:" + port},
			{"grpc", "[::1%lo]:" + port},
		} {
			_, err := s.schema.Pool.Exec(ctx, `UPDATE applications SET consumer_kind = $1, consumer_endpoint = $2 WHERE id = 'dev-app'`,
				c.kind, c.endpoint)
			require.NoError(t, err)
			id := s.invokeAs(t, s.APIKey, "dummy.long", `{"to": "loopback"}`)
			var ev map[string]any
			require.Eventually(t, func() bool {
				ev = s.eventOf(t, s.APIKey, id)
				return ev["status"] == "EVENT_STATUS_DEAD"
			}, 60*time.Second, 50*time.Millisecond, "%s: the event dies after its attempts", c.endpoint)
			assert.Equal(t, "refused_address", ev["last_error"], c.endpoint)
			deliveries, _ := ev["deliveries"].([]any)
			require.Len(t, deliveries, 6, c.endpoint)
			for _, d := range deliveries {
				d := d.(map[string]any)
				assert.Equal(t, "refused_address", d["error"], c.endpoint)
				assert.EqualValues(t, 0, d["status_code"], "%s: nothing answered", c.endpoint)
			}
		}
		assert.Zero(t, target.accepts.Load(), "the loopback listener was never connected to")
		assert.NotContains(t, s.Log("event-router"), "panic")
	})
}
