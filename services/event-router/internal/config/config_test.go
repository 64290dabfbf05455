package config

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/config"
)

// These tests set the environment, so they do not run in parallel.

func TestDefaultsAndScaledSchedule(t *testing.T) {
	t.Setenv("INTEGRATIONS_SECRET_KEY", "k")
	t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "true")
	t.Setenv("INTEGRATIONS_TIME_SCALE", "0.001")
	cfg, err := config.Load[Config]()
	require.NoError(t, err)
	require.Equal(t, []time.Duration{time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 6 * time.Hour}, cfg.RetryDelays)
	require.Equal(t, 8, cfg.PerAppConcurrency)
	require.Equal(t, 100*time.Millisecond, cfg.PerAppPatience)
	require.Equal(t, []time.Duration{60 * time.Millisecond, 300 * time.Millisecond, 1800 * time.Millisecond,
		7200 * time.Millisecond, 21600 * time.Millisecond}, cfg.ScaledRetryDelays())
}

func TestValidationNamesTheVariable(t *testing.T) {
	tests := []struct{ name, value, want string }{
		{"INTEGRATIONS_EVENT_RETRY_DELAYS", "1m,-5s", "INTEGRATIONS_EVENT_RETRY_DELAYS"},
		{"INTEGRATIONS_DELIVERY_PER_APP_CONCURRENCY", "33", "INTEGRATIONS_DELIVERY_PER_APP_CONCURRENCY"},
		{"INTEGRATIONS_DELIVERY_PER_APP_PATIENCE", "2s", "INTEGRATIONS_DELIVERY_PER_APP_PATIENCE"},
		{"INTEGRATIONS_DELIVERY_PER_APP_CONCURRENCY", "0", "INTEGRATIONS_DELIVERY_PER_APP_CONCURRENCY"},
		{"INTEGRATIONS_WEBHOOK_DENY_CIDRS", "10.0.0.0/8,not-a-cidr", "INTEGRATIONS_WEBHOOK_DENY_CIDRS"},
		{"INTEGRATIONS_WEBHOOK_DENY_CIDRS", "10.1.2.3/8", "INTEGRATIONS_WEBHOOK_DENY_CIDRS"},
	}
	for _, tc := range tests {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv("INTEGRATIONS_SECRET_KEY", "k")
			t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "true")
			t.Setenv(tc.name, tc.value)
			_, err := config.Load[Config]()
			require.Error(t, err)
			require.True(t, strings.Contains(err.Error(), tc.want), err.Error())
		})
	}
}

func TestRecoveryWindowsScaleButOutlastTheNoticeBudget(t *testing.T) {
	t.Setenv("INTEGRATIONS_SECRET_KEY", "k")
	t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "true")
	t.Setenv("INTEGRATIONS_TIME_SCALE", "0.001")
	cfg, err := config.Load[Config]()
	require.NoError(t, err)
	// 10m scaled is 600 ms: a notice still on its 11 s port budget is not taken for lost.
	require.Equal(t, 22*time.Second, cfg.StaleAfter(11*time.Second))
	require.Equal(t, time.Second, cfg.RecoverEvery())
	require.Equal(t, 5*time.Second, cfg.RelayClaimTTL(30*time.Second), "scaled, but above a confirm's time")

	t.Setenv("INTEGRATIONS_TIME_SCALE", "1")
	cfg, err = config.Load[Config]()
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, cfg.StaleAfter(36*time.Second), "unscaled, the variable stands")
	require.Equal(t, 10*time.Second, cfg.RecoverEvery())
	require.Equal(t, 30*time.Second, cfg.RelayClaimTTL(30*time.Second))
}

func TestWebhookDenyCIDRs(t *testing.T) {
	t.Setenv("INTEGRATIONS_SECRET_KEY", "k")
	t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "true")
	cfg, err := config.Load[Config]()
	require.NoError(t, err)
	require.Empty(t, cfg.WebhookDeny(), "none by default")

	t.Setenv("INTEGRATIONS_WEBHOOK_DENY_CIDRS", "203.0.113.0/24, 2001:db8::/32")
	cfg, err = config.Load[Config]()
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")}, cfg.WebhookDeny())
}
