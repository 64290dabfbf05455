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
