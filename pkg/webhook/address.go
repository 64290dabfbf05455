package webhook

import (
	"net/netip"
)

// specialPurpose lists the address ranges a webhook must not reach unless the deployment allows
// private targets: loopback, private, link-local (cloud metadata at 169.254.169.254),
// shared/CGNAT space (also cloud metadata, e.g. 100.100.100.200), benchmarking, documentation,
// multicast, reserved, and the IPv6 equivalents and translation prefixes (RFC 6890 and its
// updates).
var specialPurpose = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
	"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
	"::/128", "::1/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64",
	"2001::/23", "2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "ff00::/8",
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// PublicAddress reports whether addr is outside every special-purpose range, i.e. a webhook may
// be delivered to it without the deployment allowing private targets. IPv4-mapped IPv6
// addresses are judged as the IPv4 address they carry.
func PublicAddress(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return false
	}
	for _, p := range specialPurpose {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}
