package riversw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/bench/internal/accept"
	"github.com/integrations-platform/integrations/bench/internal/flow"
	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/e2e/stack"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"

	"crypto/ed25519"
)

// freshSchema creates a schema with River's tables, dropped when the test ends.
func freshSchema(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "riversw_test_" + hex.EncodeToString(b)
	if err := accept.MigrateRiver(ctx, url, schema); err != nil {
		t.Fatalf("migrate River into %s: %v", schema, err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool, err := accept.Pool(cctx, url, 1)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer pool.Close()
		if _, err := pool.Exec(cctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// startAdapter serves an adapter (sdk/go/adapter, verifying platform tokens of pub for id "dummy")
// that echoes, and fails the first attempt retryably when the payload says {"fail_first": true}.
func startAdapter(t *testing.T, pub ed25519.PublicKey) string {
	t.Helper()
	h := func(_ context.Context, req *adapter.Request) adapter.Result {
		if req.Payload["fail_first"] == true && req.Attempt == 1 {
			return adapter.Fail(adapter.ClassTransient, "first", "first attempt fails", true)
		}
		return adapter.Complete(map[string]any{"echo": req.Payload["bench"]})
	}
	ad, err := adapter.New(h, adapter.Options{CallbackAddr: "127.0.0.1:1", Credential: "cred", Logger: zap.NewNop(),
		AdapterID: "dummy", PlatformKeys: []ed25519.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	ad.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); _ = ad.Close() })
	return lis.Addr().String()
}

type harness struct {
	srv      *Server
	receiver *stack.Receiver
	url      string
	schema   string
}

func start(t *testing.T, ctx context.Context) *harness {
	t.Helper()
	url := dbtest.BaseURL()
	schema := freshSchema(t, ctx, url)
	pub, key, err := platformtoken.Generate()
	if err != nil {
		t.Fatal(err)
	}
	receiver, err := stack.NewReceiver()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(receiver.Close)
	secret, err := webhooks.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	receiver.SetSecret(secret)
	s, err := Start(ctx, Config{DatabaseURL: url, Schema: schema, Listen: "127.0.0.1:0", AdapterID: "dummy",
		AdapterAddr: startAdapter(t, pub), PlatformKey: key, ReceiverURL: receiver.URL, SigningSecret: secret, Capability: "dummy.echo"})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{srv: s, receiver: receiver, url: url, schema: schema}
}

// TestSameWork: every POST ends in one signed webhook; River's tables then hold each execution's
// execute job and its webhook job completed.
func TestSameWork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := start(t, ctx)
	tracker := flow.NewTracker(h.receiver)
	submit, err := Submit("http://"+h.srv.Addr, tracker, map[string]any{"bench": "end-to-end"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	r := load.Run(ctx, load.Params{Callers: 4, N: n}, 0, load.OpOf(submit))
	if r.Requests != n || r.Errors != 0 {
		t.Fatalf("completed %d, errors %d (first: %v), want %d and 0", r.Requests, r.Errors, r.FirstErr, n)
	}
	if got := h.receiver.Rejected(); got != 0 {
		t.Errorf("%d deliveries did not verify", got)
	}
	if got := h.receiver.Received(); got != n {
		t.Errorf("receiver got %d deliveries, want %d", got, n)
	}
	// Stopping River writes its last completions.
	if err := h.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pool, err := accept.Pool(ctx, h.url, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, "SELECT kind, state::text, count(*) FROM "+h.schema+".river_job GROUP BY 1, 2")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var kind, state string
		var c int
		if err := rows.Scan(&kind, &state, &c); err != nil {
			t.Fatal(err)
		}
		got[kind+"/"+state] = c
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if got["execute/completed"] != n || got["webhook/completed"] != n || len(got) != 2 {
		t.Errorf("jobs by kind/state %v, want %d execute and %d webhook jobs completed", got, n, n)
	}
}

// TestRetryThenSucceed: a retryable failure is retried by River, and the event says attempt 2.
func TestRetryThenSucceed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := start(t, ctx)
	defer func() { _ = h.srv.Close(ctx) }()
	events := make(chan stack.Event, 4)
	h.receiver.OnEvent(func(ev stack.Event) { events <- ev })
	resp, err := http.Post("http://"+h.srv.Addr+"/executions", "application/json",
		strings.NewReader(`{"payload": {"bench": "retry", "fail_first": true}}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST: %s", resp.Status)
	}
	select {
	case ev := <-events:
		if ev.VerifyErr != nil {
			t.Fatalf("delivery did not verify: %v", ev.VerifyErr)
		}
		var body Event
		if err := json.Unmarshal(ev.Body, &body); err != nil {
			t.Fatal(err)
		}
		if body.Data.Attempt != 2 || body.Data.Status != "succeeded" {
			t.Errorf("event %+v, want attempt 2 succeeded", body.Data)
		}
	case <-ctx.Done():
		t.Fatal("no webhook")
	}
}

// TestBadRequest: a body that is not JSON, or a payload not an object, is a 400.
func TestBadRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := start(t, ctx)
	defer func() { _ = h.srv.Close(ctx) }()
	for _, body := range []string{`not json`, `{"payload": [1]}`} {
		resp, err := http.Post("http://"+h.srv.Addr+"/executions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %q: %s, want 400", body, resp.Status)
		}
	}
}
