package server

import (
	"context"
	"encoding/pem"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/integrations-platform/integrations/pkg/tlsx/devca"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/webhook"
)

// fakeResolver answers from a map keyed by rooted names, case-insensitively as DNS does: a
// resolver asked for "name." answers for that name only, never under a search domain, so an
// unrooted key stands for what a search domain would expand, and a name it does not know fails
// to resolve. "::ffff:a.b.c.d" is answered in its 16-byte form, as Go's resolver answers
// /etc/hosts entries.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	ss, ok := f[strings.ToLower(host)]
	if !ok {
		return nil, errors.New("no such host")
	}
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		a := netip.MustParseAddr(s)
		if strings.HasPrefix(s, "::ffff:") {
			a = netip.AddrFrom16(a.As16())
		}
		out[i] = a
	}
	return out, nil
}

var testResolver = fakeResolver{
	"hooks.example.com.":    {"93.184.216.34"},
	"internal.example.com.": {"10.0.0.7", "fd00::7"},
	"rebind.example.com.":   {"127.0.0.1"},
	"meta.example.com.":     {"169.254.169.254"},
	"mixed.example.com.":    {"10.0.0.7", "93.184.216.34"},
	// Pinned in /etc/hosts.
	"pinned.example.com.":   {"::ffff:93.184.216.34"},
	"pinnedlo.example.com.": {"::ffff:127.0.0.1"},
	// What "kubernetes.default" resolves to through a Kubernetes search domain, unrooted.
	"kubernetes.default":                    {"10.96.0.1"},
	"kubernetes.default.svc.cluster.local.": {"10.96.0.1"},
}

func webhookReq(url string) *gatewayv1.SetConsumerRequest {
	return &gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: url}}}
}

func grpcReq(target string) *gatewayv1.SetConsumerRequest {
	return &gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Grpc{Grpc: &gatewayv1.GrpcConsumer{Target: target}}}
}

func consumerRow(t *testing.T, b *bundle) (kind, endpoint *string) {
	t.Helper()
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT consumer_kind, consumer_endpoint FROM applications WHERE id = $1`, dbtest.TestApp).Scan(&kind, &endpoint))
	return kind, endpoint
}

// TestSetConsumerRefusesEveryFormOfAPrivateTarget: with private targets refused, registration
// refuses every zoned, numeric, mapped, trailing-dot, internal, metadata, over-long or otherwise
// ambiguous endpoint, and every name that resolves only to private addresses, with
// INVALID_ARGUMENT naming the field and a message that does not repeat the input; nothing is
// written. Public endpoints, and names that do not resolve, are accepted.
func TestSetConsumerRefusesEveryFormOfAPrivateTarget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.server.opts.Resolver = testResolver

	refusedURLs := []string{
		"https://[::1%25lo]/", "https://[fe80::1%25eth0]/", "https://[fd00:ec2::254%25eth0]/",
		"https://[::1]/", "https://[::ffff:127.0.0.1]/", "https://[::ffff:169.254.169.254]/",
		"https://[64:ff9b::a9fe:a9fe]/", "https://[::127.0.0.1]/", "https://[2002:7f00:1::]/",
		"https://2130706433/", "https://0x7f000001/", "https://0177.0.0.1/", "https://127.1/",
		"https://0/", "https://0x7f.0.0.1/", "https://127.0.0.1/", "https://10.0.0.1/",
		"https://169.254.169.254/latest/meta-data/", "https://100.100.100.200/",
		"https://localhost/", "https://localhost./", "https://127.0.0.1./", "https://LOCALHOST/",
		"https://a.localhost/", "https://metadata.google.internal/", "https://metadata/",
		"https://instance-data/", "https://metadata.goog/", "https://kubernetes.default.svc/",
		"https://user:pw@hooks.example.com/", "https://%6c%6f%63%61%6c%68%6f%73%74/",
		"https://１２７.０.０.１/", "ftp://hooks.example.com/", "http://hooks.example.com/",
		"https://hooks.example.com:0/", "https:///x", "", "https://hooks.example.com/" + strings.Repeat("a", webhook.MaxEndpointLength),
		// Names that resolve only to private addresses: the courtesy check.
		"https://internal.example.com/", "https://rebind.example.com/", "https://meta.example.com/",
		"https://pinnedlo.example.com/",
	}
	for _, url := range refusedURLs {
		_, err := b.server.SetConsumer(b.ctx, webhookReq(url))
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c, "%q: %v", url, err)
		require.Equal(t, "webhook.url", field(err), url)
		if len(url) > 10 {
			require.NotContains(t, err.Error(), url[8:], "the refusal does not echo the input")
		}
		kind, _ := consumerRow(t, b)
		require.Nil(t, kind, "%q: nothing written", url)
	}

	refusedTargets := []string{
		"[::1%25lo]:9000", "[::1%lo]:9000", "[fe80::1%eth0]:9000", "[fd00:ec2::254%eth0]:80",
		"2130706433:9000", "0x7f000001:9000", "0177.0.0.1:9000", "127.1:9000", "localhost.:9000",
		"127.0.0.1.:9000", "[::ffff:127.0.0.1]:9000", "metadata.google.internal:80", "metadata:80",
		"internal.example.com:443", "rebind.example.com:443", "unix:///tmp/x:1",
	}
	for _, target := range refusedTargets {
		_, err := b.server.SetConsumer(b.ctx, grpcReq(target))
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c, "%q: %v", target, err)
		require.Equal(t, "grpc.target", field(err), target)
		kind, _ := consumerRow(t, b)
		require.Nil(t, kind, "%q: nothing written", target)
	}

	for _, url := range []string{
		"https://hooks.example.com/in",
		"https://mixed.example.com/in",         // a public address among them: the router skips the private one
		"https://not-resolving.example.com/in", // a resolution failure is not a refusal
		"https://93.184.216.34/in",
		"https://pinned.example.com/in", // pinned in /etc/hosts: ::ffff:93.184.216.34 is 93.184.216.34
		// Looked up rooted, never under the search domains: an internal name is accepted just as
		// a nonexistent one is, so registration tells nothing of which internal names exist.
		"https://kubernetes.default/in",
	} {
		resp, err := b.server.SetConsumer(b.ctx, webhookReq(url))
		require.NoError(t, err, url)
		require.Equal(t, url, resp.GetWebhook().GetUrl())
		kind, endpoint := consumerRow(t, b)
		require.Equal(t, "webhook", *kind)
		require.Equal(t, url, *endpoint)
	}
}

// TestSetConsumerAllowPrivateKeepsTheSyntacticChecks: INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE lets
// loopback and internal targets through (development, tests) but not zones, numeric forms,
// trailing dots, credentials or over-long URLs; and it skips the courtesy resolution.
func TestSetConsumerAllowPrivateKeepsTheSyntacticChecks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.server.opts.WebhookAllowPrivate = true
	b.server.opts.WebhookAllowHTTP = true
	b.server.opts.Resolver = testResolver

	for _, url := range []string{"http://127.0.0.1:8080/hook", "http://localhost:8080/hook", "http://[::1]:8080/",
		"https://internal.example.com/", "http://consumer:8080/"} {
		_, err := b.server.SetConsumer(b.ctx, webhookReq(url))
		require.NoError(t, err, url)
	}
	_, err := b.server.SetConsumer(b.ctx, grpcReq("localhost:9000"))
	require.NoError(t, err)
	_, err = b.server.SetConsumer(b.ctx, webhookReq("https://hooks.example.com/"))
	require.NoError(t, err)

	for _, url := range []string{"http://[::1%25lo]:8080/", "http://2130706433:8080/", "http://127.1:8080/",
		"http://localhost.:8080/", "http://user@localhost:8080/", "http://%6c%6f%63%61%6c%68%6f%73%74/",
		"http://localhost/" + strings.Repeat("a", webhook.MaxEndpointLength)} {
		_, err := b.server.SetConsumer(b.ctx, webhookReq(url))
		c, _ := code(err)
		assert.Equal(t, codes.InvalidArgument, c, url)
		assert.Equal(t, "webhook.url", field(err), url)
		_, endpoint := consumerRow(t, b)
		assert.Equal(t, "https://hooks.example.com/", *endpoint, "%q: nothing written", url)
	}
}

// TestSetConsumerDenyList: the operator's INTEGRATIONS_WEBHOOK_DENY_CIDRS refuses, at
// registration, literals in the ranges and names resolving only into them, also with
// AllowPrivate; addresses outside them are judged as before.
func TestSetConsumerDenyList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.server.opts.Resolver = testResolver
	b.server.opts.WebhookDeny = []netip.Prefix{netip.MustParsePrefix("93.184.216.0/24")}
	for _, allowPrivate := range []bool{false, true} {
		b.server.opts.WebhookAllowPrivate = allowPrivate
		for _, url := range []string{"https://93.184.216.34/", "https://hooks.example.com/", "https://pinned.example.com/"} {
			_, err := b.server.SetConsumer(b.ctx, webhookReq(url))
			c, _ := code(err)
			require.Equal(t, codes.InvalidArgument, c, "%q (AllowPrivate %v): %v", url, allowPrivate, err)
			require.Equal(t, "webhook.url", field(err), url)
			kind, _ := consumerRow(t, b)
			require.Nil(t, kind, "%q: nothing written", url)
		}
		_, err := b.server.SetConsumer(b.ctx, grpcReq("93.184.216.34:443"))
		c, _ := code(err)
		require.Equal(t, codes.InvalidArgument, c, "%v", err)
		require.Equal(t, "grpc.target", field(err))
	}
	_, err := b.server.SetConsumer(b.ctx, webhookReq("https://127.0.0.1/"))
	require.NoError(t, err, "AllowPrivate: loopback is not in the deny list")
	b.server.opts.WebhookAllowPrivate = false
	_, err = b.server.SetConsumer(b.ctx, webhookReq("https://mixed.example.com/"))
	require.ErrorContains(t, err, "resolves only", "10.0.0.7 is private, 93.184.216.34 denied")
	_, err = b.server.SetConsumer(b.ctx, webhookReq("https://93.184.217.1/"))
	require.NoError(t, err)
}

// TestEventsShowRawDeliveryErrorsAsOther: a delivery error stored as raw network text (rows
// recorded before errors were categories) is shown to the tenant as "other", in the event's
// last_error, every attempt's error, and the list.
func TestEventsShowRawDeliveryErrorsAsOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := insertEvent(t, b, testEvent{attempts: 2, deliveries: 2})
	raw := "post webhook: Post request: dial tcp 10.0.0.5:22: connect: connection refused"
	_, err := b.schema.Pool.Exec(context.Background(), `UPDATE integration_events SET last_error = $2 WHERE id = $1`, id, raw)
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(context.Background(), `UPDATE event_deliveries SET error = $2 WHERE event_id = $1 AND n = 1`, id, raw)
	require.NoError(t, err)

	resp, err := b.server.GetEvent(b.ctx, &gatewayv1.GetEventRequest{Id: id})
	require.NoError(t, err)
	require.Equal(t, webhook.CategoryOther, resp.GetEvent().GetLastError())
	require.Len(t, resp.GetEvent().GetDeliveries(), 2)
	require.Equal(t, webhook.CategoryOther, resp.GetEvent().GetDeliveries()[0].GetError())
	require.Equal(t, webhook.CategoryHTTPStatus, resp.GetEvent().GetDeliveries()[1].GetError(), "a category is shown as is")

	list, err := b.server.ListEvents(b.ctx, &gatewayv1.ListEventsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetEvents(), 1)
	require.Equal(t, webhook.CategoryOther, list.GetEvents()[0].GetLastError())
}

// caPEM is a CA certificate in PEM, a fresh one each call (devca's, as make run's).
func caPEM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, err := devca.NewCA(dir)
	require.NoError(t, err)
	pem, err := os.ReadFile(devca.CAFile(dir))
	require.NoError(t, err)
	return string(pem)
}

// TestSetConsumerGRPCTransport: a gRPC consumer is TLS unless it asks for plaintext, which is
// refused (grpc.plaintext) unless the deployment allows http webhooks; a CA bundle must be PEM
// certificates within the bound, and never comes with plaintext (grpc.ca_pem). What is accepted
// is stored and answered; nothing is written on a refusal.
func TestSetConsumerGRPCTransport(t *testing.T) {
	t.Parallel()
	ca := caPEM(t)
	yes, no := true, false
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name      string
		consumer  *gatewayv1.GrpcConsumer
		allowHTTP bool
		// wantField is the field refused; "" when accepted.
		wantField string
	}{
		{name: "TLS, system roots", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443"}},
		{name: "TLS said", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", Plaintext: &no}},
		{name: "TLS with a CA", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", CaPem: &ca}},
		{name: "TLS with a CA bundle", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", CaPem: str(ca + "\n" + caPEM(t))}},
		{name: "plaintext refused", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", Plaintext: &yes}, wantField: "grpc.plaintext"},
		{name: "plaintext allowed", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", Plaintext: &yes}, allowHTTP: true},
		{name: "plaintext with a CA", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", Plaintext: &yes, CaPem: &ca},
			allowHTTP: true, wantField: "grpc.ca_pem"},
		{name: "empty CA", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", CaPem: str("")}, wantField: "grpc.ca_pem"},
		{name: "CA not PEM", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", CaPem: str("MIIB...")}, wantField: "grpc.ca_pem"},
		{name: "CA with a private key", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443",
			CaPem: str(ca + string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})))}, wantField: "grpc.ca_pem"},
		{name: "CA too long", consumer: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443",
			CaPem: str(ca + strings.Repeat("\n", webhook.MaxCAPEMLength))}, wantField: "grpc.ca_pem"},
		{name: "bad target first", consumer: &gatewayv1.GrpcConsumer{Target: "127.0.0.1:9000", Plaintext: &yes}, wantField: "grpc.target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.server.opts.WebhookAllowHTTP = tc.allowHTTP

			resp, err := b.server.SetConsumer(b.ctx, &gatewayv1.SetConsumerRequest{
				Consumer: &gatewayv1.SetConsumerRequest_Grpc{Grpc: tc.consumer}})

			var kind *string
			var plaintext bool
			var storedCA *string
			require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
				`SELECT consumer_kind, consumer_grpc_plaintext, consumer_grpc_ca FROM applications WHERE id = $1`,
				dbtest.TestApp).Scan(&kind, &plaintext, &storedCA))
			if tc.wantField != "" {
				c, _ := code(err)
				require.Equal(t, codes.InvalidArgument, c, "%v", err)
				require.Equal(t, tc.wantField, field(err))
				require.NotContains(t, err.Error(), "BEGIN CERTIFICATE", "the input is never repeated")
				require.Nil(t, kind, "nothing written")
				return
			}
			require.NoError(t, err)
			require.Equal(t, "grpc", *kind)
			require.Equal(t, tc.consumer.GetPlaintext(), plaintext)
			require.Equal(t, tc.consumer.CaPem, storedCA)
			got := resp.GetGrpc()
			require.Equal(t, tc.consumer.GetTarget(), got.GetTarget())
			require.NotNil(t, got.Plaintext, "plaintext is always answered")
			require.Equal(t, tc.consumer.GetPlaintext(), got.GetPlaintext())
			require.Equal(t, tc.consumer.CaPem, got.CaPem)
			require.Regexp(t, `^whsec_`, resp.GetSigningSecret(), "a gRPC consumer's deliveries are signed too")
		})
	}
}

// TestSetConsumerSwitchClearsGRPCTransport: re-registering as a webhook, or as a TLS gRPC
// consumer, leaves nothing of a plaintext or CA registration behind.
func TestSetConsumerSwitchClearsGRPCTransport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.server.opts.WebhookAllowHTTP = true
	ca := caPEM(t)
	read := func() (plaintext bool, storedCA *string) {
		require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
			`SELECT consumer_grpc_plaintext, consumer_grpc_ca FROM applications WHERE id = $1`, dbtest.TestApp).Scan(&plaintext, &storedCA))
		return plaintext, storedCA
	}
	_, err := b.server.SetConsumer(b.ctx, &gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Grpc{
		Grpc: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", CaPem: &ca}}})
	require.NoError(t, err)
	_, storedCA := read()
	require.NotNil(t, storedCA)
	_, err = b.server.SetConsumer(b.ctx, webhookReq("https://hooks.example.com/e"))
	require.NoError(t, err)
	plaintext, storedCA := read()
	require.False(t, plaintext)
	require.Nil(t, storedCA)

	yes := true
	_, err = b.server.SetConsumer(b.ctx, &gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Grpc{
		Grpc: &gatewayv1.GrpcConsumer{Target: "consumer.example.com:443", Plaintext: &yes}}})
	require.NoError(t, err)
	plaintext, _ = read()
	require.True(t, plaintext)
	_, err = b.server.SetConsumer(b.ctx, grpcReq("consumer.example.com:443"))
	require.NoError(t, err)
	plaintext, storedCA = read()
	require.False(t, plaintext, "leaving plaintext out means TLS")
	require.Nil(t, storedCA)
}
