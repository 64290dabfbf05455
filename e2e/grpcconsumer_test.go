package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// grpcCall is one Deliver call as the consumer got it, verified.
type grpcCall struct {
	md          metadata.MD
	req         *eventsv1.DeliverRequest
	executionID string
}

// grpcConsumer is an application's EventConsumerService, as a client application would serve
// it: every call verified with sdk/go/webhooks's interceptor before the handler, which records
// it.
type grpcConsumer struct {
	eventsv1.UnimplementedEventConsumerServiceServer
	addr    string
	caPEM   string // the CA its certificate chains to; empty when plaintext
	secrets atomic.Pointer[[]string]
	calls   chan grpcCall
}

func (c *grpcConsumer) Deliver(ctx context.Context, req *eventsv1.DeliverRequest) (*eventsv1.DeliverResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c.calls <- grpcCall{md: md, req: req, executionID: req.GetData().GetFields()["execution_id"].GetStringValue()}
	return &eventsv1.DeliverResponse{}, nil
}

// newGRPCConsumer serves a consumer on loopback: over TLS with a certificate for 127.0.0.1 from a
// CA of its own, or plaintext.
func newGRPCConsumer(t *testing.T, plaintext bool) *grpcConsumer {
	t.Helper()
	c := &grpcConsumer{calls: make(chan grpcCall, 100)}
	c.secrets.Store(&[]string{})
	verify := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return webhooks.UnaryServerInterceptor(*c.secrets.Load()...)(ctx, req, info, h)
	}
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(verify)}
	if !plaintext {
		dir := t.TempDir()
		ca, err := devca.NewCA(dir)
		require.NoError(t, err)
		certFile, keyFile := filepath.Join(dir, "consumer.pem"), filepath.Join(dir, "consumer-key.pem")
		require.NoError(t, ca.IssueTemplate(certFile, keyFile, &x509.Certificate{Subject: pkix.Name{CommonName: "consumer"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}))
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		require.NoError(t, err)
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))
		c.caPEM = string(mustRead(t, devca.CAFile(dir)))
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(opts...)
	eventsv1.RegisterEventConsumerServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c.addr = lis.Addr().String()
	return c
}

// trust makes the consumer accept deliveries signed with any of secrets.
func (c *grpcConsumer) trust(secrets ...string) { c.secrets.Store(&secrets) }

// callFor waits for the consumer's call about an execution.
func (c *grpcConsumer) callFor(t *testing.T, executionID string) grpcCall {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case call := <-c.calls:
			if call.executionID == executionID {
				return call
			}
		case <-timeout:
			t.Fatalf("no Deliver call for %s within 30s", executionID)
		}
	}
}

// assertSigned checks that call verifies with each of secrets on its own, with sdk/go/webhooks
// and with the Standard Webhooks reference library, and carries one signature per secret.
func assertSigned(t *testing.T, call grpcCall, secrets ...string) {
	t.Helper()
	h := http.Header{}
	for _, k := range []string{webhooks.HeaderID, webhooks.HeaderTimestamp, webhooks.HeaderSignature} {
		for _, v := range call.md.Get(k) {
			h.Add(k, v)
		}
	}
	assert.Len(t, strings.Fields(h.Get(webhooks.HeaderSignature)), len(secrets), "one signature per secret")
	for _, s := range secrets {
		assert.NoError(t, webhooks.VerifyDelivery(call.md, call.req, s))
		wh, err := standardwebhooks.NewWebhook(s)
		require.NoError(t, err)
		assert.NoError(t, wh.Verify(call.req.GetBody(), h), "the reference library verifies body and metadata")
	}
}

// TestGRPCConsumer proves, on the running services, that a gRPC consumer over TLS — its
// certificate from a CA registered with it — receives events signed as webhooks are, with the
// application's secret, and with both secrets during a rotation's overlap; that a plaintext
// target is taken (and still signed) where http webhooks are allowed, as in this dev stack; and
// that it is refused at registration, naming the field, where they are not.
func TestGRPCConsumer(t *testing.T) {
	s := newStackScaled(t, eventsScale)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	s.Env = append(s.Env, "INTEGRATIONS_DELIVERY_TIMEOUT=2s")
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")

	register := func(t *testing.T, consumer map[string]any) (int, map[string]any) {
		t.Helper()
		b, err := json.Marshal(map[string]any{"grpc": consumer})
		require.NoError(t, err)
		return s.call(http.MethodPut, "/v1/consumer", s.APIKey, b)
	}

	t.Run("over TLS with a registered CA, every delivery signed, both secrets during a rotation", func(t *testing.T) {
		c := newGRPCConsumer(t, false)
		code, body := register(t, map[string]any{"target": c.addr, "ca_pem": c.caPEM})
		require.Equal(t, http.StatusOK, code, "%v", body)
		grpcBody, _ := body["grpc"].(map[string]any)
		assert.Equal(t, false, grpcBody["plaintext"], "TLS unless asked otherwise")
		assert.Equal(t, c.caPEM, grpcBody["ca_pem"])
		first := body["signing_secret"].(string)
		c.trust(first)

		id := s.invokeAs(t, s.APIKey, "dummy.long", `{"to": "grpc+tls"}`)
		call := c.callFor(t, id)
		assertSigned(t, call, first)
		require.Eventually(t, func() bool { return s.eventOf(t, s.APIKey, id)["status"] == "EVENT_STATUS_DELIVERED" },
			30*time.Second, 50*time.Millisecond)

		code, body = s.call(http.MethodPost, "/v1/consumer:rotate-secret", s.APIKey, []byte(`{}`))
		require.Equal(t, http.StatusOK, code, "%v", body)
		second := body["signing_secret"].(string)
		c.trust(second) // the receiver switched at once: the old signature no longer helps it
		id = s.invokeAs(t, s.APIKey, "dummy.long", `{"to": "grpc+tls", "after": "rotation"}`)
		call = c.callFor(t, id)
		assertSigned(t, call, second, first)
		require.Eventually(t, func() bool { return s.eventOf(t, s.APIKey, id)["status"] == "EVENT_STATUS_DELIVERED" },
			30*time.Second, 50*time.Millisecond)
	})

	t.Run("plaintext where http webhooks are allowed, still signed", func(t *testing.T) {
		c := newGRPCConsumer(t, true)
		code, body := register(t, map[string]any{"target": c.addr, "plaintext": true})
		require.Equal(t, http.StatusOK, code, "%v", body)
		secret := body["signing_secret"].(string)
		c.trust(secret)
		id := s.invokeAs(t, s.APIKey, "dummy.long", `{"to": "grpc"}`)
		call := c.callFor(t, id)
		require.Len(t, call.md.Get(webhooks.HeaderSignature), 1)
		assert.NoError(t, webhooks.VerifyDelivery(call.md, call.req, secret))

		code, body = register(t, map[string]any{"target": c.addr, "plaintext": true, "ca_pem": newGRPCConsumer(t, false).caPEM})
		assert.Equal(t, http.StatusBadRequest, code, "%v", body)
		assert.Contains(t, fmt.Sprint(body), "grpc.ca_pem")
		code, body = register(t, map[string]any{"target": c.addr, "ca_pem": "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"})
		assert.Equal(t, http.StatusBadRequest, code, "%v", body)
		assert.Contains(t, fmt.Sprint(body), "grpc.ca_pem")
	})

	t.Run("plaintext refused at registration where http webhooks are not allowed", func(t *testing.T) {
		strictHTTP := freeAddr(t)
		s.ProgramEnv["gateway-strict"] = []string{"INTEGRATIONS_HTTP_ADDR=" + strictHTTP, "INTEGRATIONS_WEBHOOK_ALLOW_HTTP=false"}
		s.startInstance("gateway-strict", "gateway")
		put := func(body string) (int, string) {
			req, err := http.NewRequest(http.MethodPut, s.Scheme()+strictHTTP+"/v1/consumer", strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+s.APIKey)
			resp, err := s.http.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		c := newGRPCConsumer(t, false)
		code, body := put(`{"grpc": {"target": "` + c.addr + `", "plaintext": true}}`)
		assert.Equal(t, http.StatusBadRequest, code, body)
		assert.Contains(t, body, "grpc.plaintext")
		assert.Contains(t, body, "INTEGRATIONS_WEBHOOK_ALLOW_HTTP")
		b, err := json.Marshal(map[string]any{"grpc": map[string]any{"target": c.addr, "ca_pem": c.caPEM}})
		require.NoError(t, err)
		code, body = put(string(b))
		assert.Equal(t, http.StatusOK, code, "the same target over TLS is taken: %s", body)
	})
}
