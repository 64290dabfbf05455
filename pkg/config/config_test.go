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

// TestInternalTLSRequired: a service without its identity's files refuses to start, naming the
// missing variables; plaintext is accepted on loopback addresses only.
func TestInternalTLSRequired(t *testing.T) {
	t.Setenv("INTEGRATIONS_TLS_CERT_FILE", "/etc/tls/tls.crt")
	_, err := Load[InternalTLS]()
	require.ErrorContains(t, err, "INTEGRATIONS_TLS_CA_FILE, INTEGRATIONS_TLS_KEY_FILE: internal mTLS needs")
	t.Setenv("INTEGRATIONS_TLS_KEY_FILE", "/etc/tls/tls.key")
	t.Setenv("INTEGRATIONS_TLS_CA_FILE", "/etc/tls/ca.crt")
	c, err := Load[InternalTLS]()
	require.NoError(t, err)
	assert.Equal(t, "/etc/tls/ca.crt", c.InternalFiles().CAFile)
	assert.NoError(t, c.CheckInternalPlaintext(map[string]string{"INTEGRATIONS_GRPC_ADDR": "0.0.0.0:9094"}), "mTLS on: any address")

	t.Setenv("INTEGRATIONS_INTERNAL_PLAINTEXT", "true")
	c, err = Load[InternalTLS]()
	require.NoError(t, err)
	assert.Zero(t, c.InternalFiles(), "plaintext: no identity loaded even if files are set")
	assert.NoError(t, c.CheckInternalPlaintext(map[string]string{"INTEGRATIONS_GRPC_ADDR": "127.0.0.1:9094", "INTEGRATIONS_DISPATCHER_ADDR": "localhost:9091"}))
	err = c.CheckInternalPlaintext(map[string]string{"INTEGRATIONS_GRPC_ADDR": ":9094", "INTEGRATIONS_DISPATCHER_ADDR": "dispatcher:9091"})
	assert.ErrorContains(t, err, `INTEGRATIONS_GRPC_ADDR: ":9094" is not a loopback address`)
	assert.ErrorContains(t, err, `INTEGRATIONS_DISPATCHER_ADDR: "dispatcher:9091" is not a loopback address`)
}

// TestPublicTLS: a client-facing listener off loopback needs a certificate or an explicit
// plaintext declaration; the error names the variables.
func TestPublicTLS(t *testing.T) {
	addrs := map[string]string{"INTEGRATIONS_HTTP_ADDR": "0.0.0.0:8080", "INTEGRATIONS_GRPC_ADDR": "127.0.0.1:9090"}
	err := PublicTLS{}.Check(addrs)
	require.ErrorContains(t, err, `INTEGRATIONS_HTTP_ADDR: "0.0.0.0:8080" is not a loopback address and has no certificate: set INTEGRATIONS_PUBLIC_TLS_CERT_FILE and INTEGRATIONS_PUBLIC_TLS_KEY_FILE, or INTEGRATIONS_PUBLIC_PLAINTEXT=true`)
	assert.NotContains(t, err.Error(), "INTEGRATIONS_GRPC_ADDR", "loopback is fine")
	assert.NoError(t, PublicTLS{PublicPlaintext: true}.Check(addrs))
	assert.NoError(t, PublicTLS{PublicCertFile: "c", PublicKeyFile: "k"}.Check(addrs))
	assert.ErrorContains(t, PublicTLS{PublicCertFile: "c"}.Check(addrs), "set both or neither")
	assert.True(t, PublicTLS{PublicCertFile: "c", PublicKeyFile: "k"}.PublicTLSEnabled())
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1": true, "127.3.2.1:1": true, "[::1]:1": true, "localhost:1": true, "LOCALHOST:1": true,
		"[::ffff:127.0.0.1]:1": true,
		":1":                   false, "0.0.0.0:1": false, "[::]:1": false, "10.0.0.1:1": false, "gateway:1": false,
		"[::1%lo]:1": false, "127.0.0.1": false, "localhost.:1": false,
	} {
		assert.Equal(t, want, IsLoopback(addr), addr)
	}
}

// TestSettingChecks: a setting's check names the variable, its value and the limits as a person
// writes them (24h, not 24h0m0s), and is nil for a value within them.
func TestSettingChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{Between("V", 25*time.Hour, 100*time.Millisecond, 24*time.Hour), "V: 25h0m0s must be between 100ms and 24h"},
		{Between("V", 0, time.Minute, 7*24*time.Hour), "V: 0s must be between 1m and 168h"},
		{Between("V", 0, 1, 10000), "V: 0 must be between 1 and 10000"},
		{AtLeast("V", 10*time.Millisecond, 10*time.Second), "V: 10ms must be at least 10s"},
		{Positive("V", time.Duration(0)), "V: 0s must be positive"},
		{Between("V", time.Hour, 0, 90*time.Minute), ""},
		{AtLeast("V", 2, 1), ""},
		{Positive("V", 1), ""},
	} {
		if tc.want == "" {
			assert.NoError(t, tc.err)
			continue
		}
		assert.EqualError(t, tc.err, tc.want)
	}
}
