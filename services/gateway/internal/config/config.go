// Package config is the gateway's configuration.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/config"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
)

// Config is read from the environment.
type Config struct {
	config.Common
	// InternalTLS is the service's identity on the internal hops (mTLS).
	config.InternalTLS
	// PublicTLS is served on the REST and gRPC ports.
	config.PublicTLS
	// SecretKeys seal the applications' webhook signing secrets at rest.
	config.SecretKeys
	GRPCAddr       string `env:"INTEGRATIONS_GRPC_ADDR" envDefault:"127.0.0.1:9090"`
	HTTPAddr       string `env:"INTEGRATIONS_HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	DispatcherAddr string `env:"INTEGRATIONS_DISPATCHER_ADDR" envDefault:"127.0.0.1:9091"`
	SettlementAddr string `env:"INTEGRATIONS_SETTLEMENT_ADDR" envDefault:"127.0.0.1:9094"`
	// MaxPayloadBytes bounds an invocation's payload (its JSON encoding).
	MaxPayloadBytes int `env:"INTEGRATIONS_MAX_PAYLOAD_BYTES" envDefault:"1048576"`
	// Webhook URLs must be https and resolve to public addresses unless these allow otherwise
	// (local development, tests).
	WebhookAllowHTTP bool `env:"INTEGRATIONS_WEBHOOK_ALLOW_HTTP" envDefault:"false"`
	// AdminToken authenticates the operator endpoints under /api/v1/system/; empty disables them.
	AdminToken          string `env:"INTEGRATIONS_ADMIN_TOKEN"`
	WebhookAllowPrivate bool   `env:"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE" envDefault:"false"`
	// WebhookDenyCIDRs lists ranges (comma-separated CIDRs) consumers may never be reached at,
	// whatever INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE says: a deployment's pod, service or VPC ranges
	// that are public address space. The gateway and the event router must be given the same.
	WebhookDenyCIDRs string `env:"INTEGRATIONS_WEBHOOK_DENY_CIDRS"`
	// SecretRotationOverlap is how long a rotated-out signing secret keeps signing deliveries
	// beside the new one. Not time-scaled: receivers switch secrets on the wall clock.
	SecretRotationOverlap time.Duration `env:"INTEGRATIONS_SECRET_ROTATION_OVERLAP" envDefault:"24h"`
	// CacheTTL is how long API keys' applications and capabilities read from Postgres are kept
	// (0: read on every call); a catalog change or a revoked key takes effect within it.
	CacheTTL time.Duration `env:"INTEGRATIONS_GATEWAY_CACHE_TTL" envDefault:"5s"`
	// ConsoleSessionTTL is how long a sign-in to the console under /console/ lasts.
	ConsoleSessionTTL time.Duration `env:"INTEGRATIONS_CONSOLE_SESSION_TTL" envDefault:"8h"`
	// Platform is the key that signs the platform's token on every call to an adapter.
	Platform platformtoken.SignerConfig
	// The REST server's timeouts: for the request's headers, for the whole request (headers and
	// body: a slow body cannot hold a connection), for writing the answer (it must exceed the
	// longest sync_timeout in the catalog, since a sync answer is written when its attempt ends),
	// and for a keep-alive connection's idle time. Not time-scaled: they are about clients.
	HTTPReadHeaderTimeout time.Duration `env:"INTEGRATIONS_HTTP_READ_HEADER_TIMEOUT" envDefault:"10s"`
	HTTPReadTimeout       time.Duration `env:"INTEGRATIONS_HTTP_READ_TIMEOUT" envDefault:"30s"`
	HTTPWriteTimeout      time.Duration `env:"INTEGRATIONS_HTTP_WRITE_TIMEOUT" envDefault:"2m"`
	HTTPIdleTimeout       time.Duration `env:"INTEGRATIONS_HTTP_IDLE_TIMEOUT" envDefault:"2m"`
	// The rate limits of an application that sets none in the catalog (issue 11): invokes and
	// reads (every other call) per second across all replicas, and their bursts. 0 is unlimited.
	RateLimitInvokes     float64 `env:"INTEGRATIONS_RATE_LIMIT_INVOKES" envDefault:"1000"`
	RateLimitInvokeBurst int     `env:"INTEGRATIONS_RATE_LIMIT_INVOKE_BURST" envDefault:"2000"`
	RateLimitReads       float64 `env:"INTEGRATIONS_RATE_LIMIT_READS" envDefault:"2000"`
	RateLimitReadBurst   int     `env:"INTEGRATIONS_RATE_LIMIT_READ_BURST" envDefault:"4000"`
	// RateLimitRefusalDelay is how long a call may wait on its limit: a call whose token comes
	// within it waits for it; one beyond it is held this long, then refused, so that a client
	// retrying in a loop calls once per delay.
	RateLimitRefusalDelay time.Duration `env:"INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY" envDefault:"100ms"`
	// RateLimitHeartbeat is how often a replica records itself alive and recounts the replicas
	// sharing the limits; one unseen for three heartbeats is no longer counted.
	RateLimitHeartbeat time.Duration `env:"INTEGRATIONS_RATE_LIMIT_HEARTBEAT" envDefault:"2s"`
	// AuthFailureBurst failed authentications (API, console sign-in, operator endpoints) are
	// answered 401 per source address, and per presented key id, before the next are refused 429;
	// they come back at AuthFailureBurst per AuthFailureWindow. Across all replicas: each holds its
	// share. Not time-scaled: it is about clients.
	AuthFailureBurst  int           `env:"INTEGRATIONS_AUTH_FAILURE_BURST" envDefault:"10"`
	AuthFailureWindow time.Duration `env:"INTEGRATIONS_AUTH_FAILURE_WINDOW" envDefault:"1m"`
}

// Loopback reports whether every listener of the gateway (gRPC, REST, metrics) is on a loopback
// address: development, where a weak admin token or catalog key is allowed with a warning.
func (c Config) Loopback() bool {
	addrs := []string{c.GRPCAddr, c.HTTPAddr}
	if c.MetricsAddr != "" {
		addrs = append(addrs, c.MetricsAddr)
	}
	for _, a := range addrs {
		if !config.IsLoopback(a) {
			return false
		}
	}
	return true
}

// CheckAdminToken refuses an INTEGRATIONS_ADMIN_TOKEN that does not look like 32 random bytes
// (apikey.WeakSecret) when a listener is not on loopback; on loopback it returns the problem as a
// warning. An empty token (no operator) is neither.
func (c Config) CheckAdminToken() (warning string, err error) {
	if c.AdminToken == "" {
		return "", nil
	}
	problem := apikey.WeakSecret(c.AdminToken)
	switch {
	case problem == "":
		return "", nil
	case c.Loopback():
		return "INTEGRATIONS_ADMIN_TOKEN is weak (" + problem + "): allowed because every listener is on loopback", nil
	default:
		return "", fmt.Errorf("INTEGRATIONS_ADMIN_TOKEN: does not look like %d random bytes (%s); make one with `head -c 24 /dev/urandom | base64` (a weak token is allowed only when every listener is on a loopback address)", apikey.MinSecretLen, problem)
	}
}

// CheckCatalogKeys applies the admin token's rule to catalog keys: weakApps are the applications
// whose catalog api_key `catalog apply` recorded weak (the gateway holds only hashes, so the
// verdict is made where the key is seen in clear). Any of them stops the gateway unless every
// listener is on loopback; there it is returned as a warning. The keys themselves are never seen.
func (c Config) CheckCatalogKeys(weakApps []string) (warning string, err error) {
	if len(weakApps) == 0 {
		return "", nil
	}
	which := "application " + weakApps[0]
	if len(weakApps) > 1 {
		which = "applications " + strings.Join(weakApps, ", ")
	}
	if c.Loopback() {
		return "catalog api_key of " + which + " is weak (recorded by catalog apply): allowed because every listener is on loopback", nil
	}
	return "", fmt.Errorf("catalog api_key of %s: recorded weak by catalog apply (does not look like %d random bytes); declare one made with `integrationsctl keys generate` and apply the catalog again, or revoke the key (a weak catalog key is allowed only when every listener is on a loopback address)", which, apikey.MinSecretLen)
}

// RateLimits are the default limits of every application.
func (c Config) RateLimits() ratelimit.Limits {
	return ratelimit.Limits{
		Invoke: ratelimit.Limit{PerSecond: c.RateLimitInvokes, Burst: c.RateLimitInvokeBurst},
		Read:   ratelimit.Limit{PerSecond: c.RateLimitReads, Burst: c.RateLimitReadBurst},
	}
}

// WebhookDeny is INTEGRATIONS_WEBHOOK_DENY_CIDRS parsed (Validate has refused an invalid one).
func (c Config) WebhookDeny() []netip.Prefix {
	deny, _ := webhook.ParseDenyCIDRs(c.WebhookDenyCIDRs)
	return deny
}

// Validate checks the gateway's own settings.
func (c Config) Validate() error {
	errs := []error{
		c.Common.Validate(),
		c.InternalTLS.Validate(),
		// The gateway's own ports are client-facing; it dials the internal ones.
		c.CheckInternalPlaintext(map[string]string{"INTEGRATIONS_SETTLEMENT_ADDR": c.SettlementAddr, "INTEGRATIONS_DISPATCHER_ADDR": c.DispatcherAddr}),
		c.PublicTLS.Check(map[string]string{"INTEGRATIONS_GRPC_ADDR": c.GRPCAddr, "INTEGRATIONS_HTTP_ADDR": c.HTTPAddr}),
	}
	if _, err := webhook.ParseDenyCIDRs(c.WebhookDenyCIDRs); err != nil {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_WEBHOOK_DENY_CIDRS: %w", err))
	}
	errs = append(errs,
		config.Between("INTEGRATIONS_MAX_PAYLOAD_BYTES", c.MaxPayloadBytes, 1024, 64<<20),
		config.Between("INTEGRATIONS_SECRET_ROTATION_OVERLAP", c.SecretRotationOverlap, 0, 30*24*time.Hour),
		config.Between("INTEGRATIONS_CONSOLE_SESSION_TTL", c.ConsoleSessionTTL, time.Minute, 7*24*time.Hour),
		config.Between("INTEGRATIONS_GATEWAY_CACHE_TTL", c.CacheTTL, 0, time.Hour),
		c.Platform.Validate(),
		config.Between("INTEGRATIONS_HTTP_READ_HEADER_TIMEOUT", c.HTTPReadHeaderTimeout, 100*time.Millisecond, time.Hour),
		config.Between("INTEGRATIONS_HTTP_READ_TIMEOUT", c.HTTPReadTimeout, 100*time.Millisecond, time.Hour),
		config.Between("INTEGRATIONS_HTTP_WRITE_TIMEOUT", c.HTTPWriteTimeout, 100*time.Millisecond, time.Hour),
		config.Between("INTEGRATIONS_HTTP_IDLE_TIMEOUT", c.HTTPIdleTimeout, 100*time.Millisecond, time.Hour),
		config.Between("INTEGRATIONS_AUTH_FAILURE_BURST", c.AuthFailureBurst, 1, 1000),
		config.Between("INTEGRATIONS_AUTH_FAILURE_WINDOW", c.AuthFailureWindow, 100*time.Millisecond, 24*time.Hour),
	)
	if _, err := c.CheckAdminToken(); err != nil {
		errs = append(errs, err)
	}
	if c.HTTPReadHeaderTimeout > c.HTTPReadTimeout {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_HTTP_READ_HEADER_TIMEOUT: %v must not exceed INTEGRATIONS_HTTP_READ_TIMEOUT (%v)", c.HTTPReadHeaderTimeout, c.HTTPReadTimeout))
	}
	errs = append(errs, c.validateRateLimits()...)
	return errors.Join(errs...)
}

func (c Config) validateRateLimits() []error {
	var errs []error
	rate := func(name string, v float64) {
		if problem := catalog.CheckRate(v); problem != "" {
			errs = append(errs, fmt.Errorf("%s: %s", name, problem))
		}
	}
	rate("INTEGRATIONS_RATE_LIMIT_INVOKES", c.RateLimitInvokes)
	rate("INTEGRATIONS_RATE_LIMIT_READS", c.RateLimitReads)
	return append(errs,
		config.Between("INTEGRATIONS_RATE_LIMIT_INVOKE_BURST", c.RateLimitInvokeBurst, 1, catalog.MaxBurst),
		config.Between("INTEGRATIONS_RATE_LIMIT_READ_BURST", c.RateLimitReadBurst, 1, catalog.MaxBurst),
		config.Between("INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY", c.RateLimitRefusalDelay, 0, 5*time.Second),
		// A beat is bounded by the interval: under a second, a busy Postgres fails beats that
		// would have succeeded, and the count errs high for nothing.
		config.Between("INTEGRATIONS_RATE_LIMIT_HEARTBEAT", c.RateLimitHeartbeat, time.Second, time.Minute),
	)
}
