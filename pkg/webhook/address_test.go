package webhook

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPublicAddress(t *testing.T) {
	t.Parallel()
	for addr, public := range map[string]bool{
		"93.184.216.34":            true,
		"8.8.8.8":                  true,
		"1.1.1.1":                  true,
		"203.0.114.7":              true, // just past TEST-NET-3
		"100.63.255.255":           true, // just below shared space
		"100.128.0.0":              true, // just past it
		"172.15.255.255":           true,
		"172.32.0.0":               true,
		"192.169.0.1":              true,
		"223.255.255.255":          true,
		"2606:4700::1111":          true,
		"2a00:1450:4001:80b::200e": true,
		"2001:4860:4860::8888":     true, // outside 2001::/23
		// IPv4 special-purpose ranges.
		"0.0.0.0":              false,
		"0.1.2.3":              false,
		"10.0.0.1":             false,
		"10.255.255.255":       false,
		"100.64.0.1":           false,
		"100.100.100.200":      false, // Alibaba metadata
		"127.0.0.1":            false,
		"127.255.255.254":      false,
		"169.254.169.254":      false, // AWS/GCP/Azure metadata
		"168.63.129.16":        false, // Azure host endpoint (WireServer, metadata proxy)
		"168.63.129.15":        true,  // its neighbours are ordinary public addresses
		"168.63.129.17":        true,
		"::ffff:168.63.129.16": false,
		"169.254.0.1":          false,
		"172.16.0.1":           false,
		"172.31.255.255":       false,
		"192.0.0.1":            false,
		"192.0.2.1":            false,
		"192.88.99.1":          false,
		"192.168.1.1":          false,
		"198.18.0.1":           false,
		"198.19.255.255":       false,
		"198.51.100.1":         false,
		"203.0.113.1":          false,
		"224.0.0.1":            false,
		"239.255.255.250":      false,
		"240.0.0.1":            false,
		"255.255.255.255":      false,
		// IPv6 special-purpose ranges.
		"::":                     false,
		"::1":                    false,
		"::ffff:127.0.0.1":       false, // IPv4-mapped
		"::ffff:169.254.169.254": false,
		"::ffff:93.184.216.34":   false, // mapped, even of a public address
		"::127.0.0.1":            false, // IPv4-compatible (deprecated)
		"::ffff:0:7f00:1":        false, // IPv4-translated
		"64:ff9b::a9fe:a9fe":     false, // NAT64 of 169.254.169.254
		"64:ff9b::5db8:d822":     false, // NAT64 even of a public address
		"64:ff9b:1::1":           false, // local-use NAT64
		"100::1":                 false, // discard
		"2001::1":                false, // Teredo
		"2001:2::1":              false, // benchmarking
		"2001:db8::1":            false, // documentation
		"2002:7f00:1::1":         false, // 6to4 of 127.0.0.1
		"3fff::1":                false, // documentation (RFC 9637)
		"5f00::1":                false, // SRv6
		"fc00::1":                false,
		"fd00::1":                false,
		"fd00:ec2::254":          false, // AWS metadata over IPv6
		"fe80::1":                false,
		"febf::1":                false,
		"fec0::1":                false, // site-local (deprecated)
		"ff02::1":                false,
		"fe80::1%eth0":           false, // zoned
		"2606:4700::1111%eth0":   false, // zoned, even if public
		"::1%lo":                 false,
	} {
		assert.Equal(t, public, PublicAddress(netip.MustParseAddr(addr)), addr)
	}
	assert.False(t, PublicAddress(netip.Addr{}), "the zero Addr")
}

// TestPolicyCheckURL is the table of webhook URLs: every form of a special address and every
// way to make two parsers disagree on the host, refused; public ones accepted.
func TestPolicyCheckURL(t *testing.T) {
	t.Parallel()
	strict := Policy{}
	dev := Policy{AllowPrivate: true, AllowHTTP: true}
	type verdict int
	const (
		refusedBoth   verdict = iota // refused even with AllowPrivate (syntax)
		refusedStrict                // refused without AllowPrivate only
		accepted
	)
	long := "https://example.com/" + strings.Repeat("a", MaxEndpointLength-len("https://example.com/"))
	tests := []struct {
		url  string
		want verdict
	}{
		// Accepted.
		{"https://example.com/hook", accepted},
		{"https://EXAMPLE.com/hook", accepted},
		{"https://hooks.example.com:8443/in?token=abc#frag", accepted},
		{"https://93.184.216.34/hook", accepted},
		{"https://[2606:4700::1111]/hook", accepted},
		{"https://[2606:4700::1111]:443/hook", accepted},
		{"https://xn--bcher-kva.example/hook", accepted},
		{"https://under_score.example.com/", accepted},
		{"https://a-b.example.com/", accepted},
		{"https://1.2.3.example.com/", accepted}, // a name whose last label is not a number
		{"https://example.com:1/", accepted},
		{"https://example.com:65535/", accepted},
		{long, accepted},
		// Length.
		{long + "a", refusedBoth},
		{"", refusedBoth},
		// Schemes.
		{"ftp://example.com/", refusedBoth},
		{"file:///etc/passwd", refusedBoth},
		{"gopher://example.com/", refusedBoth},
		{"javascript:alert(1)", refusedBoth},
		{"//example.com/hook", refusedBoth},
		{"example.com/hook", refusedBoth},
		{"https:example.com", refusedBoth},
		{"https:///path", refusedBoth},
		{"https://", refusedBoth},
		// Userinfo.
		{"https://user:pass@example.com/", refusedBoth},
		{"https://user@example.com/", refusedBoth},
		{"https://example.com@127.0.0.1/", refusedBoth},
		{"https://@example.com/", refusedBoth},
		// Ports.
		{"https://example.com:0/", refusedBoth},
		{"https://example.com:65536/", refusedBoth},
		{"https://example.com:99999999/", refusedBoth},
		{"https://example.com:/", refusedBoth},
		{"https://example.com:http/", refusedBoth},
		{"https://example.com:+443/", refusedBoth},
		{"https://example.com:-1/", refusedBoth},
		// Zoned IPv6 (netip prefixes ignore zoned addresses).
		{"https://[::1%25lo]/", refusedBoth},
		{"https://[::1%25lo]:9000/", refusedBoth},
		{"https://[fe80::1%25eth0]/", refusedBoth},
		{"https://[fd00:ec2::254%25eth0]/", refusedBoth},
		{"https://[2606:4700::1111%25eth0]/", refusedBoth},
		{"https://[fe80::1%eth0]/", refusedBoth},
		// IPv6 special addresses.
		{"https://[::1]/", refusedStrict},
		{"https://[::]/", refusedStrict},
		{"https://[fe80::1]/", refusedStrict},
		{"https://[fd00:ec2::254]/", refusedStrict},
		{"https://[fc00::1]/", refusedStrict},
		{"https://[ff02::1]/", refusedStrict},
		{"https://[::ffff:127.0.0.1]/", refusedStrict},
		{"https://[::ffff:7f00:1]/", refusedStrict},
		{"https://[::ffff:169.254.169.254]/", refusedStrict},
		{"https://[::127.0.0.1]/", refusedStrict},
		{"https://[64:ff9b::7f00:1]/", refusedStrict},
		{"https://[64:ff9b::169.254.169.254]/", refusedStrict},
		{"https://[2002:7f00:1::]/", refusedStrict},
		{"https://[2001::1]/", refusedStrict},
		{"https://[0:0:0:0:0:0:0:1]/", refusedStrict},
		{"https://[::1]:443/", refusedStrict},
		// IPv4 special addresses.
		{"https://127.0.0.1/", refusedStrict},
		{"https://127.0.0.1:8080/", refusedStrict},
		{"https://127.255.255.255/", refusedStrict},
		{"https://0.0.0.0/", refusedStrict},
		{"https://10.0.0.1/", refusedStrict},
		{"https://172.16.0.1/", refusedStrict},
		{"https://192.168.0.1/", refusedStrict},
		{"https://169.254.169.254/latest/meta-data/", refusedStrict},
		{"https://100.100.100.200/", refusedStrict},
		{"https://168.63.129.16/machine?comp=goalstate", refusedStrict},
		{"https://100.64.0.1/", refusedStrict},
		{"https://198.18.0.1/", refusedStrict},
		{"https://224.0.0.1/", refusedStrict},
		{"https://255.255.255.255/", refusedStrict},
		// Numeric IPv4 forms (inet_aton and browsers read them as 127.0.0.1 etc.).
		{"https://2130706433/", refusedBoth},
		{"https://0x7f000001/", refusedBoth},
		{"https://0X7F000001/", refusedBoth},
		{"https://0x7f.0x0.0x0.0x1/", refusedBoth},
		{"https://0177.0.0.1/", refusedBoth},
		{"https://0177.0000.0000.0001/", refusedBoth},
		{"https://127.1/", refusedBoth},
		{"https://127.0.1/", refusedBoth},
		{"https://0/", refusedBoth},
		{"https://0x0/", refusedBoth},
		{"https://0x/", refusedBoth},
		{"https://00/", refusedBoth},
		{"https://127.0x0.1/", refusedBoth},
		{"https://0x7f.1/", refusedBoth},
		{"https://017700000001/", refusedBoth},
		{"https://3232235521/", refusedBoth}, // 192.168.0.1
		{"https://2852039166/", refusedBoth}, // 169.254.169.254
		{"https://1.2.3.4.5/", refusedBoth},
		{"https://127.000.000.001/", refusedBoth},
		{"https://example.123/", refusedBoth},
		{"https://127.0.0.1./", refusedBoth},
		{"https://08.8.8.8/", refusedBoth},
		// Trailing dots and empty labels.
		{"https://localhost./", refusedBoth},
		{"https://example.com./", refusedBoth},
		{"https://metadata.google.internal./", refusedBoth},
		{"https://example..com/", refusedBoth},
		{"https://.example.com/", refusedBoth},
		{"https://./", refusedBoth},
		// localhost and internal names, in any case.
		{"https://localhost/", refusedStrict},
		{"https://LOCALHOST/", refusedStrict},
		{"https://LocalHost:8080/", refusedStrict},
		{"https://foo.localhost/", refusedStrict},
		{"https://a.b.LOCALHOST/", refusedStrict},
		{"https://printer.local/", refusedStrict},
		{"https://svc.cluster.local/", refusedStrict},
		{"https://kubernetes.default.svc/", refusedStrict},
		{"https://kubernetes.default.svc.cluster.local/", refusedStrict},
		{"https://host.localdomain/", refusedStrict},
		{"https://router.home.arpa/", refusedStrict},
		{"https://1.0.0.127.in-addr.arpa/", refusedStrict},
		{"https://example.test/", refusedStrict},
		{"https://example.invalid/", refusedStrict},
		{"https://abc.onion/", refusedStrict},
		// Metadata names.
		{"https://metadata.google.internal/computeMetadata/v1/", refusedStrict},
		{"https://METADATA.GOOGLE.INTERNAL/", refusedStrict},
		{"https://metadata/", refusedStrict},
		{"https://metadata.goog/", refusedStrict},
		{"https://instance-data/", refusedStrict},
		{"https://instance-data.ec2.internal/", refusedStrict},
		{"https://ip-10-0-0-1.ec2.internal/", refusedStrict},
		{"https://metadata.tencentyun.com/", refusedStrict},
		{"https://metadata.platformequinix.com/", refusedStrict},
		{"https://kubernetes/", refusedStrict},
		{"https://redis/", refusedStrict}, // single label: the search domains' host
		// Percent-encoded hosts.
		{"https://%31%32%37.0.0.1/", refusedBoth},
		{"https://%6c%6f%63%61%6c%68%6f%73%74/", refusedBoth},
		{"https://exa%2emple.com/", refusedBoth},
		{"https://example.com%2f@127.0.0.1/", refusedBoth},
		// IDNA oddities: non-ASCII hosts (full-width digits map to 127.0.0.1 under IDNA).
		{"https://１２７.０.０.１/", refusedBoth},
		{"https://ｌｏｃａｌｈｏｓｔ/", refusedBoth},
		{"https://bücher.example/", refusedBoth},
		{"https://example。com/", refusedBoth},
		{"https://exa\u200bmple.com/", refusedBoth},
		// Other syntax.
		{"https://exa mple.com/", refusedBoth},
		{"https://example.com\\@127.0.0.1/", refusedBoth},
		{"https:\\\\example.com/", refusedBoth},
		{"https://example.com\t/", refusedBoth},
		{"https://example.com\x00/", refusedBoth},
		{"https://-example.com/", refusedBoth},
		{"https://example-.com/", refusedBoth},
		{"https://exa!mple.com/", refusedBoth},
		{"https://[example.com]/", refusedBoth},
		{"https://[127.0.0.1]/", refusedBoth},
		{"https://[::1/", refusedBoth},
		{"https://" + strings.Repeat("a", 64) + ".example.com/", refusedBoth},
		{"https://" + strings.Repeat("a.", 127) + "com/", refusedBoth},
	}
	for _, tc := range tests {
		_, errStrict := strict.CheckURL(tc.url)
		_, errDev := dev.CheckURL(tc.url)
		switch tc.want {
		case accepted:
			assert.NoError(t, errStrict, "%q", tc.url)
			assert.NoError(t, errDev, "%q with AllowPrivate", tc.url)
		case refusedStrict:
			assert.ErrorIs(t, errStrict, ErrRefused, "%q", tc.url)
			assert.NoError(t, errDev, "%q with AllowPrivate", tc.url)
		case refusedBoth:
			assert.ErrorIs(t, errStrict, ErrRefused, "%q", tc.url)
			assert.ErrorIs(t, errDev, ErrRefused, "%q with AllowPrivate", tc.url)
		}
		for _, err := range []error{errStrict, errDev} {
			if err != nil && len(tc.url) > 8 {
				assert.NotContains(t, err.Error(), tc.url[8:], "a refusal never repeats its input")
			}
		}
	}
}

func TestPolicyHTTPScheme(t *testing.T) {
	t.Parallel()
	_, err := Policy{}.CheckURL("http://example.com/")
	require.ErrorIs(t, err, ErrRefused)
	require.Contains(t, err.Error(), "INTEGRATIONS_WEBHOOK_ALLOW_HTTP")
	_, err = Policy{AllowHTTP: true}.CheckURL("http://example.com/")
	require.NoError(t, err)
	_, err = Policy{AllowHTTP: true}.CheckURL("HTTP://example.com/")
	require.NoError(t, err, "schemes are case-insensitive")
	_, err = Policy{AllowHTTP: true}.CheckURL("http://127.0.0.1/")
	require.ErrorIs(t, err, ErrRefused, "http does not lift the address checks")
}

func TestPolicyCheckTarget(t *testing.T) {
	t.Parallel()
	strict, dev := Policy{}, Policy{AllowPrivate: true}
	tests := []struct {
		target       string
		strictOK     bool
		devOK        bool
		wantHostName string
	}{
		{"consumer.example.com:443", true, true, "consumer.example.com"},
		{"93.184.216.34:9000", true, true, "93.184.216.34"},
		{"[2606:4700::1111]:443", true, true, "2606:4700::1111"},
		{"127.0.0.1:9000", false, true, "127.0.0.1"},
		{"localhost:9000", false, true, "localhost"},
		{"consumer:9000", false, true, "consumer"},
		{"[::1]:9000", false, true, "::1"},
		{"[::ffff:127.0.0.1]:9000", false, true, "::ffff:127.0.0.1"},
		{"169.254.169.254:80", false, true, ""},
		{"168.63.129.16:80", false, true, ""},
		{"metadata.google.internal:80", false, true, ""},
		{"[::1%25lo]:9000", false, false, ""},
		{"[::1%lo]:9000", false, false, ""},
		{"[fe80::1%eth0]:9000", false, false, ""},
		{"[fd00:ec2::254%eth0]:80", false, false, ""},
		{"2130706433:9000", false, false, ""},
		{"0x7f000001:9000", false, false, ""},
		{"0177.0.0.1:9000", false, false, ""},
		{"127.1:9000", false, false, ""},
		{"0:9000", false, false, ""},
		{"localhost.:9000", false, false, ""},
		{"127.0.0.1.:9000", false, false, ""},
		{"::1:9000", false, false, ""},
		{"::1", false, false, ""},
		{"[consumer.example.com]:443", false, false, ""},
		{"consumer.example.com", false, false, ""},
		{"consumer.example.com:", false, false, ""},
		{"consumer.example.com:0", false, false, ""},
		{"consumer.example.com:65536", false, false, ""},
		{"consumer.example.com:http", false, false, ""},
		{":9000", false, false, ""},
		{"", false, false, ""},
		{"dns:///consumer.example.com:443", false, false, ""},
		{"unix:///tmp/sock:1", false, false, ""},
		{"https://consumer.example.com:443", false, false, ""},
		{"user@consumer.example.com:443", false, false, ""},
		{"consumer.example.com/x:443", false, false, ""},
		{"%31%32%37.0.0.1:9000", false, false, ""},
		{"１２７.０.０.１:9000", false, false, ""},
		{strings.Repeat("a", MaxEndpointLength) + ":1", false, false, ""},
	}
	for _, tc := range tests {
		host, err := strict.CheckTarget(tc.target)
		if tc.strictOK {
			assert.NoError(t, err, "%q", tc.target)
		} else {
			assert.ErrorIs(t, err, ErrRefused, "%q", tc.target)
		}
		hostDev, err := dev.CheckTarget(tc.target)
		if tc.devOK {
			assert.NoError(t, err, "%q with AllowPrivate", tc.target)
			if tc.wantHostName != "" {
				assert.Equal(t, tc.wantHostName, hostDev, "%q", tc.target)
			}
		} else {
			assert.ErrorIs(t, err, ErrRefused, "%q with AllowPrivate", tc.target)
		}
		if tc.strictOK {
			assert.Equal(t, tc.wantHostName, host)
		}
	}
}

func TestPolicyControl(t *testing.T) {
	t.Parallel()
	strict, dev := Policy{}, Policy{AllowPrivate: true}
	for _, tc := range []struct {
		network, address string
		strictOK, devOK  bool
	}{
		{"tcp4", "93.184.216.34:443", true, true},
		{"tcp6", "[2606:4700::1111]:443", true, true},
		{"tcp4", "127.0.0.1:80", false, true},
		{"tcp4", "169.254.169.254:80", false, true},
		{"tcp6", "[::1]:80", false, true},
		{"tcp6", "[::ffff:127.0.0.1]:80", false, true},
		// A mapped address from the resolver connects to the IPv4 address it carries.
		{"tcp6", "[::ffff:93.184.216.34]:443", true, true},
		{"tcp6", "[fe80::1%eth0]:80", false, false},
		{"tcp6", "[::1%lo]:80", false, false},
		{"tcp6", "[2606:4700::1111%eth0]:443", false, false},
		{"udp4", "93.184.216.34:53", false, false},
		{"tcp4", "example.com:443", false, false},
		{"tcp4", "garbage", false, false},
	} {
		err := strict.Control(tc.network, tc.address, nil)
		if tc.strictOK {
			assert.NoError(t, err, "%s %s", tc.network, tc.address)
		} else {
			assert.ErrorIs(t, err, ErrRefused, "%s %s", tc.network, tc.address)
		}
		err = dev.Control(tc.network, tc.address, nil)
		if tc.devOK {
			assert.NoError(t, err, "%s %s with AllowPrivate", tc.network, tc.address)
		} else {
			assert.ErrorIs(t, err, ErrRefused, "%s %s with AllowPrivate", tc.network, tc.address)
		}
	}
}

// fakeResolver answers from a map keyed by rooted names, as a resolver asked for "name." answers
// only for that name: an unrooted name is the one a search domain would expand, and fails here.
// An address written "::ffff:a.b.c.d" is answered in its 16-byte form, as Go's resolver answers
// /etc/hosts entries.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	ss, ok := f[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		a := netip.MustParseAddr(s)
		if strings.HasPrefix(s, "::ffff:") {
			a = netip.AddrFrom16(a.As16())
		}
		out[i] = a
	}
	return out, nil
}

func TestPolicyCheckResolved(t *testing.T) {
	t.Parallel()
	r := fakeResolver{
		"public.example.com.":   {"93.184.216.34"},
		"internal.example.com.": {"10.0.0.7", "fd00::7"},
		"loopback.example.com.": {"127.0.0.1"},
		"zoned.example.com.":    {"fe80::1%eth0"},
		"mixed.example.com.":    {"10.0.0.7", "93.184.216.34"},
		"empty.example.com.":    {},
		// Pinned in /etc/hosts: Go's resolver answers the IPv4-mapped form.
		"pinned.example.com.":   {"::ffff:93.184.216.34"},
		"pinnedlo.example.com.": {"::ffff:127.0.0.1"},
		// What a search domain would expand "kubernetes.default" to, unrooted.
		"kubernetes.default.svc.cluster.local.": {"10.96.0.1"},
		"kubernetes.default":                    {"10.96.0.1"},
	}
	ctx := context.Background()
	for host, ok := range map[string]bool{
		"public.example.com":   true,
		"internal.example.com": false,
		"loopback.example.com": false,
		"zoned.example.com":    false,
		"mixed.example.com":    true, // the dial-time guard skips the private one
		"empty.example.com":    true, // nothing to judge
		"unknown.example.com":  true, // not resolving is not a refusal
		"127.0.0.1":            true, // an address is CheckAddr's to judge, not this
		"pinned.example.com":   true, // ::ffff:93.184.216.34 is 93.184.216.34
		"pinnedlo.example.com": false,
		// Asked rooted: the answer for "kubernetes.default" under a search domain is never
		// asked for, so an internal name is accepted exactly as a nonexistent one is.
		"kubernetes.default": true,
	} {
		err := Policy{}.CheckResolved(ctx, r, host)
		if ok {
			assert.NoError(t, err, host)
		} else {
			assert.ErrorIs(t, err, ErrRefused, host)
		}
		assert.NoError(t, Policy{AllowPrivate: true}.CheckResolved(ctx, r, host), "%s with AllowPrivate", host)
	}
	assert.NoError(t, Policy{}.CheckResolved(ctx, nil, "internal.example.com"), "no resolver: no courtesy check")

	// The deny list applies with AllowPrivate too.
	deny := Policy{AllowPrivate: true, Deny: []netip.Prefix{netip.MustParsePrefix("93.184.216.0/24")}}
	assert.ErrorIs(t, deny.CheckResolved(ctx, r, "public.example.com"), ErrRefused)
	assert.ErrorIs(t, deny.CheckResolved(ctx, r, "pinned.example.com"), ErrRefused, "mapped, judged unmapped")
	assert.NoError(t, deny.CheckResolved(ctx, r, "mixed.example.com"), "10.0.0.7 is allowed by AllowPrivate")
	assert.NoError(t, deny.CheckResolved(ctx, r, "loopback.example.com"))
}

// recordingResolver records the names it is asked for.
type recordingResolver struct{ asked []string }

func (r *recordingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.asked = append(r.asked, host)
	return nil, errors.New("no such host")
}

func TestCheckResolvedAsksRooted(t *testing.T) {
	t.Parallel()
	r := &recordingResolver{}
	require.NoError(t, Policy{}.CheckResolved(context.Background(), r, "hooks.example.com"))
	assert.Equal(t, []string{"hooks.example.com."}, r.asked)
}

func TestRooted(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"hooks.example.com":  "hooks.example.com.",
		"kubernetes.default": "kubernetes.default.",
		"hooks.example.com.": "hooks.example.com.",
		"localhost":          "localhost", // single labels: refused unless AllowPrivate, and /etc/hosts needs them bare
		"93.184.216.34":      "93.184.216.34",
		"2606:4700::1111":    "2606:4700::1111",
	} {
		assert.Equal(t, want, Rooted(in), in)
	}
}

func TestRootedDial(t *testing.T) {
	t.Parallel()
	var got []string
	dial := RootedDial(func(_ context.Context, _, address string) (net.Conn, error) {
		got = append(got, address)
		return nil, errors.New("not dialled")
	})
	for _, a := range []string{"hooks.example.com:443", "[2606:4700::1111]:443", "93.184.216.34:80", "localhost:8080", "garbage"} {
		_, _ = dial(context.Background(), "tcp", a)
	}
	assert.Equal(t, []string{"hooks.example.com.:443", "[2606:4700::1111]:443", "93.184.216.34:80", "localhost:8080", "garbage"}, got)
}

func TestDenyList(t *testing.T) {
	t.Parallel()
	deny, err := ParseDenyCIDRs(" 93.184.216.0/24 ,2606:4700::/32")
	require.NoError(t, err)
	for _, p := range []Policy{{Deny: deny}, {Deny: deny, AllowPrivate: true}} {
		for _, a := range []string{"93.184.216.34", "::ffff:93.184.216.34", "2606:4700::1111"} {
			assert.ErrorIs(t, p.CheckAddr(netip.MustParseAddr(a)), ErrRefused, "%s (AllowPrivate %v)", a, p.AllowPrivate)
		}
		assert.NoError(t, p.CheckAddr(netip.MustParseAddr("93.184.217.1")))
		_, err := p.CheckURL("https://93.184.216.34/hook")
		assert.ErrorIs(t, err, ErrRefused)
		_, err = p.CheckTarget("[2606:4700::1]:443")
		assert.ErrorIs(t, err, ErrRefused)
		assert.ErrorIs(t, p.Control("tcp4", "93.184.216.34:443", nil), ErrRefused)
		assert.ErrorIs(t, p.Control("tcp6", "[::ffff:93.184.216.34]:443", nil), ErrRefused)
		assert.NoError(t, p.Control("tcp4", "93.184.217.1:443", nil))
	}
	assert.NoError(t, Policy{Deny: deny, AllowPrivate: true}.Control("tcp4", "127.0.0.1:80", nil), "deny list only adds")

	none, err := ParseDenyCIDRs("  ")
	require.NoError(t, err)
	assert.Empty(t, none)
	for _, bad := range []string{"10.0.0.0", "10.1.2.3/8", "10.0.0.0/33", "10.0.0.0/8,", "::ffff:10.0.0.0/104", "fe80::%eth0/64", "example.com/24"} {
		_, err := ParseDenyCIDRs(bad)
		assert.Error(t, err, bad)
		if err != nil {
			assert.NotContains(t, err.Error(), "example.com", "the error does not echo arbitrary input")
		}
	}
}

func TestPublicCategory(t *testing.T) {
	t.Parallel()
	for stored, shown := range map[string]string{
		"":                     "",
		"connection_refused":   "connection_refused",
		"tls":                  "tls",
		"timeout":              "timeout",
		"http_status":          "http_status",
		"refused_address":      "refused_address",
		"webhook answered 500": "other",
		"post webhook: Post request: dial tcp 10.0.0.1:22: connect: connection refused": "other",
	} {
		assert.Equal(t, shown, PublicCategory(stored), stored)
	}
}
