package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
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
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/sdk/go/client"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// goClientWait bounds every wait of TestGoClient for an event (a webhook, a gRPC delivery, a
// settlement): generous, as the machine running the suite may be loaded.
const goClientWait = 90 * time.Second

// goWebhook is one delivery a goWebhooks receiver verified.
type goWebhook struct {
	header http.Header
	body   []byte
	event  *webhooks.Event
}

// goWebhooks is a client application's webhook receiver written with the Go SDK: every delivery
// verified with sdk/go/webhooks' VerifyRequest under the secrets it holds, and again with the
// Standard Webhooks reference library (someone else's implementation of the scheme), and held to
// the OpenAPI document's webhooks.
type goWebhooks struct {
	srv     *httptest.Server
	secrets atomic.Pointer[[]string]
	got     chan goWebhook
	bad     chan error
}

func newGoWebhooks(t *testing.T) *goWebhooks {
	t.Helper()
	r := &goWebhooks{got: make(chan goWebhook, 1000), bad: make(chan error, 100)}
	r.secrets.Store(&[]string{})
	contract := suiteContract(t)
	refuse := func(w http.ResponseWriter, err error) {
		select {
		case r.bad <- err:
		default:
		}
		w.WriteHeader(http.StatusUnauthorized)
	}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		secrets := *r.secrets.Load()
		event, err := webhooks.Verifier{Secrets: secrets}.VerifyRequest(req)
		if err != nil {
			refuse(w, err)
			return
		}
		body, err := io.ReadAll(req.Body) // VerifyRequest leaves it readable
		if err != nil {
			refuse(w, err)
			return
		}
		verified := false
		for _, s := range secrets {
			if ref, err := standardwebhooks.NewWebhook(s); err == nil && ref.Verify(body, req.Header) == nil {
				verified = true
			}
		}
		if !verified {
			refuse(w, errors.New("the Standard Webhooks reference library does not verify what the SDK did"))
			return
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			refuse(w, err)
			return
		}
		if problem := contract.checkWebhook(req.Header, m); problem != "" {
			t.Errorf("%s", problem)
		}
		r.got <- goWebhook{header: req.Header.Clone(), body: body, event: event}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// trust makes the receiver accept deliveries signed with any of secrets.
func (r *goWebhooks) trust(secrets ...string) { r.secrets.Store(&secrets) }

// await answers the first verified delivery that match accepts, failing on any refused one.
func (r *goWebhooks) await(t *testing.T, what string, match func(goWebhook) bool) goWebhook {
	t.Helper()
	timeout := time.After(goClientWait)
	for {
		select {
		case d := <-r.got:
			if match(d) {
				return d
			}
		case err := <-r.bad:
			t.Fatalf("a delivery did not verify: %v", err)
		case <-timeout:
			t.Fatalf("no webhook %s within %s", what, goClientWait)
		}
	}
}

// completedFor matches the completion event of an execution.
func completedFor(executionID string) func(goWebhook) bool {
	return func(d goWebhook) bool {
		return d.event.Type == webhooks.TypeExecutionCompleted && d.event.Data.ExecutionID == executionID
	}
}

// callCounter counts the gRPC calls made on a connection, by method.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *callCounter) count(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

// goClientTransport is how a client reaches the stack's gateway: plaintext, or TLS verified
// against the run's CA when the client-facing listeners serve TLS.
func (s *stack) goClientTransport(t *testing.T) credentials.TransportCredentials {
	if s.PublicTLS() {
		return credentials.NewTLS(&tls.Config{RootCAs: caPool(t), MinVersion: tls.VersionTLS12})
	}
	return insecure.NewCredentials()
}

// TestGoClient runs a client application's whole use of the platform through the Go client SDK
// (sdk/go/client) and its webhook helper (sdk/go/webhooks) against a running stack: invoke async
// with an idempotency key (replayed, and refused with another request) and sync, wait for
// settlement, get, list across three pages with the iterator, cancel, the timeline, events (list,
// get, redeliver, redrive), consumer registration as a webhook — every delivery verified with the
// SDK and the reference library, with both secrets after a rotation — and as a gRPC consumer over
// TLS, verified with the SDK; errors that name the field and say whether to retry; and the
// examples/client-go program, run as a user runs it.
func TestGoClient(t *testing.T) {
	s := newStack(t)
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s))
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The client on a connection of the test's own (NewWithConn), whose calls it counts.
	calls := &callCounter{n: map[string]int{}}
	conn, err := grpc.NewClient(s.Addrs["gateway"], grpc.WithTransportCredentials(s.goClientTransport(t)),
		grpc.WithChainUnaryInterceptor(calls.intercept))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c, err := client.NewWithConn(conn, s.APIKey, client.WithPolling(50*time.Millisecond, 500*time.Millisecond))
	require.NoError(t, err)
	settle := func(t *testing.T, id string) *client.Execution {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, goClientWait)
		defer cancel()
		e, err := c.WaitForSettlement(wctx, id)
		require.NoError(t, err)
		return e
	}

	t.Run("errors name the field and say whether to retry", func(t *testing.T) {
		opt := client.WithInsecure()
		if s.PublicTLS() {
			opt = client.WithTLS(&tls.Config{RootCAs: caPool(t), MinVersion: tls.VersionTLS12})
		}
		wrong, err := client.New(s.Addrs["gateway"], "dev_"+randomHex(16), opt)
		require.NoError(t, err)
		defer wrong.Close()
		_, err = wrong.Invoke(ctx, "dummy.echo", nil)
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
		require.False(t, client.IsRetryable(err), "a wrong key is not retryable")

		_, err = c.Invoke(ctx, "dummy.echo", nil, client.IdempotencyKey("two words"))
		var cerr *client.Error
		require.ErrorAs(t, err, &cerr)
		require.Equal(t, codes.InvalidArgument, cerr.Code)
		require.Equal(t, "idempotency_key", cerr.Field(), "%v", err)
		require.False(t, client.IsRetryable(err))

		// Refused, not clamped: exactly one pair, (nil, the refusal). A gateway that clamped the
		// page size would answer an empty page here (no execution exists yet): no pair at all.
		pairs := 0
		for e, err := range c.List(ctx, &client.ListExecutionsRequest{PageSize: 1000}) {
			pairs++
			require.Nil(t, e)
			require.ErrorAs(t, err, &cerr)
			require.Equal(t, codes.InvalidArgument, cerr.Code, "%v", err)
			require.Equal(t, "page_size", cerr.Field(), "%v", err)
		}
		require.Equal(t, 1, pairs, "page_size 1000 is refused with one (nil, error) pair")

		_, err = c.Get(ctx, "0190a000-0000-7000-8000-000000000000")
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
		_, err = c.Invoke(ctx, "dummy.nothing", nil)
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	})

	hook := newGoWebhooks(t)
	reg, err := c.RegisterWebhook(ctx, hook.srv.URL+"/events")
	require.NoError(t, err)
	require.Equal(t, hook.srv.URL+"/events", reg.GetWebhook().GetUrl())
	secret := reg.GetSigningSecret()
	require.True(t, strings.HasPrefix(secret, webhooks.SecretPrefix), "signing secret %q", secret)
	hook.trust(secret)

	var previous string         // the secret before the rotation
	var first *client.Execution // the async execution of the first subtest
	t.Run("invoke async with an idempotency key, wait, get, its webhook verified", func(t *testing.T) {
		type greeting struct {
			Hello string `json:"hello"`
			N     int    `json:"n"`
		}
		key := "go-client-" + randomHex(6)
		e, err := c.Invoke(ctx, "dummy.echo", greeting{Hello: "world", N: 1}, client.IdempotencyKey(key))
		require.NoError(t, err)
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING, e.GetStatus())
		require.Equal(t, executionv1.Mode_MODE_ASYNC, e.GetMode())
		require.False(t, client.IsFinal(e.GetStatus()))

		again, err := c.Invoke(ctx, "dummy.echo", greeting{Hello: "world", N: 1}, client.IdempotencyKey(key))
		require.NoError(t, err)
		require.Equal(t, e.GetId(), again.GetId(), "the same key and request answer the same execution")
		_, err = c.Invoke(ctx, "dummy.echo", greeting{Hello: "world", N: 2}, client.IdempotencyKey(key))
		require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)
		var cerr *client.Error
		require.ErrorAs(t, err, &cerr)
		require.Equal(t, "IDEMPOTENCY_KEY_REUSED", cerr.Reason)

		settled := settle(t, e.GetId())
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, settled.GetStatus())
		require.True(t, client.IsFinal(settled.GetStatus()))

		got, err := c.Get(ctx, e.GetId())
		require.NoError(t, err)
		require.Equal(t, key, got.GetIdempotencyKey())
		require.Len(t, got.GetAttempts(), 1)
		var payload greeting
		require.NoError(t, client.Unmarshal(got.GetPayload(), &payload), "the struct payload reads back")
		require.Equal(t, greeting{Hello: "world", N: 1}, payload)
		require.NotNil(t, got.GetResult())

		d := hook.await(t, "for "+e.GetId(), completedFor(e.GetId()))
		require.Equal(t, "succeeded", d.event.Data.Status)
		require.Equal(t, "async", d.event.Data.Mode)
		require.Equal(t, key, d.event.Data.IdempotencyKey)
		require.Equal(t, d.header.Get(webhooks.HeaderID), d.event.ID)
		require.NoError(t, webhooks.Verify(d.header, d.body, secret))
		first = got
	})
	require.NotNil(t, first, "the first execution is needed by what follows")

	t.Run("invoke sync; InvokeAndWait to a failure", func(t *testing.T) {
		e, err := c.Invoke(ctx, "dummy.echo", map[string]any{"mode": "sync"}, client.Sync())
		require.NoError(t, err)
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, e.GetStatus(), "settled in the answer")
		require.Equal(t, executionv1.Mode_MODE_SYNC, e.GetMode())
		require.EqualValues(t, 1, e.GetAttempt())
		d := hook.await(t, "for the sync "+e.GetId(), completedFor(e.GetId()))
		require.Equal(t, "sync", d.event.Data.Mode)

		wctx, cancel := context.WithTimeout(ctx, goClientWait)
		defer cancel()
		failed, err := c.InvokeAndWait(wctx, "dummy.echo", json.RawMessage(`{"dummy": {"fail_permanent": true}}`))
		require.NoError(t, err, "a settled failure is an answer, not an error")
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED, failed.GetStatus())
		require.Equal(t, "adapter.permanent", failed.GetFailure().GetReason())
		d = hook.await(t, "for the failed "+failed.GetId(), completedFor(failed.GetId()))
		require.Equal(t, "failed", d.event.Data.Status)
		require.Equal(t, "adapter.permanent", d.event.Data.Failure.Reason)
	})

	t.Run("list: three pages with the iterator, each execution once, newest first", func(t *testing.T) {
		prefix := "go-page-" + randomHex(4) + "-"
		var created []string
		for i := range 7 {
			e, err := c.Invoke(ctx, "dummy.echo", map[string]any{"i": i}, client.IdempotencyKey(prefix+strconv.Itoa(i)))
			require.NoError(t, err)
			created = append(created, e.GetId())
		}
		before := calls.count(gatewayv1.GatewayService_ListExecutions_FullMethodName)
		var seen []string
		for e, err := range c.List(ctx, &client.ListExecutionsRequest{Query: prefix, PageSize: 3}) {
			require.NoError(t, err)
			require.Nil(t, e.GetPayload(), "lists leave the payload out")
			seen = append(seen, e.GetId())
		}
		slices.Reverse(created)
		require.Equal(t, created, seen, "every execution once, newest first")
		require.Equal(t, 3, calls.count(gatewayv1.GatewayService_ListExecutions_FullMethodName)-before, "3 + 3 + 1: three pages")

		// A filter: the page's executions of one status only, across pages too.
		for _, id := range created {
			settle(t, id)
		}
		n := 0
		for e, err := range c.List(ctx, &client.ListExecutionsRequest{Query: prefix, PageSize: 2,
			Status: executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED}) {
			require.NoError(t, err)
			require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, e.GetStatus())
			n++
		}
		require.Equal(t, 7, n)
	})

	t.Run("cancel, and cancel again refused ALREADY_SETTLED", func(t *testing.T) {
		e, err := c.Invoke(ctx, "dummy.long", map[string]any{"dummy": map[string]any{"hang": true}})
		require.NoError(t, err)
		cancelled, err := c.Cancel(ctx, e.GetId())
		require.NoError(t, err)
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED, cancelled.GetStatus())
		require.Equal(t, "cancelled", cancelled.GetFailure().GetReason())

		_, err = c.Cancel(ctx, e.GetId())
		var cerr *client.Error
		require.ErrorAs(t, err, &cerr)
		require.Equal(t, codes.FailedPrecondition, cerr.Code)
		require.Equal(t, "ALREADY_SETTLED", cerr.Reason)
		require.False(t, cerr.Retryable())
		d := hook.await(t, "for the cancelled "+e.GetId(), completedFor(e.GetId()))
		require.Equal(t, "cancelled", d.event.Data.Status)
	})

	t.Run("events: list, get, timeline, redeliver, redrive", func(t *testing.T) {
		var event *client.Event
		for ev, err := range c.ListEvents(ctx, &client.ListEventsRequest{ExecutionId: first.GetId()}) {
			require.NoError(t, err)
			require.Nil(t, event, "one event for the execution")
			event = ev
		}
		require.NotNil(t, event)
		require.Equal(t, webhooks.TypeExecutionCompleted, event.GetType())
		require.Empty(t, event.GetDeliveries(), "lists leave the attempts out")
		// The data typed, as settlement's statement wrote the body: the Struct's values.
		data := client.CompletedData(event)
		require.NotNil(t, event.GetExecutionCompleted(), "the gateway sends the typed data")
		require.Equal(t, first.GetId(), data.GetExecutionId())
		require.Equal(t, "dummy.echo", data.GetCapability())
		require.Equal(t, "succeeded", data.GetStatus())
		require.Equal(t, event.GetData().GetFields()["mode"].GetStringValue(), data.GetMode())
		require.EqualValues(t, event.GetData().GetFields()["attempt"].GetNumberValue(), data.GetAttempt())
		require.EqualValues(t, event.GetSequence(), data.GetSequence())
		require.Equal(t, first.GetIdempotencyKey(), data.GetIdempotencyKey())
		require.Nil(t, data.GetResult(), "lists leave the result out")
		require.Nil(t, client.ProgressData(event))

		// Its delivery was received above; the event says so once the router has recorded it.
		require.Eventually(t, func() bool {
			ev, err := c.GetEvent(ctx, event.GetId())
			return err == nil && ev.GetStatus() == eventsv1.EventStatus_EVENT_STATUS_DELIVERED
		}, goClientWait, 50*time.Millisecond)
		got, err := c.GetEvent(ctx, event.GetId())
		require.NoError(t, err)
		require.NotEmpty(t, got.GetDeliveries())
		require.EqualValues(t, http.StatusNoContent, got.GetDeliveries()[len(got.GetDeliveries())-1].GetStatusCode())

		timeline, err := c.Timeline(ctx, first.GetId())
		require.NoError(t, err)
		require.Equal(t, first.GetId(), timeline.GetExecutionId())
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, timeline.GetStatus())
		var kinds []gatewayv1.TimelineEntryKind
		for _, entry := range timeline.GetEntries() {
			kinds = append(kinds, entry.GetKind())
		}
		for _, k := range []gatewayv1.TimelineEntryKind{gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ACCEPTED,
			gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_STARTED, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_SETTLED,
			gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_EVENT, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_DELIVERY} {
			assert.Contains(t, kinds, k)
		}
		require.Equal(t, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ACCEPTED, kinds[0], "oldest first")

		// Every event of the application, page after page, each once.
		ids := map[string]bool{}
		for ev, err := range c.ListEvents(ctx, &client.ListEventsRequest{PageSize: 4}) {
			require.NoError(t, err)
			require.False(t, ids[ev.GetId()], "event %s listed twice", ev.GetId())
			ids[ev.GetId()] = true
		}
		require.True(t, ids[event.GetId()])
		require.GreaterOrEqual(t, len(ids), 11, "the executions above each have their completion event")

		redelivered, err := c.RedeliverEvent(ctx, event.GetId())
		require.NoError(t, err)
		require.Equal(t, event.GetId(), redelivered.GetId())
		d := hook.await(t, "redelivered", func(d goWebhook) bool { return d.event.ID == event.GetId() })
		require.Equal(t, first.GetId(), d.event.Data.ExecutionID)

		n, err := c.RedriveEvents(ctx, &client.RedriveEventsRequest{ValidateOnly: true})
		require.NoError(t, err)
		require.Zero(t, n, "no event is dead")
	})

	t.Run("rotate-secret: deliveries verify with either secret, and with both", func(t *testing.T) {
		rotation, err := c.RotateSecret(ctx)
		require.NoError(t, err)
		current := rotation.GetSigningSecret()
		require.NotEqual(t, secret, current)
		previous = secret
		require.True(t, rotation.GetPreviousSecretExpireTime().AsTime().After(time.Now()))
		hook.trust(current, previous)

		e, err := c.Invoke(ctx, "dummy.echo", map[string]any{"after": "rotation"})
		require.NoError(t, err)
		d := hook.await(t, "after the rotation", completedFor(e.GetId()))
		require.Len(t, strings.Fields(d.header.Get(webhooks.HeaderSignature)), 2, "one signature per secret")
		require.NoError(t, webhooks.Verify(d.header, d.body, current))
		require.NoError(t, webhooks.Verify(d.header, d.body, previous))
		require.NoError(t, webhooks.Verify(d.header, d.body, current, previous))
		other, err := webhooks.NewSecret()
		require.NoError(t, err)
		require.ErrorIs(t, webhooks.Verify(d.header, d.body, other), webhooks.ErrUnverified)
		secret = current
	})

	t.Run("a gRPC consumer over TLS receives deliveries the SDK verifies", func(t *testing.T) {
		consumer := newGRPCConsumer(t, false)
		reg, err := c.RegisterGRPC(ctx, client.GRPCConsumer{Target: consumer.addr, CAPEM: consumer.caPEM})
		require.NoError(t, err)
		require.Equal(t, consumer.addr, reg.GetGrpc().GetTarget())
		require.False(t, reg.GetGrpc().GetPlaintext(), "TLS")
		require.Equal(t, secret, reg.GetSigningSecret(), "one secret for both kinds, kept across registrations")
		consumer.trust(secret) // its interceptor: sdk/go/webhooks' UnaryServerInterceptor

		e, err := c.Invoke(ctx, "dummy.echo", map[string]any{"to": "grpc+tls"})
		require.NoError(t, err)
		call := consumer.callFor(t, e.GetId())
		require.Equal(t, webhooks.TypeExecutionCompleted, call.req.GetType())
		require.Equal(t, e.GetId(), call.req.GetExecutionCompleted().GetExecutionId(), "the delivery's data, typed")
		require.Equal(t, "succeeded", call.req.GetExecutionCompleted().GetStatus())
		require.NoError(t, webhooks.VerifyDelivery(call.md, call.req, secret))
		require.NoError(t, webhooks.VerifyDelivery(call.md, call.req, previous), "still in the rotation's overlap")
		assertSigned(t, call, secret, previous) // and with the reference library, one signature per secret
		require.Eventually(t, func() bool {
			ev, err := c.GetEvent(ctx, call.req.GetId())
			return err == nil && ev.GetStatus() == eventsv1.EventStatus_EVENT_STATUS_DELIVERED
		}, goClientWait, 50*time.Millisecond)
	})

	t.Run("examples/client-go runs against the stack", func(t *testing.T) {
		goBin, err := exec.LookPath("go")
		require.NoError(t, err)
		env := []string{
			"INTEGRATIONS_GRPC_ADDR=" + s.Addrs["gateway"],
			"INTEGRATIONS_API_KEY=" + s.APIKey,
			"RECEIVER_ADDR=" + freeAddr(t),
			"CAPABILITY=dummy.echo",
			"INTEGRATIONS_GRPC_TLS=",
		}
		if s.PublicTLS() {
			env = append(env, "INTEGRATIONS_GRPC_CA_FILE="+devca.CAFile(tlsDir))
		}
		rctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(rctx, goBin, "run", ".")
		cmd.Dir = "../examples/client-go"
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		t.Logf("go run ./examples/client-go:\n%s", strings.TrimSpace(string(out)))
		require.NoError(t, err)
		require.Contains(t, string(out), "webhook registered: http://")
		require.Contains(t, string(out), "settled: execution")
		require.Contains(t, string(out), "EXECUTION_STATUS_SUCCEEDED")
		require.Regexp(t, `verified webhook \S+: execution.completed succeeded \{.*"hello":\s*"world"`, string(out))
	})
}
