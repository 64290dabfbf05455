package adaptercheck_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/adaptercheck"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

const (
	adapterID  = "check-me"
	credential = "adp_check_credential"
)

// registerFunc registers an adapter's AdapterService on srv; the adapter calls back to
// callbackAddr and trusts key.
type registerFunc func(t *testing.T, srv *grpc.Server, callbackAddr string, key ed25519.PublicKey)

// setup serves an adapter on a loopback port and returns the check's settings for it: a key of
// its own, the callback service on another loopback port, a 2 s lease (renewed by the adapters
// here every third of it) and generous bounds for everything awaited.
func setup(t *testing.T, register registerFunc) adaptercheck.Config {
	t.Helper()
	_, priv, err := platformtoken.Generate()
	require.NoError(t, err)
	callbacks, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	register(t, srv, callbacks.Addr().String(), priv.Public().(ed25519.PublicKey))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return adaptercheck.Config{
		Addr: lis.Addr().String(), AdapterID: adapterID, Key: priv, Capability: "check.echo",
		Payload:     mustStruct(t, map[string]any{"n": 1}),
		LongPayload: mustStruct(t, map[string]any{"later_ms": 3500}),
		Callbacks:   callbacks, Credential: credential,
		SyncTimeout: 10 * time.Second, Lease: 2 * time.Second, LeaseGrace: time.Second,
		Deadline: time.Minute, Wait: 30 * time.Second,
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	st, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return st
}

// wire registers a wireAdapter with sabotage s.
func wire(s sabotage) registerFunc {
	return func(t *testing.T, srv *grpc.Server, callbackAddr string, key ed25519.PublicKey) {
		conn, err := grpc.NewClient(callbackAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		w := newWireAdapter(s, adapterID, key, conn, credential)
		adapterv1.RegisterAdapterServiceServer(srv, w)
		t.Cleanup(func() {
			w.close()
			_ = conn.Close()
		})
	}
}

// sdk registers an adapter on the Go SDK: payload.later_ms > 0 is Later work of that long.
func sdk(t *testing.T, srv *grpc.Server, callbackAddr string, key ed25519.PublicKey) {
	h := func(ctx context.Context, req *adapter.Request) adapter.Result {
		later, _ := req.Payload["later_ms"].(float64)
		if later == 0 {
			return adapter.Complete(map[string]any{"ok": true})
		}
		return adapter.Later(askedLease, func(ctx context.Context, _ *adapter.Callbacks) adapter.Result {
			work := time.NewTimer(time.Duration(later) * time.Millisecond)
			defer work.Stop()
			select {
			case <-ctx.Done():
				return adapter.Fail(adapter.ClassUnavailable, "cancelled", "the work was cancelled", true)
			case <-work.C:
				return adapter.Complete(map[string]any{"ok": true})
			}
		})
	}
	s, err := adapter.New(h, adapter.Options{CallbackAddr: callbackAddr, Credential: credential, AdapterID: adapterID,
		PlatformKeys: []ed25519.PublicKey{key}})
	require.NoError(t, err)
	s.Register(srv)
	t.Cleanup(func() { _ = s.Close() })
}

// run runs the check and logs its report.
func run(t *testing.T, cfg adaptercheck.Config) *adaptercheck.Report {
	t.Helper()
	report, err := adaptercheck.Run(context.Background(), cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, report.Write(&out))
	t.Log("\n" + out.String())
	return report
}

// TestConformantAdaptersPass: an adapter on the Go SDK and one written against the wire protocol
// alone pass every rule, with no warning.
func TestConformantAdaptersPass(t *testing.T) {
	t.Parallel()
	for name, register := range map[string]registerFunc{"sdk": sdk, "wire": wire(conformant)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			report := run(t, setup(t, register))
			require.Len(t, report.Results, len(adaptercheck.Rules))
			for i, res := range report.Results {
				require.Equal(t, adaptercheck.Rules[i].Rule, res.Rule, "report order")
				require.Equal(t, adaptercheck.Pass, res.Verdict, "%s: %s", res.Rule, res.Detail)
			}
		})
	}
}

// TestBrokenAdaptersFailNamingTheRule: an adapter that breaks one thing fails exactly the rules
// about it, and the line says what went wrong.
func TestBrokenAdaptersFailNamingTheRule(t *testing.T) {
	t.Parallel()
	tokenRules := []adaptercheck.Rule{adaptercheck.RuleUnsigned, adaptercheck.RuleForged, adaptercheck.RuleExpired,
		adaptercheck.RuleReplayed, adaptercheck.RuleAudience, adaptercheck.RuleBinding}
	for _, tc := range []struct {
		name     string
		sabotage sabotage
		wait     time.Duration
		failed   []adaptercheck.Rule
		detail   string
	}{
		{"skips the token check", skipsTokenCheck, 0, tokenRules, "answered completed: the call ran without a valid token"},
		{"marker under the wrong domain", wrongMarkerDomain, 0, tokenRules,
			`malformed refusal marker (wrong_domain): the ErrorInfo's domain is "integrations", want "integrations.platform"`},
		{"never renews its lease", neverRenews, 0, []adaptercheck.Rule{adaptercheck.RuleLease}, "ran out with no renewal or completion"},
		{"ignores Cancel", ignoresCancel, 0, []adaptercheck.Rule{adaptercheck.RuleCancel},
			"the work completed (succeeded)"},
		{"completes twice", completesTwice, 0, []adaptercheck.Rule{adaptercheck.RuleComplete},
			"a second Complete came"},
		{"gives up its outcome", givesUpOutcome, 10 * time.Second, []adaptercheck.Rule{adaptercheck.RuleLate},
			"did not retry within 10s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := setup(t, wire(tc.sabotage))
			if tc.wait > 0 {
				cfg.Wait = tc.wait
			}
			report := run(t, cfg)
			require.Equal(t, tc.failed, report.Failed())
			for _, rule := range tc.failed {
				require.Contains(t, report.Result(rule).Detail, tc.detail, rule)
			}
		})
	}
}

// TestValidate: a check that cannot run says which setting is missing.
func TestValidate(t *testing.T) {
	t.Parallel()
	_, err := adaptercheck.Run(context.Background(), adaptercheck.Config{LongPayload: &structpb.Struct{}})
	require.ErrorContains(t, err, "the adapter's address is required")
	require.ErrorContains(t, err, "the adapter id (the tokens' audience) is required")
	require.ErrorContains(t, err, "a platform signing key is required")
	require.ErrorContains(t, err, "the capability is required")
	require.ErrorContains(t, err, "the long-work rules need a listener for the callback service")
}
