package webhook

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPublicAddress(t *testing.T) {
	t.Parallel()
	for addr, public := range map[string]bool{
		"93.184.216.34":          true,
		"2606:4700::1111":        true,
		"127.0.0.1":              false,
		"10.1.2.3":               false,
		"172.20.0.1":             false,
		"192.168.1.1":            false,
		"169.254.169.254":        false,
		"100.100.100.200":        false,
		"198.18.0.1":             false,
		"0.0.0.0":                false,
		"::1":                    false,
		"fd00::1":                false,
		"fe80::1":                false,
		"64:ff9b::a9fe:a9fe":     false,
		"::ffff:169.254.169.254": false,
		"::ffff:93.184.216.34":   true,
	} {
		assert.Equal(t, public, PublicAddress(netip.MustParseAddr(addr)), addr)
	}
}
