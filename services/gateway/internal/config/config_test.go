package config

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/config"
)

func TestValidateRateLimits(t *testing.T) {
	t.Parallel()
	valid := Config{
		Common:          config.Common{LogLevel: "info", TimeScale: 1, ShutdownTimeout: time.Second},
		MaxPayloadBytes: 1 << 20, CacheTTL: time.Second,
		RateLimitInvokes: 1000, RateLimitInvokeBurst: 2000, RateLimitReads: 0, RateLimitReadBurst: 1,
		RateLimitHeartbeat: 2 * time.Second,
	}
	require.NoError(t, valid.Validate(), "a rate of 0 is unlimited")

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
	} {
		c := valid
		tc.change(&c)
		require.ErrorContains(t, c.Validate(), tc.name)
	}

	l := valid.RateLimits()
	require.Equal(t, 1000.0, l.Invoke.PerSecond)
	require.Equal(t, 2000, l.Invoke.Burst)
	require.True(t, l.Read.Unlimited())
}
