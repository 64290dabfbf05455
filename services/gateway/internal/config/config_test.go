package config

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
