package deliver

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/freeport"
	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// fakeDNS serves DNS on a loopback UDP port and returns a resolver that asks only it: every name
// has the A record answer, except names starting "nx." which do not exist. It is how a test makes
// a public-looking name resolve to a private address, as a rebinding attacker's DNS would.
func fakeDNS(t *testing.T, answer string) *net.Resolver {
	t.Helper()
	r, _ := fakeDNSAsked(t, answer)
	return r
}

// askedNames records the names a fakeDNS was asked for, as they came on the wire.
type askedNames struct {
	mu    sync.Mutex
	names []string
}

func (a *askedNames) add(n string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.names = append(a.names, n)
}

func (a *askedNames) all() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.names...)
}

// fakeDNSAsked is fakeDNS that also records the names asked for.
func fakeDNSAsked(t *testing.T, answer string) (*net.Resolver, *askedNames) {
	t.Helper()
	asked := &askedNames{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	a := net.ParseIP(answer).To4()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			asked.add(q.Name.String())
			rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionAvailable: true}
			if strings.HasPrefix(q.Name.String(), "nx.") {
				rh.RCode = dnsmessage.RCodeNameError
			}
			b := dnsmessage.NewBuilder(nil, rh)
			b.EnableCompression()
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			if q.Type == dnsmessage.TypeA && rh.RCode == dnsmessage.RCodeSuccess {
				_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1},
					dnsmessage.AResource{A: [4]byte(a)})
			}
			msg, err := b.Finish()
			if err == nil {
				_, _ = pc.WriteTo(msg, from)
			}
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}, asked
}

// countingListener is a loopback HTTP server that answers 200 and counts the connections it
// accepts: the target that must never be reached.
func countingListener(t *testing.T) (port string, accepts *atomic.Int32) {
	t.Helper()
	accepts = &atomic.Int32{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepts.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	return port, accepts
}

// TestDialGuardNeverDialsAPrivateAddress: with private addresses refused, consumer rows written
// straight into the database (as if registration had been bypassed) that reach a loopback
// listener — through a public-looking name whose DNS answers 127.0.0.1, or through a zoned,
// numeric, mapped or trailing-dot form — are never connected to; every attempt is recorded as
// refused_address, without raw network text, and the events die after their budget.
func TestDialGuardNeverDialsAPrivateAddress(t *testing.T) {
	t.Parallel()
	b := setup(t, options{strict: true, resolver: fakeDNS(t, "127.0.0.1"),
		delays: []time.Duration{50 * time.Millisecond}, timeout: time.Second})
	port, accepts := countingListener(t)

	rebindURL := "http://rebind.example.com:" + port + "/hook"
	_, err := webhook.Policy{AllowHTTP: true}.CheckURL(rebindURL)
	require.NoError(t, err, "the name passes every check before resolution: only the dial-time guard stops it")

	consumers := []struct{ kind, endpoint string }{
		{"webhook", rebindURL},
		{"grpc", "rebind.example.com:" + port},
		{"webhook", "http://127.0.0.1:" + port + "/"},
		{"webhook", "http://localhost:" + port + "/"},
		{"webhook", "http://localhost.:" + port + "/"},
		{"webhook", "http://[::1%25lo]:" + port + "/"},
		{"webhook", "http://[::ffff:127.0.0.1]:" + port + "/"},
		{"webhook", "http://2130706433:" + port + "/"},
		{"webhook", "http://0x7f000001:" + port + "/"},
		{"webhook", "http://127.1:" + port + "/"},
		{"grpc", "127.0.0.1:" + port},
		{"grpc", "[::1%lo]:" + port},
		{"grpc", "2130706433:" + port},
	}
	ids := make([]string, len(consumers))
	for i, c := range consumers {
		app := fmt.Sprintf("ssrf-%d", i)
		hash := sha256.Sum256([]byte(app))
		_, err := b.s.Pool.Exec(context.Background(), `INSERT INTO applications (id, name, api_key_hash) VALUES ($1, $1, $2)`, app, hash[:])
		require.NoError(t, err)
		b.setConsumer(t, app, c.kind, c.endpoint)
		ids[i] = b.newEvent(t, app)
	}
	for i, id := range ids {
		b.awaitStatus(t, id, "dead", 20*time.Second)
		rows := b.deliveries(t, id)
		require.Len(t, rows, 2, "%s: both attempts recorded", consumers[i].endpoint)
		for _, r := range rows {
			assert.Nil(t, r.code, consumers[i].endpoint)
			require.NotNil(t, r.err, consumers[i].endpoint)
			assert.Equal(t, webhook.CategoryRefusedAddress, *r.err, consumers[i].endpoint)
		}
		var lastErr string
		require.NoError(t, b.s.Pool.QueryRow(context.Background(),
			`SELECT last_error FROM integration_events WHERE id = $1`, id).Scan(&lastErr))
		assert.Equal(t, webhook.CategoryRefusedAddress, lastErr)
	}
	assert.Zero(t, accepts.Load(), "the loopback listener was never connected to")
}

// TestRedirectIsNotFollowed: a webhook answering 302 to another address is a failed attempt
// (http_status, the code recorded); the redirect's target is never connected to.
func TestRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	b := setup(t, options{delays: []time.Duration{50 * time.Millisecond}})
	port, accepts := countingListener(t)
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://127.0.0.1:"+port+"/latest/meta-data/", http.StatusFound)
	})
	b.setConsumer(t, dbtest.TestApp, "webhook", rc.srv.URL)
	id := b.newEvent(t, dbtest.TestApp)

	b.awaitStatus(t, id, "dead", 10*time.Second)
	rows := b.deliveries(t, id)
	require.Len(t, rows, 2)
	for _, r := range rows {
		require.NotNil(t, r.code)
		assert.Equal(t, http.StatusFound, *r.code)
		require.NotNil(t, r.err)
		assert.Equal(t, webhook.CategoryHTTPStatus, *r.err)
	}
	assert.Len(t, rc.requests(), 2)
	assert.Zero(t, accepts.Load(), "the redirect was not followed")
}

// TestAttemptCategories: each way a webhook or gRPC attempt fails is told by its category.
func TestAttemptCategories(t *testing.T) {
	t.Parallel()
	secret, err := webhooks.NewSecret()
	require.NoError(t, err)
	ev := &store.Delivery{EventID: "evt-1", Type: "execution.completed", CreatedAt: time.Now(),
		Payload: []byte(`{"type":"execution.completed","data":{"status":"succeeded"}}`)}
	dev := webhook.Policy{AllowPrivate: true, AllowHTTP: true}
	resolver := fakeDNS(t, "127.0.0.1")

	closedAddr, err := freeport.Addr() // nothing listens there (outside the ephemeral range: see pkg/freeport)
	require.NoError(t, err)

	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(plain.Close)
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(untrusted.Close)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	t.Cleanup(failing.Close)
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) })
	hangup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(hangup.Close)
	_, plainPort, _ := net.SplitHostPort(plain.Listener.Addr().String())

	for _, tc := range []struct {
		name     string
		policy   webhook.Policy
		url      string
		category string
		code     int
	}{
		{"connection refused", dev, "http://" + closedAddr + "/", webhook.CategoryConnectionRefused, 0},
		{"https to a plain server", dev, "https://" + plain.Listener.Addr().String() + "/", webhook.CategoryTLS, 0},
		{"untrusted certificate", dev, untrusted.URL, webhook.CategoryTLS, 0},
		{"no answer in time", dev, hanging.URL, webhook.CategoryTimeout, 0},
		{"connection closed", dev, hangup.URL, webhook.CategoryConnectionClosed, 0},
		{"status", dev, failing.URL, webhook.CategoryHTTPStatus, http.StatusBadGateway},
		{"name does not resolve", dev, "http://nx.example.com:" + plainPort + "/", webhook.CategoryDNS, 0},
		{"resolves to loopback", webhook.Policy{AllowHTTP: true}, "http://rebind.example.com:" + plainPort + "/", webhook.CategoryRefusedAddress, 0},
		{"refused before dialling", dev, "http://[::1%25lo]:" + plainPort + "/", webhook.CategoryRefusedAddress, 0},
		{"delivered", dev, plain.URL, "", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Only the hanging receiver is meant to run out of time; every other case gets a bound
			// a loaded machine cannot reach (a TLS handshake under a load of 18 outran 500 ms and
			// came out "timeout", issue 22).
			wait := 30 * time.Second
			if tc.category == webhook.CategoryTimeout {
				wait = 500 * time.Millisecond
			}
			c := newWebhookClient(wait, tc.policy, resolver)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			res := c.post(ctx, tc.url, []string{secret}, ev, 1)
			assert.Equal(t, tc.category, res.category, "%v", res.err)
			assert.Equal(t, tc.code, res.statusCode)
			assert.Equal(t, tc.category == "", res.err == nil, "%v", res.err)
		})
	}

	// gRPC consumers.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	eventsv1.RegisterEventConsumerServiceServer(srv, unavailableConsumer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	_, grpcPort, _ := net.SplitHostPort(lis.Addr().String())
	// Over TLS, a consumer whose certificate is for *.example.com from a CA of its own.
	tlsConsumer := startTLSConsumer(t, unavailableConsumer{})
	_, tlsPort, _ := net.SplitHostPort(tlsConsumer.addr)
	for _, tc := range []struct {
		name     string
		policy   webhook.Policy
		target   grpcTarget
		category string
		code     int
	}{
		{"answered", dev, plainTarget(lis.Addr().String()), webhook.CategoryGRPCStatus, int(codes.Unavailable)},
		{"connection refused", dev, plainTarget(closedAddr), webhook.CategoryConnectionRefused, 0},
		{"resolves to loopback", webhook.Policy{}, plainTarget("rebind.example.com:" + grpcPort), webhook.CategoryRefusedAddress, 0},
		{"refused before dialling", webhook.Policy{}, plainTarget(lis.Addr().String()), webhook.CategoryRefusedAddress, 0},
		{"answered over TLS", dev, grpcTarget{addr: "hooks.example.com:" + tlsPort, caPEM: tlsConsumer.caPEM}, webhook.CategoryGRPCStatus, int(codes.Unavailable)},
		{"TLS, resolves to loopback", webhook.Policy{}, grpcTarget{addr: "rebind.example.com:" + tlsPort, caPEM: tlsConsumer.caPEM}, webhook.CategoryRefusedAddress, 0},
		{"untrusted certificate", dev, grpcTarget{addr: "hooks.example.com:" + tlsPort}, webhook.CategoryTLS, 0},
		{"another CA", dev, grpcTarget{addr: "hooks.example.com:" + tlsPort, caPEM: otherCAPEM(t)}, webhook.CategoryTLS, 0},
		{"certificate for another name", dev, grpcTarget{addr: tlsConsumer.addr, caPEM: tlsConsumer.caPEM}, webhook.CategoryTLS, 0},
		{"bad stored CA bundle", dev, grpcTarget{addr: "hooks.example.com:" + tlsPort, caPEM: "not pem"}, webhook.CategoryTLS, 0},
	} {
		t.Run("grpc "+tc.name, func(t *testing.T) {
			t.Parallel()
			c := newGRPCClients(tc.policy, resolver)
			t.Cleanup(func() { _ = c.close() })
			// A failing gRPC attempt waits for its connection until the deadline and is then told
			// by the dial's last error: the bound must leave a loaded machine time for a dial or a
			// handshake to fail at least once (1 s did not, at a load of 18).
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res := c.deliver(ctx, tc.target, []string{secret}, ev)
			assert.Equal(t, tc.category, res.category, "%v", res.err)
			assert.Equal(t, tc.code, res.statusCode)
			require.Error(t, res.err)
		})
	}
}

type unavailableConsumer struct {
	eventsv1.UnimplementedEventConsumerServiceServer
}

func (unavailableConsumer) Deliver(context.Context, *eventsv1.DeliverRequest) (*eventsv1.DeliverResponse, error) {
	return nil, status.Error(codes.Unavailable, "warming up")
}

// authorityConsumer records the :authority of the calls it gets, and answers OK.
type authorityConsumer struct {
	eventsv1.UnimplementedEventConsumerServiceServer
	authority chan string
}

func (c authorityConsumer) Deliver(ctx context.Context, _ *eventsv1.DeliverRequest) (*eventsv1.DeliverResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	select {
	case c.authority <- strings.Join(md.Get(":authority"), ","):
	default:
	}
	return &eventsv1.DeliverResponse{}, nil
}

// TestConsumerNamesResolvedRooted: both dialers resolve a consumer's host name rooted ("name."),
// so the router's search domains are never tried — a name that does not exist fails as dns
// naming the rooted name, rather than after a search-domain expansion that might exist inside
// the cluster — while the TLS server name, the Host header and the gRPC :authority keep the
// name as registered.
func TestConsumerNamesResolvedRooted(t *testing.T) {
	t.Parallel()
	ev := &store.Delivery{EventID: "evt-1", Type: "execution.completed", CreatedAt: time.Now(),
		Payload: []byte(`{"type":"execution.completed","data":{"status":"succeeded"}}`)}
	secret, err := webhooks.NewSecret()
	require.NoError(t, err)
	dev := webhook.Policy{AllowPrivate: true, AllowHTTP: true}
	resolver, asked := fakeDNSAsked(t, "127.0.0.1")

	// TLS: SNI and Host are the unrooted name (the test certificate is for *.example.com).
	sni := make(chan string, 1)
	hosts := make(chan string, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts <- r.Host
		w.WriteHeader(http.StatusOK)
	}))
	srv.TLS = &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni <- h.ServerName
		return nil, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c := newWebhookClient(30*time.Second, dev, resolver)
	c.client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: roots}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := c.post(ctx, "https://hooks.example.com:"+port+"/hook", []string{secret}, ev, 1)
	require.NoError(t, res.err)
	assert.Equal(t, http.StatusOK, res.statusCode)
	assert.Equal(t, "hooks.example.com", <-sni, "SNI is the registered name, not the rooted one")
	assert.Equal(t, "hooks.example.com:"+port, <-hosts)
	assert.Contains(t, asked.all(), "hooks.example.com.")

	// A name that does not resolve is looked up, and fails, rooted.
	res = c.post(ctx, "http://nx.example.com:"+port+"/hook", []string{secret}, ev, 1)
	assert.Equal(t, webhook.CategoryDNS, res.category, "%v", res.err)
	var dnsErr *net.DNSError
	require.ErrorAs(t, res.err, &dnsErr)
	assert.Equal(t, "nx.example.com.", dnsErr.Name, "the webhook dialer asked for the rooted name")

	// gRPC: the :authority is the target as registered; the dialer resolves rooted.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	consumer := authorityConsumer{authority: make(chan string, 1)}
	eventsv1.RegisterEventConsumerServiceServer(gs, consumer)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	_, grpcPort, _ := net.SplitHostPort(lis.Addr().String())
	gc := newGRPCClients(dev, resolver)
	t.Cleanup(func() { _ = gc.close() })
	res = gc.deliver(ctx, plainTarget("hooks.example.com:"+grpcPort), []string{secret}, ev)
	require.NoError(t, res.err)
	assert.Equal(t, "hooks.example.com:"+grpcPort, <-consumer.authority)

	nxCtx, nxCancel := context.WithTimeout(context.Background(), time.Second)
	defer nxCancel()
	res = gc.deliver(nxCtx, plainTarget("nx.example.com:"+grpcPort), []string{secret}, ev)
	assert.Equal(t, webhook.CategoryDNS, res.category, "%v", res.err)
	require.ErrorAs(t, res.err, &dnsErr)
	assert.Equal(t, "nx.example.com.", dnsErr.Name, "the gRPC dialer asked for the rooted name")

	for _, n := range asked.all() {
		assert.Contains(t, []string{"hooks.example.com.", "nx.example.com."}, n, "no other name, under no search domain, was asked")
	}
}

// TestDenyListAtDial: the operator's deny list is applied on every connection, with
// AllowPrivate too: a name resolving into a denied range is never connected to
// (refused_address), nor is a denied literal, over webhook or gRPC; an address outside the
// ranges is reached.
func TestDenyListAtDial(t *testing.T) {
	t.Parallel()
	ev := &store.Delivery{EventID: "evt-1", Type: "execution.completed", CreatedAt: time.Now(),
		Payload: []byte(`{"type":"execution.completed","data":{}}`)}
	secret, err := webhooks.NewSecret()
	require.NoError(t, err)
	deny, err := webhook.ParseDenyCIDRs("127.0.0.0/8")
	require.NoError(t, err)
	policy := webhook.Policy{AllowPrivate: true, AllowHTTP: true, Deny: deny}
	resolver := fakeDNS(t, "127.0.0.1")
	port, accepts := countingListener(t)

	c := newWebhookClient(30*time.Second, policy, resolver)
	g := newGRPCClients(policy, resolver)
	t.Cleanup(func() { _ = g.close() })
	for _, url := range []string{"http://hooks.example.com:" + port + "/", "http://127.0.0.1:" + port + "/"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res := c.post(ctx, url, []string{secret}, ev, 1)
		cancel()
		assert.Equal(t, webhook.CategoryRefusedAddress, res.category, "%s: %v", url, res.err)
	}
	for _, target := range []string{"hooks.example.com:" + port, "127.0.0.1:" + port} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		res := g.deliver(ctx, plainTarget(target), []string{secret}, ev)
		cancel()
		assert.Equal(t, webhook.CategoryRefusedAddress, res.category, "%s: %v", target, res.err)
	}
	assert.Zero(t, accepts.Load(), "nothing in the denied range was connected to")

	// Outside the ranges (::1 is not in 127.0.0.0/8), the consumer is reached.
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback")
	}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	_ = hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	t.Cleanup(hs.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := c.post(ctx, hs.URL, []string{secret}, ev, 1)
	assert.NoError(t, res.err)
	assert.Equal(t, http.StatusOK, res.statusCode)
}
