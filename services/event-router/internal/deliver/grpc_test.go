package deliver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// plain is a plaintext gRPC consumer at addr.
func plainTarget(addr string) grpcTarget { return grpcTarget{addr: addr, plaintext: true} }

// tlsConsumer is an EventConsumerService served over TLS on loopback, its certificate for
// *.example.com (no IP address: dialled as 127.0.0.1 it does not match) from a CA of its own.
type tlsConsumer struct {
	addr  string // 127.0.0.1:port
	caPEM string
}

func startTLSConsumer(t *testing.T, impl eventsv1.EventConsumerServiceServer, opts ...grpc.ServerOption) tlsConsumer {
	t.Helper()
	dir := t.TempDir()
	ca, err := devca.NewCA(dir)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "consumer.pem"), filepath.Join(dir, "consumer-key.pem")
	require.NoError(t, ca.IssueTemplate(certFile, keyFile,
		&x509.Certificate{Subject: pkix.Name{CommonName: "consumer"}, DNSNames: []string{"*.example.com"}}))
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	caPEM, err := os.ReadFile(devca.CAFile(dir))
	require.NoError(t, err)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))...)
	eventsv1.RegisterEventConsumerServiceServer(srv, impl)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return tlsConsumer{addr: lis.Addr().String(), caPEM: string(caPEM)}
}

// otherCAPEM is a CA that signed nothing the test consumers serve.
func otherCAPEM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, err := devca.NewCA(dir)
	require.NoError(t, err)
	b, err := os.ReadFile(devca.CAFile(dir))
	require.NoError(t, err)
	return string(b)
}

// setGRPCConsumer registers c as app's consumer, with a fresh signing secret, which it returns.
func (b *bundle) setGRPCConsumer(t *testing.T, app string, c grpcTarget) string {
	t.Helper()
	signing := b.setConsumer(t, app, "grpc", c.addr)
	var ca *string
	if c.caPEM != "" {
		ca = &c.caPEM
	}
	_, err := b.s.Pool.Exec(context.Background(),
		`UPDATE applications SET consumer_grpc_plaintext = $2, consumer_grpc_ca = $3 WHERE id = $1`, app, c.plaintext, ca)
	require.NoError(t, err)
	return signing
}

// recorded is one Deliver call as the consumer got it.
type recorded struct {
	md  metadata.MD
	req *eventsv1.DeliverRequest
}

// consumerServer is an in-process EventConsumerService: it answers UNAVAILABLE first, then OK,
// and keeps every call with its metadata.
type consumerServer struct {
	eventsv1.UnimplementedEventConsumerServiceServer
	mu  sync.Mutex
	got []recorded
}

func (c *consumerServer) Deliver(ctx context.Context, req *eventsv1.DeliverRequest) (*eventsv1.DeliverResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, recorded{md: md, req: req})
	if len(c.got) == 1 {
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	return &eventsv1.DeliverResponse{}, nil
}

func (c *consumerServer) calls() []recorded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]recorded(nil), c.got...)
}

// standardHeaders are a call's signature metadata as HTTP headers, for the Standard Webhooks
// reference library.
func standardHeaders(md metadata.MD) http.Header {
	h := http.Header{}
	for _, k := range []string{webhooks.HeaderID, webhooks.HeaderTimestamp, webhooks.HeaderSignature} {
		for _, v := range md.Get(k) {
			h.Add(k, v)
		}
	}
	return h
}

// TestGRPCConsumer: an application with a gRPC consumer gets the event through
// EventConsumerService.Deliver over TLS — the certificate verified against the CA registered
// with the consumer, for the target's name — with id, type, time, data and the exact body, every
// call signed in its metadata as a webhook is: during a rotation's overlap with both secrets,
// each verifying on its own, with sdk/go/webhooks (the consumer's interceptor refuses anything
// else) and with the Standard Webhooks reference library; after it, with the current one only. A
// failed call is an attempt recorded by its code (status_code holds the gRPC code, as the API
// documents).
func TestGRPCConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, options{resolver: fakeDNS(t, "127.0.0.1")})
	cs := &consumerServer{}
	// The consumer verifies every call with the secret it knows, as a receiver would (known
	// once registered, after the consumer has an address).
	var known atomic.Pointer[string]
	verify := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return webhooks.UnaryServerInterceptor(*known.Load())(ctx, req, info, h)
	}
	consumer := startTLSConsumer(t, cs, grpc.ChainUnaryInterceptor(verify))
	_, port, _ := net.SplitHostPort(consumer.addr)
	current := b.setGRPCConsumer(t, dbtest.TestApp, grpcTarget{addr: "events.example.com:" + port, caPEM: consumer.caPEM})
	known.Store(&current)
	previous := b.rotating(t, dbtest.TestApp)

	id := b.newEvent(t, dbtest.TestApp)
	b.awaitStatus(t, id, "delivered", 10*time.Second)
	got := cs.calls()
	require.Len(t, got, 2)
	var payload []byte
	require.NoError(t, b.s.Pool.QueryRow(context.Background(), `SELECT payload FROM integration_events WHERE id = $1`, id).Scan(&payload))
	req := got[1].req
	assert.Equal(t, id, req.GetId())
	assert.Equal(t, "execution.completed", req.GetType())
	assert.Equal(t, int32(1), req.GetSequence(), "data.sequence, as a field of its own")
	assert.Equal(t, string(payload), string(req.GetBody()), "the exact body a webhook would get")
	assert.Equal(t, "succeeded", req.GetData().GetFields()["status"].GetStringValue())
	typed := req.GetExecutionCompleted()
	assert.Equal(t, "succeeded", typed.GetStatus(), "the data, typed")
	assert.Equal(t, int32(1), typed.GetSequence())
	assert.Equal(t, req.GetData().GetFields()["execution_id"].GetStringValue(), typed.GetExecutionId())
	assert.True(t, proto.Equal(req.GetData().GetFields()["result"].GetStructValue(), typed.GetResult()))
	assert.WithinDuration(t, time.Now(), req.GetTime().AsTime(), time.Minute)
	for i, call := range got {
		assert.Equal(t, []string{id}, call.md.Get(webhooks.HeaderID), "call %d", i+1)
		require.Len(t, strings.Fields(strings.Join(call.md.Get(webhooks.HeaderSignature), " ")), 2, "call %d: one signature per secret", i+1)
		for _, s := range []string{current, previous} {
			assert.NoError(t, webhooks.VerifyDelivery(call.md, call.req, s), "call %d", i+1)
			wh, err := standardwebhooks.NewWebhook(s)
			require.NoError(t, err)
			assert.NoError(t, wh.Verify(call.req.GetBody(), standardHeaders(call.md)), "call %d: the reference library verifies", i+1)
		}
	}

	rows := b.deliveries(t, id)
	require.Len(t, rows, 2)
	require.NotNil(t, rows[0].code, "a gRPC consumer's answer is recorded by its gRPC code")
	assert.Equal(t, int(codes.Unavailable), *rows[0].code)
	require.NotNil(t, rows[0].err)
	assert.Equal(t, webhook.CategoryGRPCStatus, *rows[0].err)
	assert.Nil(t, rows[1].err)

	// The overlap over, only the current secret signs.
	_, err := b.s.Pool.Exec(context.Background(),
		`UPDATE applications SET signing_secret_prev_until = now() - interval '1 second' WHERE id = $1`, dbtest.TestApp)
	require.NoError(t, err)
	id2 := b.newEvent(t, dbtest.TestApp)
	b.awaitStatus(t, id2, "delivered", 10*time.Second)
	got = cs.calls()
	require.Len(t, got, 3)
	last := got[2]
	require.Len(t, last.md.Get(webhooks.HeaderSignature), 1)
	require.Len(t, strings.Fields(last.md.Get(webhooks.HeaderSignature)[0]), 1)
	assert.NoError(t, webhooks.VerifyDelivery(last.md, last.req, current))
	assert.ErrorIs(t, webhooks.VerifyDelivery(last.md, last.req, previous), webhooks.ErrUnverified)
}

// TestGRPCConsumerWrongCA: a consumer whose certificate does not chain to the CA registered with
// it is never called: every attempt fails as tls, is retried on the schedule, and the event dies
// after its budget. A consumer that refuses a delivery it cannot verify (signed with a secret it
// does not know) answers UNAUTHENTICATED, a failed attempt retried too.
func TestGRPCConsumerWrongCA(t *testing.T) {
	t.Parallel()
	b := setup(t, options{resolver: fakeDNS(t, "127.0.0.1"), delays: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond},
		timeout: time.Second})
	cs := &consumerServer{}
	consumer := startTLSConsumer(t, cs, grpc.ChainUnaryInterceptor(webhooks.UnaryServerInterceptor(otherSecret(t))))
	_, port, _ := net.SplitHostPort(consumer.addr)

	b.setGRPCConsumer(t, dbtest.TestApp, grpcTarget{addr: "events.example.com:" + port, caPEM: otherCAPEM(t)})
	id := b.newEvent(t, dbtest.TestApp)
	b.awaitStatus(t, id, "dead", 20*time.Second)
	rows := b.deliveries(t, id)
	require.Len(t, rows, 3, "every attempt of the budget was made")
	for _, r := range rows {
		assert.Nil(t, r.code)
		require.NotNil(t, r.err)
		assert.Equal(t, webhook.CategoryTLS, *r.err)
	}
	assert.Empty(t, cs.calls(), "the consumer was never called")

	// The right CA, but the consumer knows another secret: it refuses every call.
	b.setGRPCConsumer(t, appB, grpcTarget{addr: "events.example.com:" + port, caPEM: consumer.caPEM})
	id = b.newEvent(t, appB)
	b.awaitStatus(t, id, "dead", 20*time.Second)
	rows = b.deliveries(t, id)
	require.Len(t, rows, 3)
	for _, r := range rows {
		require.NotNil(t, r.code)
		assert.Equal(t, int(codes.Unauthenticated), *r.code)
		require.NotNil(t, r.err)
		assert.Equal(t, webhook.CategoryGRPCStatus, *r.err)
	}
	assert.Empty(t, cs.calls(), "the handler never saw an unverified delivery")
}

func otherSecret(t *testing.T) string {
	t.Helper()
	s, err := webhooks.NewSecret()
	require.NoError(t, err)
	return s
}

// sameData asserts that a typed data message says what the Struct says: written as JSON by its
// field names (its zero values too: a stored body has every member that is not optional), it
// reads back as the same object.
func sameData(t *testing.T, data *structpb.Struct, typed proto.Message) {
	t.Helper()
	require.NotNil(t, typed, "typed data")
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}.Marshal(typed)
	require.NoError(t, err)
	back := &structpb.Struct{}
	require.NoError(t, protojson.Unmarshal(raw, back))
	assert.True(t, proto.Equal(data, back), "typed %s\nstruct %s", raw, protojson.Format(data))
}

// TestDeliverRequestTypedData: Deliver's typed data carries the values of its Struct data, for
// bodies as settlement and adapter-callback build them (members absent when unset, the failure's
// empty texts absent); a member the message does not know is skipped.
func TestDeliverRequestTypedData(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, typ, data string
	}{
		{"succeeded", "execution.completed", `{"execution_id": "0190aaaa-0000-7000-8000-000000000001", "capability": "dummy.echo",
			"mode": "async", "status": "succeeded", "attempt": 1, "sequence": 3, "idempotency_key": "k-1", "result": {"echo": {"n": [1, 2]}}}`},
		{"failed", "execution.completed", `{"execution_id": "0190aaaa-0000-7000-8000-000000000001", "capability": "dummy.echo",
			"mode": "sync", "status": "failed", "attempt": 2, "sequence": 1, "failure": {"class": "permanent", "reason": "adapter.permanent", "message": "no"}}`},
		{"progress", "execution.progress", `{"execution_id": "0190aaaa-0000-7000-8000-000000000001", "capability": "dummy.echo",
			"attempt": 1, "sequence": 2, "progress": {"pct": 40, "step": "upload"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := `{"id": "evt-1", "type": "` + tc.typ + `", "timestamp": "2026-01-02T03:04:05Z", "data": ` + tc.data + `}`
			req, err := deliverRequest(&store.Delivery{EventID: "evt-1", Type: tc.typ, CreatedAt: time.Now(), Payload: []byte(body)})
			require.NoError(t, err)
			typed := proto.Message(req.GetExecutionCompleted())
			if tc.typ == "execution.progress" {
				typed = req.GetExecutionProgress()
				require.Nil(t, req.GetExecutionCompleted())
			}
			sameData(t, req.GetData(), typed)
		})
	}

	// A member added by a later release: the typed data skips it, the Struct keeps it.
	body := `{"id": "evt-1", "type": "execution.completed", "data": {"execution_id": "e", "status": "succeeded", "sequence": 1, "later": true}}`
	req, err := deliverRequest(&store.Delivery{EventID: "evt-1", Type: "execution.completed", CreatedAt: time.Now(), Payload: []byte(body)})
	require.NoError(t, err)
	assert.Equal(t, "succeeded", req.GetExecutionCompleted().GetStatus())
	assert.True(t, req.GetData().GetFields()["later"].GetBoolValue())
}
