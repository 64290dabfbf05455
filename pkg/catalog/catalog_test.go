package catalog_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/secret"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// env is a lookup over a fixed map, so no test depends on the process environment.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

var devVars = map[string]string{
	"INTEGRATIONS_DEV_API_KEY":              "dev-api-key-0123456789abcdef",
	"INTEGRATIONS_DUMMY_ADAPTER_ADDR":       "127.0.0.1:50070",
	"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL": "dummy-credential-0123456789",
}

func readDevCatalog(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/catalog/dev.yaml")
	require.NoError(t, err)
	return raw
}

func TestParseDevCatalog(t *testing.T) {
	t.Parallel()

	c, err := catalog.Parse(readDevCatalog(t), env(devVars))
	require.NoError(t, err)

	require.Len(t, c.Applications, 1)
	require.Equal(t, "dev-app", c.Applications[0].ID)
	require.Equal(t, devVars["INTEGRATIONS_DEV_API_KEY"], c.Applications[0].APIKey)
	require.Len(t, c.Adapters, 1)
	require.Equal(t, "dummy", c.Adapters[0].ID)
	require.Equal(t, devVars["INTEGRATIONS_DUMMY_ADAPTER_ADDR"], c.Adapters[0].Endpoint)
	require.Equal(t, devVars["INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL"], c.Adapters[0].Credential)
	require.Len(t, c.Capabilities, 1)
	require.Equal(t, "dummy.echo", c.Capabilities[0].Name)
	require.Equal(t, "dummy", c.Capabilities[0].Adapter)
	require.Equal(t, []string{"async", "sync"}, c.Capabilities[0].Modes)
}

func TestParseReportsMissingVariablesByName(t *testing.T) {
	t.Parallel()

	vars := map[string]string{"INTEGRATIONS_DUMMY_ADAPTER_ADDR": "127.0.0.1:50070"}
	_, err := catalog.Parse(readDevCatalog(t), env(vars))
	require.Error(t, err)
	require.Contains(t, err.Error(), "INTEGRATIONS_DEV_API_KEY")
	require.Contains(t, err.Error(), "INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL")
	require.NotContains(t, err.Error(), "INTEGRATIONS_DUMMY_ADAPTER_ADDR", "a variable that is set is not missing")
}

func TestParseRejectsUnknownFields(t *testing.T) {
	t.Parallel()

	raw := catalogYAML(t, spec{appExtra: "    colour: red\n"})
	_, err := catalog.Parse([]byte(raw), env(nil))
	require.Error(t, err)
	require.Contains(t, err.Error(), "colour")
}

// spec fills catalogYAML; zero fields take a valid default.
type spec struct {
	appID, appKey, appKeySHA string
	appExtra                 string // extra lines under the application
	secondAppID              string // adds a second application with this id
	adapterID                string
	capAdapter               string
	modes                    string
	asyncBudget              string
	retryDelays              string
	capExtra                 string // extra lines under the capability
}

const (
	testAPIKey     = "test-api-key-0123456789"
	testCredential = "test-credential-0123456789"
)

// catalogYAML returns a catalog of one application, one adapter and one capability, valid unless
// s says otherwise.
func catalogYAML(t *testing.T, s spec) string {
	t.Helper()
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	var b strings.Builder
	b.WriteString("applications:\n")
	fmt.Fprintf(&b, "  - id: %s\n    name: Test application\n", or(s.appID, "app"))
	if s.appKeySHA != "" {
		fmt.Fprintf(&b, "    api_key_sha256: %q\n", s.appKeySHA)
	}
	if s.appKey != "" || s.appKeySHA == "" {
		fmt.Fprintf(&b, "    api_key: %q\n", or(s.appKey, testAPIKey))
	}
	b.WriteString(s.appExtra)
	if s.secondAppID != "" {
		fmt.Fprintf(&b, "  - id: %s\n    api_key: %q\n", s.secondAppID, testAPIKey+"-second")
	}
	fmt.Fprintf(&b, `adapters:
  - id: %s
    endpoint: 127.0.0.1:50070
    credential: %q
capabilities:
  - name: test.echo
    adapter: %s
    modes: %s
    max_attempts: 3
    async_budget: %s
    retry_delays: %s
%s`, or(s.adapterID, "adp"), testCredential, or(s.capAdapter, "adp"), or(s.modes, "[async, sync]"),
		or(s.asyncBudget, "24h"), or(s.retryDelays, "[1m, 5m]"), s.capExtra)
	return b.String()
}

func TestParseValid(t *testing.T) {
	t.Parallel()

	_, err := catalog.Parse([]byte(catalogYAML(t, spec{})), env(nil))
	require.NoError(t, err, "the base of the validation cases must itself be valid")
}

func TestValidationErrorsNameTheField(t *testing.T) {
	t.Parallel()

	hexKey := hex.EncodeToString(sha256.New().Sum(nil))
	tests := []struct {
		name string
		spec spec
		// want are substrings of the error: the field at fault and why.
		want []string
	}{
		{"bad application id", spec{appID: "Bad_ID"}, []string{"applications[0].id", `"Bad_ID"`}},
		{"bad adapter id", spec{adapterID: "-adp", capAdapter: "-adp"}, []string{"adapters[0].id", `"-adp"`}},
		{"duplicate application id", spec{secondAppID: "app"}, []string{"applications[1].id", "appears twice"}},
		{"capability names an unknown adapter", spec{capAdapter: "nowhere"}, []string{"capabilities[0].adapter", `"nowhere"`}},
		{"unknown mode", spec{modes: "[async, batch]"}, []string{"capabilities[0].modes", `"batch"`}},
		{"no mode", spec{modes: "[]"}, []string{"capabilities[0].modes", "required"}},
		{"async budget over 24h", spec{asyncBudget: "25h"}, []string{"capabilities[0].async_budget", `"25h"`}},
		{"async budget not a duration", spec{asyncBudget: "a day"}, []string{"capabilities[0].async_budget"}},
		{"zero retry delay", spec{retryDelays: "[1m, 0s]"}, []string{"capabilities[0].retry_delays[1]", `"0s"`}},
		{"negative retry delay", spec{retryDelays: "[-1m]"}, []string{"capabilities[0].retry_delays[0]", `"-1m"`}},
		{"key shorter than 16 characters", spec{appKey: "short-key"}, []string{"applications[0]", "api_key", "at least 16"}},
		{"both api_key and api_key_sha256", spec{appKey: testAPIKey, appKeySHA: hexKey}, []string{"applications[0]", "api_key_sha256", "not both"}},
		{"api_key_sha256 not 64 hex digits", spec{appKeySHA: "abcd"}, []string{"applications[0]", "api_key_sha256", "64 hex digits"}},
		{"consumer of neither kind", spec{appExtra: "    consumer: {}\n"}, []string{"applications[0].consumer", "exactly one"}},
		{"consumer of both kinds", spec{appExtra: "    consumer: {webhook: {url: 'https://a.example/e'}, grpc: {target: 'a.example:443'}}\n"},
			[]string{"applications[0].consumer", "exactly one"}},
		{"webhook url not http(s)", spec{appExtra: "    consumer: {webhook: {url: 'ftp://a.example/e'}}\n"},
			[]string{"applications[0].consumer.webhook.url", `"ftp://a.example/e"`}},
		{"webhook url relative", spec{appExtra: "    consumer: {webhook: {url: '/events'}}\n"},
			[]string{"applications[0].consumer.webhook.url"}},
		{"grpc target without port", spec{appExtra: "    consumer: {grpc: {target: 'a.example'}}\n"},
			[]string{"applications[0].consumer.grpc.target", `"a.example"`}},
		{"grpc target with a bad port", spec{appExtra: "    consumer: {grpc: {target: 'a.example:70000'}}\n"},
			[]string{"applications[0].consumer.grpc.target"}},
		{"progress events on a sync-only capability", spec{modes: "[sync]", capExtra: "    progress_events: true\n"},
			[]string{"capabilities[0].progress_events", "async"}},
		{"progress events not a boolean", spec{capExtra: "    progress_events: often\n"}, []string{"often", "bool"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := catalog.Parse([]byte(catalogYAML(t, tt.spec)), env(nil))
			require.Error(t, err)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// rows renders every row of the catalog's tables, without timestamps, as text.
func rows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var out []string
	for _, q := range []string{
		`SELECT row_to_json(x)::text FROM (SELECT id, name, api_key_hash, consumer_kind, consumer_endpoint, signing_secret_enc FROM applications ORDER BY id) x`,
		`SELECT row_to_json(x)::text FROM (SELECT id, name, endpoint, credential_hash FROM adapters ORDER BY id) x`,
		`SELECT row_to_json(x)::text FROM (SELECT name, adapter_id, modes, max_attempts, async_budget_ms, retry_delays_ms, lease_ms, sync_timeout_ms, progress_events FROM capabilities ORDER BY name) x`,
	} {
		r, err := pool.Query(context.Background(), q)
		require.NoError(t, err)
		for r.Next() {
			var s string
			require.NoError(t, r.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, r.Err())
	}
	return out
}

func TestApplyIsIdempotentAndStoresOnlyHashes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)

	c, err := catalog.Parse(readDevCatalog(t), env(devVars))
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(ctx, s.Pool, c))
	first := rows(t, s.Pool)
	require.Len(t, first, 3)

	require.NoError(t, catalog.Apply(ctx, s.Pool, c))
	require.Equal(t, first, rows(t, s.Pool), "applying the same catalog twice changes nothing")

	var apiKeyHash, credentialHash []byte
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT api_key_hash FROM applications WHERE id = 'dev-app'`).Scan(&apiKeyHash))
	want := sha256.Sum256([]byte(devVars["INTEGRATIONS_DEV_API_KEY"]))
	require.Equal(t, want[:], apiKeyHash)
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT credential_hash FROM adapters WHERE id = 'dummy'`).Scan(&credentialHash))
	want = sha256.Sum256([]byte(devVars["INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL"]))
	require.Equal(t, want[:], credentialHash)

	// Every column of every row, timestamps included, as text: neither secret appears in clear,
	// nor in any encoding that row_to_json would give a text column.
	for _, table := range []string{"applications", "adapters", "capabilities"} {
		r, err := s.Pool.Query(ctx, `SELECT row_to_json(t)::text FROM `+table+` t`)
		require.NoError(t, err)
		for r.Next() {
			var row string
			require.NoError(t, r.Scan(&row))
			require.NotContains(t, row, devVars["INTEGRATIONS_DEV_API_KEY"], table)
			require.NotContains(t, row, devVars["INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL"], table)
		}
		require.NoError(t, r.Err())
	}
}

func TestApplyStoresAGivenSHA256AsIs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)

	sum := sha256.Sum256([]byte("a key that only its owner knows"))
	c, err := catalog.Parse([]byte(catalogYAML(t, spec{appKeySHA: hex.EncodeToString(sum[:])})), env(nil))
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(ctx, s.Pool, c))

	var got []byte
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT api_key_hash FROM applications WHERE id = 'app'`).Scan(&got))
	require.Equal(t, sum[:], got)
}

func TestParseKeepsVariableValuesVerbatim(t *testing.T) {
	t.Parallel()

	for _, key := range []string{
		"abcdefghijklmnop #qrstuvwxyz",
		"*abcdefghijklmnopqrstuvwxyz",
		"abcdefghijklmnop: qrstuvwxyz",
	} {
		vars := map[string]string{
			"INTEGRATIONS_DEV_API_KEY":              key,
			"INTEGRATIONS_DUMMY_ADAPTER_ADDR":       "127.0.0.1:50070",
			"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL": "dummy-credential-0123456789",
		}
		c, err := catalog.Parse(readDevCatalog(t), env(vars))
		require.NoError(t, err, key)
		require.Equal(t, key, c.Applications[0].APIKey)
	}
}

func newBox(t *testing.T) *secret.Box {
	t.Helper()
	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", base64.StdEncoding.EncodeToString(key))
	require.NoError(t, err)
	return box
}

type consumerRow struct {
	kind, endpoint *string
	sealed         []byte
}

func readConsumer(t *testing.T, pool *pgxpool.Pool, app string) consumerRow {
	t.Helper()
	var r consumerRow
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT consumer_kind, consumer_endpoint, signing_secret_enc FROM applications WHERE id = $1`, app).
		Scan(&r.kind, &r.endpoint, &r.sealed))
	return r
}

func TestApplyDeclaredConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	box := newBox(t)

	webhookCatalog, err := catalog.Parse([]byte(catalogYAML(t, spec{
		appExtra: "    consumer:\n      webhook:\n        url: https://consumer.example/events\n"})), env(nil))
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(ctx, s.Pool, webhookCatalog, catalog.WithSecretBox(box)))
	got := readConsumer(t, s.Pool, "app")
	require.Equal(t, "webhook", *got.kind)
	require.Equal(t, "https://consumer.example/events", *got.endpoint)
	plain, err := box.Open(got.sealed)
	require.NoError(t, err)
	require.Regexp(t, `^whsec_`, string(plain), "a signing secret is created and sealed")

	// Applying again, or switching to a gRPC consumer, keeps the secret; no box is needed then.
	require.NoError(t, catalog.Apply(ctx, s.Pool, webhookCatalog))
	require.Equal(t, got, readConsumer(t, s.Pool, "app"))
	grpcCatalog, err := catalog.Parse([]byte(catalogYAML(t, spec{
		appExtra: "    consumer: {grpc: {target: 'consumer.example:9000'}}\n"})), env(nil))
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(ctx, s.Pool, grpcCatalog))
	switched := readConsumer(t, s.Pool, "app")
	require.Equal(t, "grpc", *switched.kind)
	require.Equal(t, "consumer.example:9000", *switched.endpoint)
	require.Equal(t, got.sealed, switched.sealed)

	// An application without a declared consumer keeps the one registered through the API.
	plainCatalog, err := catalog.Parse([]byte(catalogYAML(t, spec{})), env(nil))
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(ctx, s.Pool, plainCatalog))
	require.Equal(t, switched, readConsumer(t, s.Pool, "app"))
}

func TestApplyRefusesAWebhookItCannotSign(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)

	c, err := catalog.Parse([]byte(catalogYAML(t, spec{
		appExtra: "    consumer: {webhook: {url: 'https://consumer.example/events'}}\n"})), env(nil))
	require.NoError(t, err)
	err = catalog.Apply(ctx, s.Pool, c)
	require.Error(t, err)
	require.Contains(t, err.Error(), "application app")
	require.Contains(t, err.Error(), "INTEGRATIONS_SECRET_KEY")
	require.Empty(t, rows(t, s.Pool), "nothing applied")

	// A gRPC consumer's deliveries are signed too: it needs one as well.
	c, err = catalog.Parse([]byte(catalogYAML(t, spec{
		appExtra: "    consumer: {grpc: {target: 'consumer.example:9000'}}\n"})), env(nil))
	require.NoError(t, err)
	err = catalog.Apply(ctx, s.Pool, c)
	require.Error(t, err)
	require.Contains(t, err.Error(), "application app declares a grpc consumer")
	require.Empty(t, rows(t, s.Pool), "nothing applied")
}

// progress_events is stored on the capability, and applying a catalog without it turns it off
// again: the catalog is the whole truth about a capability.
func TestApplyProgressEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	flag := func() bool {
		var on bool
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT progress_events FROM capabilities WHERE name = 'test.echo'`).Scan(&on))
		return on
	}
	on, err := catalog.Parse([]byte(catalogYAML(t, spec{capExtra: "    progress_events: true\n"})), env(nil))
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(ctx, s.Pool, on))
	require.True(t, flag())

	off, err := catalog.Parse([]byte(catalogYAML(t, spec{})), env(nil))
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(ctx, s.Pool, off))
	require.False(t, flag())
}
