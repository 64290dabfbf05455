package config

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/config"
)

// TestListenersNeedTLSOffLoopback: the gateway refuses to start with a client-facing listener
// off loopback and no certificate, or with internal hops in plaintext to a non-loopback peer,
// naming the variables; a certificate, or the explicit plaintext declaration, lets it start.
func TestListenersNeedTLSOffLoopback(t *testing.T) {
	t.Setenv("INTEGRATIONS_SECRET_KEY", "k")
	t.Setenv("INTEGRATIONS_PLATFORM_SIGNING_KEY", base64.StdEncoding.EncodeToString(make([]byte, ed25519.SeedSize)))
	t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "true")
	_, err := config.Load[Config]()
	require.NoError(t, err, "the defaults are loopback: the dev profile")

	t.Setenv("INTEGRATIONS_HTTP_ADDR", ":8080")
	_, err = config.Load[Config]()
	require.ErrorContains(t, err, `INTEGRATIONS_HTTP_ADDR: ":8080" is not a loopback address and has no certificate: set INTEGRATIONS_PUBLIC_TLS_CERT_FILE and INTEGRATIONS_PUBLIC_TLS_KEY_FILE`)

	t.Setenv("INTEGRATIONS_PUBLIC_TLS_CERT_FILE", "/tls/tls.crt")
	t.Setenv("INTEGRATIONS_PUBLIC_TLS_KEY_FILE", "/tls/tls.key")
	c, err := config.Load[Config]()
	require.NoError(t, err)
	assert.True(t, c.PublicTLSEnabled())

	t.Setenv("INTEGRATIONS_SETTLEMENT_ADDR", "settlement:9094")
	_, err = config.Load[Config]()
	require.ErrorContains(t, err, `INTEGRATIONS_SETTLEMENT_ADDR: "settlement:9094" is not a loopback address, and INTEGRATIONS_INTERNAL_PLAINTEXT is true`)

	t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "false")
	_, err = config.Load[Config]()
	require.ErrorContains(t, err, "internal mTLS needs INTEGRATIONS_TLS_CERT_FILE")
	t.Setenv("INTEGRATIONS_TLS_CERT_FILE", "/tls/gateway.crt")
	t.Setenv("INTEGRATIONS_TLS_KEY_FILE", "/tls/gateway.key")
	t.Setenv("INTEGRATIONS_TLS_CA_FILE", "/tls/ca.crt")
	_, err = config.Load[Config]()
	require.NoError(t, err)
}

// TestValidateRateLimits checks the rate limits' own validation (the rest of Validate needs
// TLS files and a signing key, see TestListenersNeedTLSOffLoopback).
func TestValidateRateLimits(t *testing.T) {
	t.Parallel()
	valid := Config{
		Common:          config.Common{LogLevel: "info", TimeScale: 1, ShutdownTimeout: time.Second},
		MaxPayloadBytes: 1 << 20, CacheTTL: time.Second,
		RateLimitInvokes: 1000, RateLimitInvokeBurst: 2000, RateLimitReads: 0, RateLimitReadBurst: 1,
		RateLimitHeartbeat: 2 * time.Second,
	}
	require.NoError(t, errors.Join(valid.validateRateLimits()...), "a rate of 0 is unlimited")

	for _, tc := range []struct {
		change func(*Config)
		name   string
	}{
		{func(c *Config) { c.RateLimitInvokes = -1 }, "INTEGRATIONS_RATE_LIMIT_INVOKES"},
		{func(c *Config) { c.RateLimitReads = math.NaN() }, "INTEGRATIONS_RATE_LIMIT_READS"},
		{func(c *Config) { c.RateLimitReads = 2e6 }, "INTEGRATIONS_RATE_LIMIT_READS"},
		{func(c *Config) { c.RateLimitInvokeBurst = 0 }, "INTEGRATIONS_RATE_LIMIT_INVOKE_BURST"},
		{func(c *Config) { c.RateLimitReadBurst = 2e6 }, "INTEGRATIONS_RATE_LIMIT_READ_BURST"},
		{func(c *Config) { c.RateLimitHeartbeat = 0 }, "INTEGRATIONS_RATE_LIMIT_HEARTBEAT"},
		{func(c *Config) { c.RateLimitRefusalDelay = -time.Second }, "INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY"},
		{func(c *Config) { c.RateLimitRefusalDelay = time.Minute }, "INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY"},
		{func(c *Config) { c.RateLimitHeartbeat = time.Hour }, "INTEGRATIONS_RATE_LIMIT_HEARTBEAT"},
		{func(c *Config) { c.RateLimitHeartbeat = 500 * time.Millisecond }, "INTEGRATIONS_RATE_LIMIT_HEARTBEAT: 500ms must be between 1s"},
		{func(c *Config) { c.RateLimitInvokes = 1e-300 }, "INTEGRATIONS_RATE_LIMIT_INVOKES: 1e-300 must be 0 (unlimited) or between 0.001"},
	} {
		c := valid
		tc.change(&c)
		require.ErrorContains(t, errors.Join(c.validateRateLimits()...), tc.name)
	}

	l := valid.RateLimits()
	require.Equal(t, 1000.0, l.Invoke.PerSecond)
	require.Equal(t, 2000, l.Invoke.Burst)
	require.True(t, l.Read.Unlimited())
}

func TestWebhookDenyCIDRs(t *testing.T) {
	t.Parallel()
	err := Config{WebhookDenyCIDRs: "10.0.0.0/8,not-a-cidr", MaxPayloadBytes: 1 << 20}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "INTEGRATIONS_WEBHOOK_DENY_CIDRS: entry 2")

	c := Config{WebhookDenyCIDRs: "203.0.113.0/24, 2001:db8::/32"}
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")}, c.WebhookDeny())
	if err := (Config{WebhookDenyCIDRs: "203.0.113.0/24"}).Validate(); err != nil {
		assert.NotContains(t, err.Error(), "INTEGRATIONS_WEBHOOK_DENY_CIDRS",
			"a valid list is not an error (the other errors here are the empty config's)")
	}
	assert.Empty(t, Config{}.WebhookDeny())
}

// TestWeakAdminTokenOnlyOnLoopback: an admin token that does not look like 32 random bytes is a
// warning while every listener is on loopback, and stops the gateway, naming the variable, once
// one is not.
func TestWeakAdminTokenOnlyOnLoopback(t *testing.T) {
	t.Setenv("INTEGRATIONS_SECRET_KEY", "k")
	t.Setenv("INTEGRATIONS_PLATFORM_SIGNING_KEY", base64.StdEncoding.EncodeToString(make([]byte, ed25519.SeedSize)))
	t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "true")
	t.Setenv("INTEGRATIONS_ADMIN_TOKEN", "dev-admin-token")
	c, err := config.Load[Config]()
	require.NoError(t, err, "make run's token, on loopback")
	warning, err := c.CheckAdminToken()
	require.NoError(t, err)
	assert.Contains(t, warning, "INTEGRATIONS_ADMIN_TOKEN is weak (15 characters, fewer than 32)")

	t.Setenv("INTEGRATIONS_PUBLIC_PLAINTEXT", "true")
	t.Setenv("INTEGRATIONS_METRICS_ADDR", ":9100")
	_, err = config.Load[Config]()
	require.ErrorContains(t, err, "INTEGRATIONS_ADMIN_TOKEN: does not look like 32 random bytes (15 characters, fewer than 32)")
	assert.NotContains(t, err.Error(), "dev-admin-token")

	t.Setenv("INTEGRATIONS_ADMIN_TOKEN", "q8ZxW2vN0pL5tR7yB1cD4fG6hJ9kM3sA") // head -c 24 /dev/urandom | base64
	_, err = config.Load[Config]()
	require.NoError(t, err)
	t.Setenv("INTEGRATIONS_ADMIN_TOKEN", "")
	_, err = config.Load[Config]()
	require.NoError(t, err, "no admin token: no operator, nothing to refuse")

	t.Setenv("INTEGRATIONS_AUTH_FAILURE_BURST", "0")
	t.Setenv("INTEGRATIONS_AUTH_FAILURE_WINDOW", "1ms")
	_, err = config.Load[Config]()
	require.ErrorContains(t, err, "INTEGRATIONS_AUTH_FAILURE_BURST: 0 must be between 1 and 1000")
	require.ErrorContains(t, err, "INTEGRATIONS_AUTH_FAILURE_WINDOW: 1ms must be between 100ms and 24h")
}

// TestWeakCatalogKeysOnlyOnLoopback: catalog keys recorded weak follow the admin token's rule — a
// warning while every listener is on loopback, an error naming the applications once one is not.
func TestWeakCatalogKeysOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	loopback := Config{GRPCAddr: "127.0.0.1:9090", HTTPAddr: "[::1]:8080", Common: config.Common{MetricsAddr: "localhost:9100"}}
	require.True(t, loopback.Loopback())
	warning, err := loopback.CheckCatalogKeys([]string{"dev-app"})
	require.NoError(t, err, "make run's dev-api-key-change-me, on loopback")
	assert.Equal(t, "catalog api_key of application dev-app is weak (recorded by catalog apply): allowed because every listener is on loopback", warning)

	exposed := loopback
	exposed.MetricsAddr = ":9100"
	_, err = exposed.CheckCatalogKeys([]string{"app-a", "app-b"})
	require.ErrorContains(t, err, "catalog api_key of applications app-a, app-b: recorded weak by catalog apply (does not look like 32 random bytes)")

	for _, c := range []Config{loopback, exposed} {
		warning, err := c.CheckCatalogKeys(nil)
		require.NoError(t, err)
		assert.Empty(t, warning, "no weak key, nothing to say")
	}
}
