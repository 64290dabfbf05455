package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/lifecycle"
)

func TestShutdownTimeouts(t *testing.T) {
	t.Setenv("INTEGRATIONS_LOG_LEVEL", "info")
	c, err := Load[Common]()
	require.NoError(t, err)
	assert.Equal(t, lifecycle.Timeouts{Drain: 5 * time.Second, Soft: 10 * time.Second, Hard: 15 * time.Second}, c.Shutdown(),
		"the defaults")
	assert.NoError(t, c.Shutdown().Validate())

	for _, tc := range []struct {
		drain, soft, hard string
		want              string
	}{
		{"-1s", "10s", "15s", "INTEGRATIONS_DRAIN_WINDOW"},
		{"5s", "4s", "15s", "INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT: 4s must be at least INTEGRATIONS_DRAIN_WINDOW (5s)"},
		{"5s", "10s", "8s", "INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT: 10s must be less than INTEGRATIONS_SHUTDOWN_TIMEOUT (8s)"},
		{"5s", "10s", "0s", "INTEGRATIONS_SHUTDOWN_TIMEOUT"},
	} {
		t.Setenv("INTEGRATIONS_DRAIN_WINDOW", tc.drain)
		t.Setenv("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT", tc.soft)
		t.Setenv("INTEGRATIONS_SHUTDOWN_TIMEOUT", tc.hard)
		_, err := Load[Common]()
		assert.ErrorContains(t, err, tc.want)
	}
	t.Setenv("INTEGRATIONS_DRAIN_WINDOW", "0s")
	t.Setenv("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT", "1s")
	t.Setenv("INTEGRATIONS_SHUTDOWN_TIMEOUT", "2s")
	c, err = Load[Common]()
	require.NoError(t, err, "no drain window is allowed")
	assert.Equal(t, lifecycle.Timeouts{Soft: time.Second, Hard: 2 * time.Second}, c.Shutdown())
}

// TestShutdownPhasesDerivedFromTheTimeout: a deployment that sets only INTEGRATIONS_SHUTDOWN_TIMEOUT
// (10 s or less was valid before the drain window and soft timeout existed) still loads: the
// unset phases are derived from it, and only explicit values that contradict each other fail,
// naming the variable that was set.
func TestShutdownPhasesDerivedFromTheTimeout(t *testing.T) {
	// A service's settings embed Common: the derivation reaches them too.
	type service struct {
		Common
		Other string `env:"INTEGRATIONS_OTHER" envDefault:"x"`
	}
	for _, tc := range []struct {
		drain, soft, hard string
		want              lifecycle.Timeouts
	}{
		{"", "", "10s", lifecycle.Timeouts{Drain: 3333 * time.Millisecond, Soft: 6666 * time.Millisecond, Hard: 10 * time.Second}},
		{"", "", "3s", lifecycle.Timeouts{Drain: time.Second, Soft: 2 * time.Second, Hard: 3 * time.Second}},
		{"", "", "60s", lifecycle.Timeouts{Drain: 5 * time.Second, Soft: 40 * time.Second, Hard: time.Minute}},
		{"", "2s", "10s", lifecycle.Timeouts{Drain: 2 * time.Second, Soft: 2 * time.Second, Hard: 10 * time.Second}},
		{"8s", "", "10s", lifecycle.Timeouts{Drain: 8 * time.Second, Soft: 8 * time.Second, Hard: 10 * time.Second}},
		{"0s", "", "10s", lifecycle.Timeouts{Soft: 6666 * time.Millisecond, Hard: 10 * time.Second}},
	} {
		t.Run(tc.drain+"/"+tc.soft+"/"+tc.hard, func(t *testing.T) {
			t.Setenv("INTEGRATIONS_DRAIN_WINDOW", tc.drain)
			t.Setenv("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT", tc.soft)
			t.Setenv("INTEGRATIONS_SHUTDOWN_TIMEOUT", tc.hard)
			c, err := Load[service]()
			require.NoError(t, err)
			assert.Equal(t, tc.want, c.Shutdown())
			assert.NoError(t, c.Shutdown().Validate())
		})
	}
	for _, tc := range []struct{ drain, soft, hard, want string }{
		{"12s", "", "10s", "INTEGRATIONS_DRAIN_WINDOW: 12s must be less than INTEGRATIONS_SHUTDOWN_TIMEOUT (10s)"},
		{"", "10s", "10s", "INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT: 10s must be less than INTEGRATIONS_SHUTDOWN_TIMEOUT (10s)"},
	} {
		t.Run("invalid "+tc.drain+"/"+tc.soft+"/"+tc.hard, func(t *testing.T) {
			t.Setenv("INTEGRATIONS_DRAIN_WINDOW", tc.drain)
			t.Setenv("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT", tc.soft)
			t.Setenv("INTEGRATIONS_SHUTDOWN_TIMEOUT", tc.hard)
			_, err := Load[service]()
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
