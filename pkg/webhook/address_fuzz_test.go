package webhook

import (
	"errors"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// FuzzAddressPolicy: the policy never panics, and whatever it accepts names a public address or a
// public-looking DNS name. In particular a host that inet_aton or a browser would read as an IPv4
// address is never accepted unless it is a canonical public dotted quad, and a literal special
// address (zoned, mapped, private, ...) never is. Accepting is monotonic in AllowPrivate, and an
// accepted URL keeps its host when serialised and parsed again (what the router re-parses is what
// was checked). The seed corpus is testdata/fuzz/FuzzAddressPolicy.
func FuzzAddressPolicy(f *testing.F) {
	for _, s := range []string{
		"https://example.com/hook", "https://[::1%25lo]/", "https://2130706433/", "https://127.1/",
		"https://localhost./", "127.0.0.1:80", "[fe80::1%eth0]:443", "[2606:4700::1111]:443",
		"[::ffff:93.184.216.34]:443", "https://93.184.216.34/",
	} {
		f.Add(s)
	}
	strict := Policy{AllowHTTP: true}
	dev := Policy{AllowPrivate: true, AllowHTTP: true}
	denyList := []netip.Prefix{netip.MustParsePrefix("93.184.216.0/24"), netip.MustParsePrefix("2606:4700::/32")}
	deny := Policy{AllowPrivate: true, AllowHTTP: true, Deny: denyList}
	inDeny := func(a netip.Addr) bool {
		for _, p := range denyList {
			if p.Contains(a.Unmap()) {
				return true
			}
		}
		return false
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if u, err := deny.CheckURL(raw); err == nil {
			if a, perr := netip.ParseAddr(u.Hostname()); perr == nil && inDeny(a) {
				t.Fatalf("%q: a denied address accepted", raw)
			}
		}
		if host, err := deny.CheckTarget(raw); err == nil {
			if a, perr := netip.ParseAddr(host); perr == nil && inDeny(a) {
				t.Fatalf("%q: a denied target accepted", raw)
			}
		}
		if u, err := strict.CheckURL(raw); err == nil {
			if _, err := dev.CheckURL(raw); err != nil {
				t.Fatalf("%q: accepted without AllowPrivate but refused with it: %v", raw, err)
			}
			if len(raw) > MaxEndpointLength {
				t.Fatalf("%q: accepted past the length bound", raw)
			}
			if u.Scheme != "https" && u.Scheme != "http" {
				t.Fatalf("%q: accepted scheme %q", raw, u.Scheme)
			}
			if u.User != nil {
				t.Fatalf("%q: accepted with credentials", raw)
			}
			host := u.Hostname()
			assertPublicHost(t, raw, host)
			again, err := url.Parse(u.String())
			if err != nil || again.Hostname() != host {
				t.Fatalf("%q: host %q does not survive serialisation (%v)", raw, host, err)
			}
		} else if !errors.Is(err, ErrRefused) {
			t.Fatalf("%q: refusal %v is not ErrRefused", raw, err)
		}

		if host, err := strict.CheckTarget(raw); err == nil {
			if _, err := dev.CheckTarget(raw); err != nil {
				t.Fatalf("%q: target accepted without AllowPrivate but refused with it: %v", raw, err)
			}
			assertPublicHost(t, raw, host)
		} else if !errors.Is(err, ErrRefused) {
			t.Fatalf("%q: refusal %v is not ErrRefused", raw, err)
		}

		for _, network := range []string{"tcp4", "tcp6"} {
			if err := strict.Control(network, raw, nil); err == nil {
				ap, perr := netip.ParseAddrPort(raw)
				// Judged unmapped: the address comes from the resolver, and a mapped one connects
				// to the IPv4 address it carries.
				if perr != nil || !PublicAddress(ap.Addr().Unmap()) || ap.Addr().Zone() != "" {
					t.Fatalf("%q: dial to a non-public address allowed", raw)
				}
			}
			if err := deny.Control(network, raw, nil); err == nil {
				if ap, perr := netip.ParseAddrPort(raw); perr != nil || inDeny(ap.Addr()) {
					t.Fatalf("%q: dial to a denied address allowed", raw)
				}
			}
			if err := dev.Control(network, raw, nil); err == nil {
				if ap, perr := netip.ParseAddrPort(raw); perr != nil || ap.Addr().Zone() != "" {
					t.Fatalf("%q: dial to a zoned or unparsable address allowed with AllowPrivate", raw)
				}
			}
		}
	})
}

// assertPublicHost fails unless host, accepted without AllowPrivate, is a public address in
// canonical form or a multi-label ASCII name no IPv4 parser reads as an address.
func assertPublicHost(t *testing.T, raw, host string) {
	t.Helper()
	if host == "" {
		t.Fatalf("%q: accepted with an empty host", raw)
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if !PublicAddress(addr) || addr.Zone() != "" {
			t.Fatalf("%q: accepted the special address %s", raw, addr)
		}
		return
	}
	if _, ok := inetAton(host); ok {
		t.Fatalf("%q: accepted %q, which inet_aton reads as an IPv4 address", raw, host)
	}
	lower := strings.ToLower(host)
	if !strings.Contains(lower, ".") || strings.HasSuffix(lower, ".") {
		t.Fatalf("%q: accepted the single-label or trailing-dot name %q", raw, host)
	}
	if lower == "localhost" || strings.HasSuffix(lower, ".localhost") || strings.HasSuffix(lower, ".internal") {
		t.Fatalf("%q: accepted the internal name %q", raw, host)
	}
	for i := 0; i < len(lower); i++ {
		c := lower[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			t.Fatalf("%q: accepted a name with %q", raw, c)
		}
	}
}

// inetAton is a liberal reading of IPv4 numbers, as inet_aton(3) and the URL standard's IPv4
// parser do: one to four parts, each decimal, octal (leading 0) or hex (0x, possibly empty), the
// last filling the remaining bytes; a trailing dot tolerated.
func inetAton(s string) (uint32, bool) {
	s = strings.TrimSuffix(s, ".")
	parts := strings.Split(s, ".")
	if len(parts) > 4 || s == "" {
		return 0, false
	}
	var vals []uint64
	for _, p := range parts {
		base, digits := 10, p
		switch {
		case strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X"):
			base, digits = 16, p[2:]
			if digits == "" {
				digits = "0"
			}
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		v, err := strconv.ParseUint(digits, base, 64)
		if err != nil {
			return 0, false
		}
		vals = append(vals, v)
	}
	var out uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return 0, false
		}
		out |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return 0, false
	}
	return uint32(out | last), true
}
