// Package catalog reads the declarative catalog of applications, adapters and capabilities that a
// platform team keeps in git, and applies it to the database in one transaction.
//
// The file is YAML. ${VAR} references are replaced from the environment before parsing, so that
// keys and endpoints that differ per environment stay out of git; a missing variable is an error.
// Keys are hashed before they are stored and never logged.
package catalog

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/webhook"
)

// Catalog is the whole file.
type Catalog struct {
	Applications []Application `yaml:"applications"`
	Adapters     []Adapter     `yaml:"adapters"`
	Capabilities []Capability  `yaml:"capabilities"`
}

// Application is a client application. Give exactly one of APIKey (usually "${SOME_VAR}") or
// APIKeySHA256 (hex). It becomes the application's catalog key, a bootstrap key beside the keys
// created through the operator API (which applying the catalog never touches): a generated key
// (`integrationsctl keys generate`) or a string an operator chose that looks like 32 random bytes
// (apikey.WeakSecret; at least 16 characters where weak keys are allowed, on loopback).
//
// A key given in clear is judged when the catalog is applied: one that does not look like 32
// random bytes (apikey.WeakSecret; see WeakAPIKeys) is recorded weak with the stored key, and the
// gateway then refuses to start unless every listener of it is on loopback. A key given only as
// APIKeySHA256 cannot be judged — nothing but its hash is ever seen — so its strength is the
// operator's responsibility: hash a generated key.
type Application struct {
	ID           string `yaml:"id"`
	Name         string `yaml:"name"`
	APIKey       string `yaml:"api_key"`
	APIKeySHA256 string `yaml:"api_key_sha256"`
	// apiKeyVars are the variables api_key was written with (${NAME}), to name in a refusal
	// instead of the key.
	apiKeyVars []string
	// Consumer, if given, is where the application's events are delivered; applying it replaces
	// one registered through the API. Without it, the registered consumer is left alone.
	Consumer *Consumer `yaml:"consumer"`
	// RateLimits, if given, are the application's own limits (see RateLimits).
	RateLimits *RateLimits `yaml:"rate_limits"`
}

// Consumer is an application's event consumer: exactly one of Webhook or GRPC.
type Consumer struct {
	Webhook *WebhookConsumer `yaml:"webhook"`
	GRPC    *GRPCConsumer    `yaml:"grpc"`
}

// WebhookConsumer receives events as signed HTTP POSTs.
type WebhookConsumer struct {
	// URL is an absolute http(s) URL.
	URL string `yaml:"url"`
}

// GRPCConsumer receives events through the EventConsumerService it serves, over TLS unless
// Plaintext, signed as a webhook is.
type GRPCConsumer struct {
	// Target is host:port.
	Target string `yaml:"target"`
	// CAPEM is the CA bundle the target's certificate must chain to (PEM CERTIFICATE blocks);
	// empty: the system roots.
	CAPEM string `yaml:"ca_pem"`
	// Plaintext delivers without TLS. The catalog is the platform team's, so it is taken here as
	// an http webhook URL is, whatever INTEGRATIONS_WEBHOOK_ALLOW_HTTP says.
	Plaintext bool `yaml:"plaintext"`
}

// stored is the consumer as stored (applications.consumer_kind, consumer_endpoint,
// consumer_grpc_plaintext, consumer_grpc_ca).
func (c *Consumer) stored() (kind, endpoint string, plaintext bool, caPEM *string) {
	if c.Webhook != nil {
		return "webhook", c.Webhook.URL, false, nil
	}
	if c.GRPC.CAPEM != "" {
		caPEM = &c.GRPC.CAPEM
	}
	return "grpc", c.GRPC.Target, c.GRPC.Plaintext, caPEM
}

// Adapter is a provider integration reachable over gRPC. Give exactly one of Credential or
// CredentialSHA256.
type Adapter struct {
	ID               string `yaml:"id"`
	Name             string `yaml:"name"`
	Endpoint         string `yaml:"endpoint"`
	Credential       string `yaml:"credential"`
	CredentialSHA256 string `yaml:"credential_sha256"`
}

// Capability is something an application can invoke, served by one adapter.
type Capability struct {
	Name        string   `yaml:"name"`
	Adapter     string   `yaml:"adapter"`
	Modes       []string `yaml:"modes"`
	MaxAttempts int      `yaml:"max_attempts"`
	AsyncBudget string   `yaml:"async_budget"`
	RetryDelays []string `yaml:"retry_delays"`
	Lease       string   `yaml:"lease"`
	SyncTimeout string   `yaml:"sync_timeout"`
	// ProgressEvents makes each progress report of an async execution an execution.progress
	// event delivered to the application, ordered before the completion event (docs/decisions.md,
	// "Progress events").
	ProgressEvents bool `yaml:"progress_events"`
}

// Defaults (docs/architecture.md §4).
var (
	DefaultRetryDelays = []time.Duration{time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 6 * time.Hour}
	DefaultMaxAttempts = 10
	MaxAsyncBudget     = 24 * time.Hour
	DefaultLease       = 5 * time.Minute
	DefaultSyncTimeout = 30 * time.Second
)

var (
	idPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)
	namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,127}$`)
	varPattern  = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
)

// Load reads and validates a catalog file.
func Load(path string) (*Catalog, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read catalog: %w", err)
	}
	c, err := Parse(raw, os.LookupEnv)
	if err != nil {
		return nil, fmt.Errorf("catalog %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes the YAML strictly, replaces ${VAR} references in its values with lookup, and
// validates the result. Values are substituted after decoding, so a secret is taken verbatim
// whatever characters it holds, and a reference in a comment means nothing.
func Parse(raw []byte, lookup func(string) (string, bool)) (*Catalog, error) {
	// The strict pass refuses unknown fields; references are still plain text there.
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var c Catalog
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	vars := make([][]string, len(c.Applications))
	for i, a := range c.Applications {
		for _, m := range varPattern.FindAllStringSubmatch(a.APIKey, -1) {
			vars[i] = append(vars[i], m[1])
		}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	var missing []string
	expand(&doc, func(name string) string {
		v, ok := lookup(name)
		if !ok && !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("environment variables not set: %s", strings.Join(missing, ", "))
	}
	c = Catalog{}
	if err := doc.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	// Both decodes read the same document: the applications line up.
	for i := range min(len(c.Applications), len(vars)) {
		c.Applications[i].apiKeyVars = vars[i]
	}
	return &c, nil
}

// expand replaces ${VAR} references in every scalar value under n.
func expand(n *yaml.Node, value func(name string) string) {
	if n.Kind == yaml.ScalarNode {
		n.Value = varPattern.ReplaceAllStringFunc(n.Value, func(m string) string {
			return value(varPattern.FindStringSubmatch(m)[1])
		})
		// The node keeps the tag resolved from the reference's own text (!!str), so the value
		// decodes as a string whatever it looks like.
		return
	}
	for _, child := range n.Content {
		expand(child, value)
	}
}

// Validate checks every entry and names the one at fault.
func (c *Catalog) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	seen := map[string]bool{}
	// unique checks an entry's name (the field at where) against pattern and the names of its
	// kind before it.
	unique := func(where, kind, name string, pattern *regexp.Regexp) {
		if !pattern.MatchString(name) {
			bad("%s: %q must match %s", where, name, pattern)
		}
		if seen[kind+":"+name] {
			bad("%s: %q appears twice", where, name)
		}
		seen[kind+":"+name] = true
	}
	for i, a := range c.Applications {
		where := fmt.Sprintf("applications[%d]", i)
		unique(where+".id", "app", a.ID, idPattern)
		if p := jsonbound.Problem(a.Name); p != "" {
			bad("%s.name: %s", where, p)
		}
		if err := checkSecret(a.APIKey, a.APIKeySHA256); err != nil {
			bad("%s: api_key/api_key_sha256: %v", where, err)
		} else if err := checkAPIKey(a.APIKey); err != nil {
			bad("%s.api_key: %v", where, err)
		}
		if a.Consumer != nil {
			if err := checkConsumer(a.Consumer); err != nil {
				bad("%s.consumer%v", where, err)
			}
		}
		for _, problem := range checkRateLimits(a.RateLimits) {
			bad("%s.rate_limits.%s", where, problem)
		}
	}
	for i, a := range c.Adapters {
		where := fmt.Sprintf("adapters[%d]", i)
		unique(where+".id", "adapter", a.ID, idPattern)
		if a.Endpoint == "" {
			bad("%s.endpoint: required (host:port of the adapter's gRPC server)", where)
		} else if p := jsonbound.Problem(a.Endpoint); p != "" {
			bad("%s.endpoint: %s", where, p)
		}
		if err := checkSecret(a.Credential, a.CredentialSHA256); err != nil {
			bad("%s: credential/credential_sha256: %v", where, err)
		}
	}
	for i, cp := range c.Capabilities {
		where := fmt.Sprintf("capabilities[%d]", i)
		unique(where+".name", "cap", cp.Name, namePattern)
		if !seen["adapter:"+cp.Adapter] {
			bad("%s.adapter: %q is not an adapter of this catalog", where, cp.Adapter)
		}
		if len(cp.Modes) == 0 {
			bad("%s.modes: required: async, sync or both", where)
		}
		for _, m := range cp.Modes {
			if m != "async" && m != "sync" {
				bad("%s.modes: %q is not async or sync", where, m)
			}
		}
		if cp.MaxAttempts < 0 {
			bad("%s.max_attempts: %d must be positive", where, cp.MaxAttempts)
		}
		if d, err := duration(cp.AsyncBudget, MaxAsyncBudget); err != nil || d < time.Millisecond || d > MaxAsyncBudget {
			bad("%s.async_budget: %q must be a duration in (0, %s]", where, cp.AsyncBudget, MaxAsyncBudget)
		}
		for j, s := range cp.RetryDelays {
			if d, err := time.ParseDuration(s); err != nil || d < time.Millisecond {
				bad("%s.retry_delays[%d]: %q must be a duration of at least 1ms", where, j, s)
			}
		}
		if d, err := duration(cp.Lease, DefaultLease); err != nil || d < time.Millisecond {
			bad("%s.lease: %q must be a duration of at least 1ms", where, cp.Lease)
		}
		if d, err := duration(cp.SyncTimeout, DefaultSyncTimeout); err != nil || d < time.Millisecond {
			bad("%s.sync_timeout: %q must be a duration of at least 1ms", where, cp.SyncTimeout)
		}
		if cp.ProgressEvents && !slices.Contains(cp.Modes, "async") {
			// A sync execution's progress is never sent: its caller waits for the answer.
			bad("%s.progress_events: only an async capability sends progress events; add async to modes", where)
		}
	}
	return errors.Join(errs...)
}

// checkConsumer checks the form of a consumer; its error starts with the field at fault (".grpc.target: ...").
// Private addresses are not refused here: the catalog is the platform team's, and the event router
// still refuses them after name resolution unless the deployment allows them.
func checkConsumer(c *Consumer) error {
	switch {
	case (c.Webhook == nil) == (c.GRPC == nil):
		return errors.New(": give exactly one of webhook or grpc")
	case c.Webhook != nil:
		u, err := url.Parse(c.Webhook.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" || u.User != nil {
			return fmt.Errorf(".webhook.url: %q must be an absolute http(s) URL without credentials", c.Webhook.URL)
		}
	default:
		host, port, err := net.SplitHostPort(c.GRPC.Target)
		p, perr := strconv.Atoi(port)
		if err != nil || host == "" || strings.ContainsAny(host, "/@ ") || jsonbound.Problem(host) != "" || perr != nil || p < 1 || p > 65535 {
			return fmt.Errorf(".grpc.target: %q must be host:port", c.GRPC.Target)
		}
		if c.GRPC.CAPEM != "" {
			if c.GRPC.Plaintext {
				return errors.New(".grpc.ca_pem: a CA applies to TLS only; leave it out with plaintext")
			}
			if _, err := webhook.ParseCAPEM(c.GRPC.CAPEM); err != nil {
				return fmt.Errorf(".grpc.ca_pem: %w", err)
			}
		}
	}
	return nil
}

func checkSecret(cleartext, hash string) error {
	switch {
	case cleartext != "" && hash != "":
		return errors.New("give one, not both")
	case cleartext == "" && hash == "":
		return errors.New("one is required")
	case hash != "":
		if b, err := hex.DecodeString(hash); err != nil || len(b) != sha256.Size {
			return errors.New("sha256 must be 64 hex digits")
		}
	case len(cleartext) < 16:
		return errors.New("a key must be at least 16 characters")
	}
	return nil
}

// checkAPIKey refuses a clear key the gateway would never accept.
func checkAPIKey(key string) error {
	if key == "" {
		return nil
	}
	if len(key) > apikey.MaxTokenLen {
		return fmt.Errorf("must be at most %d characters", apikey.MaxTokenLen)
	}
	if !apikey.PrintableASCII(key) {
		return errors.New("must be printable ASCII (a header carries nothing else)")
	}
	if strings.TrimSpace(key) != key {
		// The gateway trims the bearer token, so such a key could never authenticate.
		return errors.New("must not begin or end with a space")
	}
	if _, err := apikey.Parse(key); errors.Is(err, apikey.ErrMalformed) {
		return fmt.Errorf("starts with %s but is not a generated key (wrong length, character or checksum)", apikey.Prefix)
	}
	return nil
}

// WeakKey is an application whose api_key, given in clear, does not look like 32 random bytes.
type WeakKey struct {
	// Field is where the key is declared: "applications[0].api_key".
	Field string
	// ApplicationID is the application's id.
	ApplicationID string
	// Variables are the ${NAME}s the key was written with, if any.
	Variables []string
	// Problem is apikey.WeakSecret's reason; it never quotes the key.
	Problem string
}

// String names the key by its field, application and variables — never by its value.
func (w WeakKey) String() string {
	from := ""
	if len(w.Variables) > 0 {
		from = " (set from " + strings.Join(w.Variables, ", ") + ")"
	}
	return fmt.Sprintf("%s of application %s%s does not look like %d random bytes (%s)",
		w.Field, w.ApplicationID, from, apikey.MinSecretLen, w.Problem)
}

// WeakAPIKeys judges every api_key given in clear with apikey.WeakSecret, in the catalog's order.
// Apply records the same verdict with the stored key, for the gateway to read at start. A key
// given only as api_key_sha256 cannot be judged and is never listed.
func (c *Catalog) WeakAPIKeys() []WeakKey {
	var weak []WeakKey
	for i, a := range c.Applications {
		if a.APIKey == "" {
			continue
		}
		if problem := apikey.WeakSecret(a.APIKey); problem != "" {
			weak = append(weak, WeakKey{
				Field: fmt.Sprintf("applications[%d].api_key", i), ApplicationID: a.ID,
				Variables: a.apiKeyVars, Problem: problem,
			})
		}
	}
	return weak
}

// weakVerdict is what applyAPIKey records of a key in api_keys.weak: nil (never judged) for a key
// given only by its hash.
func weakVerdict(a Application) *bool {
	if a.APIKey == "" {
		return nil
	}
	weak := apikey.WeakSecret(a.APIKey) != ""
	return &weak
}

// applyAPIKey makes the application's declared key its catalog key: kept as it is (with its
// last-used time, and revoked if an operator revoked it) when it is the same key, replacing the
// previous catalog key otherwise. Keys created through the API are left alone.
func applyAPIKey(ctx context.Context, tx pgx.Tx, a Application) error {
	hash := hashOf(a.APIKey, a.APIKeySHA256)
	kind, id := "chosen", ""
	if k, err := apikey.Parse(a.APIKey); err == nil {
		kind, id = "generated", k.ID
	} else {
		b := make([]byte, 6)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("apply key of application %s: %w", a.ID, err)
		}
		id = "chosen_" + hex.EncodeToString(b)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM api_keys WHERE application_id = $1 AND source = 'catalog' AND hash <> $2`,
		a.ID, hash); err != nil {
		return fmt.Errorf("replace catalog key of application %s: %w", a.ID, err)
	}
	// The same key again keeps its row; only the verdict is written, and a key now given by its
	// hash keeps the verdict of when it was seen in clear (the hash names the same key). A hash
	// that is another application's key, or a key created through the API, changes nothing.
	tag, err := tx.Exec(ctx, `
		INSERT INTO api_keys (id, application_id, kind, hash, source, description, created_by, weak)
		VALUES ($1, $2, $3, $4, 'catalog', 'catalog key', 'catalog apply', $5)
		ON CONFLICT (hash) DO UPDATE SET weak = coalesce(excluded.weak, api_keys.weak)
		WHERE api_keys.application_id = excluded.application_id AND api_keys.source = 'catalog'`,
		id, a.ID, kind, hash, weakVerdict(a))
	if err != nil {
		return fmt.Errorf("apply catalog key of application %s: %w", a.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("application %s: api_key is already another key: declare a new one", a.ID)
	}
	return nil
}

// keepRevokedKeyDead overwrites applications.api_key_hash, just written with the declared hash,
// with one no token has when the declared key is a revoked catalog key: gateways of the release
// before migration 00009 (a rolling upgrade, a rollback, a migrate down) read that column, and
// must not take a revoked key back. The same transaction, so the declared hash is never seen.
func keepRevokedKeyDead(ctx context.Context, tx pgx.Tx, appID string) error {
	unusable, err := apikey.UnusableHash()
	if err != nil {
		return fmt.Errorf("apply catalog key of application %s: %w", appID, err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE applications a SET api_key_hash = $2
		FROM api_keys k
		WHERE a.id = $1 AND k.application_id = $1 AND k.source = 'catalog' AND k.revoked_at IS NOT NULL
			AND a.api_key_hash = k.hash`, appID, unusable); err != nil {
		return fmt.Errorf("apply catalog key of application %s: %w", appID, err)
	}
	return nil
}

// applyConsumer stores the application's consumer, with a new signing secret if it has none.
func applyConsumer(ctx context.Context, tx pgx.Tx, appID string, c *Consumer, box *secret.Box) error {
	var sealedNew []byte
	if box != nil {
		fresh, err := webhooks.NewSecret()
		if err != nil {
			return err
		}
		if sealedNew, err = box.Seal([]byte(fresh)); err != nil {
			return fmt.Errorf("seal signing secret of application %s: %w", appID, err)
		}
	}
	kind, endpoint, plaintext, caPEM := c.stored()
	var hasSecret bool
	if err := tx.QueryRow(ctx, `
		UPDATE applications SET consumer_kind = $2, consumer_endpoint = $3,
			consumer_grpc_plaintext = $5, consumer_grpc_ca = $6,
			signing_secret_enc = coalesce(signing_secret_enc, $4), updated_at = now()
		WHERE id = $1
		RETURNING signing_secret_enc IS NOT NULL`, appID, kind, endpoint, sealedNew, plaintext, caPEM).Scan(&hasSecret); err != nil {
		return fmt.Errorf("apply consumer of application %s: %w", appID, err)
	}
	// Every delivery, a webhook's or a gRPC consumer's, is signed: none can go out without a secret.
	if !hasSecret {
		return fmt.Errorf("application %s declares a %s consumer but has no signing secret yet: "+
			"INTEGRATIONS_SECRET_KEY is needed to create one", appID, kind)
	}
	return nil
}

func hashOf(cleartext, hash string) []byte {
	if hash != "" {
		b, _ := hex.DecodeString(hash)
		return b
	}
	return secret.Hash(cleartext)
}

func duration(s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	return time.ParseDuration(s)
}

func millis(s string, def time.Duration) int64 {
	d, _ := duration(s, def)
	return d.Milliseconds()
}

// ApplyOption changes how Apply applies a catalog.
type ApplyOption func(*applyOptions)

type applyOptions struct {
	box *secret.Box
}

// WithSecretBox lets Apply create the signing secret of an application that declares a consumer
// and has none yet, sealed with box (the deployment's INTEGRATIONS_SECRET_KEY). Without it, an
// application that declares a consumer and has no secret makes Apply fail, naming the
// application: a delivery, a webhook's or a gRPC consumer's, cannot be signed without one.
func WithSecretBox(box *secret.Box) ApplyOption {
	return func(o *applyOptions) { o.box = box }
}

// Apply upserts every entry in one transaction. Entries absent from the file are left alone:
// executions refer to them. An application's declared consumer replaces its registered one; its
// signing secret is kept if it has one, and created otherwise (see WithSecretBox).
func Apply(ctx context.Context, pool *pgxpool.Pool, c *Catalog, opts ...ApplyOption) error {
	var o applyOptions
	for _, opt := range opts {
		opt(&o)
	}
	return db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		for _, a := range c.Applications {
			if _, err := tx.Exec(ctx, `
				INSERT INTO applications (id, name, api_key_hash) VALUES ($1, $2, $3)
				ON CONFLICT (id) DO UPDATE SET name = excluded.name, api_key_hash = excluded.api_key_hash, updated_at = now()`,
				a.ID, cmp.Or(a.Name, a.ID), hashOf(a.APIKey, a.APIKeySHA256)); err != nil {
				return fmt.Errorf("apply application %s: %w", a.ID, err)
			}
			if err := applyAPIKey(ctx, tx, a); err != nil {
				return err
			}
			if err := keepRevokedKeyDead(ctx, tx, a.ID); err != nil {
				return err
			}
			if a.Consumer != nil {
				if err := applyConsumer(ctx, tx, a.ID, a.Consumer, o.box); err != nil {
					return err
				}
			}
			if err := applyRateLimits(ctx, tx, a.ID, a.RateLimits); err != nil {
				return err
			}
		}
		for _, a := range c.Adapters {
			if _, err := tx.Exec(ctx, `
				INSERT INTO adapters (id, name, endpoint, credential_hash) VALUES ($1, $2, $3, $4)
				ON CONFLICT (id) DO UPDATE SET name = excluded.name, endpoint = excluded.endpoint,
					credential_hash = excluded.credential_hash, updated_at = now()`,
				a.ID, cmp.Or(a.Name, a.ID), a.Endpoint, hashOf(a.Credential, a.CredentialSHA256)); err != nil {
				return fmt.Errorf("apply adapter %s: %w", a.ID, err)
			}
		}
		for _, cp := range c.Capabilities {
			delays := make([]int64, 0, len(cp.RetryDelays))
			for _, s := range cp.RetryDelays {
				delays = append(delays, millis(s, 0))
			}
			if len(delays) == 0 {
				for _, d := range DefaultRetryDelays {
					delays = append(delays, d.Milliseconds())
				}
			}
			maxAttempts := cmp.Or(cp.MaxAttempts, DefaultMaxAttempts)
			modes := slices.Clone(cp.Modes)
			slices.Sort(modes)
			modes = slices.Compact(modes)
			if _, err := tx.Exec(ctx, `
				INSERT INTO capabilities (name, adapter_id, modes, max_attempts, async_budget_ms, retry_delays_ms, lease_ms, sync_timeout_ms,
					progress_events)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
				ON CONFLICT (name) DO UPDATE SET adapter_id = excluded.adapter_id, modes = excluded.modes,
					max_attempts = excluded.max_attempts, async_budget_ms = excluded.async_budget_ms,
					retry_delays_ms = excluded.retry_delays_ms, lease_ms = excluded.lease_ms,
					sync_timeout_ms = excluded.sync_timeout_ms, progress_events = excluded.progress_events, updated_at = now()`,
				cp.Name, cp.Adapter, modes, maxAttempts, millis(cp.AsyncBudget, MaxAsyncBudget), delays,
				millis(cp.Lease, DefaultLease), millis(cp.SyncTimeout, DefaultSyncTimeout), cp.ProgressEvents); err != nil {
				return fmt.Errorf("apply capability %s: %w", cp.Name, err)
			}
		}
		return nil
	})
}
