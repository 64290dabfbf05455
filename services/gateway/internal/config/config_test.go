package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/config"
)

// TestListenersNeedTLSOffLoopback: the gateway refuses to start with a client-facing listener
// off loopback and no certificate, or with internal hops in plaintext to a non-loopback peer,
// naming the variables; a certificate, or the explicit plaintext declaration, lets it start.
func TestListenersNeedTLSOffLoopback(t *testing.T) {
	t.Setenv("INTEGRATIONS_SECRET_KEY", "k")
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
