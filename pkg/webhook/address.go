package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
)

// MaxEndpointLength bounds a consumer endpoint, a webhook URL or a gRPC target, in bytes: what
// browsers and most servers accept, and far more than any real webhook needs.
const MaxEndpointLength = 2048

// Policy is the one rule for which consumer endpoints the platform may reach. The gateway applies
// it when a consumer is registered (CheckURL, CheckTarget, then CheckResolved as a courtesy) and
// the event router applies it again before every attempt (CheckURL, CheckTarget on the stored
// endpoint, which may not have come through registration) and on every connection (Control, on
// the address actually dialled after name resolution: the guard against DNS rebinding).
//
// The checks come in two kinds. Syntactic checks apply always, also with AllowPrivate: a length
// bound, the scheme, no credentials, no percent-encoded or zoned hosts, no numeric IPv4 forms
// other than a dotted quad, no trailing dot, ASCII DNS names only. Nothing legitimate needs any of
// those, and each is a way to make two parsers disagree on the host. The address checks — special
// addresses, localhost, internal and metadata names, single-label names — are lifted by
// AllowPrivate, for development and tests, where consumers live on loopback. The operator's Deny
// ranges apply always, also with AllowPrivate: a deny list is a deployment's statement of what it
// must never reach, and the dev flag is not meant to override it.
type Policy struct {
	// AllowPrivate lets endpoints reach loopback, private, link-local and other special-purpose
	// addresses and internal names (INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE).
	AllowPrivate bool
	// AllowHTTP lets webhook URLs use http besides https (INTEGRATIONS_WEBHOOK_ALLOW_HTTP).
	AllowHTTP bool
	// Deny lists ranges never reached whatever AllowPrivate says
	// (INTEGRATIONS_WEBHOOK_DENY_CIDRS): a deployment whose pod, service or VPC ranges are public
	// address space names them here.
	Deny []netip.Prefix
}

// ParseDenyCIDRs reads a comma-separated list of CIDRs ("203.0.113.0/24, 2001:db8::/32"; empty:
// none), as INTEGRATIONS_WEBHOOK_DENY_CIDRS carries it. Each must be a prefix in canonical form
// (no host bits set: "10.1.2.3/8" is more likely a typo than a wish, so it is refused rather than
// widened), without a zone; an IPv4-mapped prefix is refused, since addresses are judged unmapped.
func ParseDenyCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for i, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		pfx, err := netip.ParsePrefix(f)
		switch {
		case err != nil:
			return nil, fmt.Errorf("entry %d: not a CIDR (a.b.c.d/n or v6::/n)", i+1)
		case pfx != pfx.Masked():
			return nil, fmt.Errorf("entry %d: %s has host bits set (did you mean %s?)", i+1, pfx, pfx.Masked())
		case pfx.Addr().Is4In6():
			return nil, fmt.Errorf("entry %d: %s is IPv4-mapped; give the IPv4 prefix", i+1, pfx)
		}
		out = append(out, pfx)
	}
	return out, nil
}

// denied reports whether addr is in one of the operator's Deny ranges. The address is judged
// unmapped, so that ::ffff:a.b.c.d cannot slip past an IPv4 entry when AllowPrivate lets mapped
// addresses through.
func (p Policy) denied(addr netip.Addr) bool {
	a := addr.Unmap()
	for _, pfx := range p.Deny {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// ErrRefused matches, with errors.Is, every refusal of the policy, however wrapped (a dial error
// wraps the Control refusal in a *net.OpError and a *url.Error).
var ErrRefused = errors.New("refused by the address policy")

// RefusedError says why the policy refused an endpoint or an address. Its text never repeats the
// input, so it can be logged and answered as is.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// Is makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

func refused(format string, args ...any) error {
	return &RefusedError{Reason: fmt.Sprintf(format, args...)}
}

// CheckURL checks a webhook URL and returns it parsed.
func (p Policy) CheckURL(raw string) (*url.URL, error) {
	if err := checkText(raw); err != nil {
		return nil, err
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, refused("not a valid URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowHTTP:
	default:
		return nil, refused("scheme must be https (http is allowed only with INTEGRATIONS_WEBHOOK_ALLOW_HTTP)")
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, refused("not an absolute URL with a host")
	}
	if u.User != nil {
		return nil, refused("must not carry credentials")
	}
	// url.Parse decodes percent-escapes in the host; the raw authority is checked instead, so
	// that what is checked and what is dialled are the same text.
	if authority := rawAuthority(raw); strings.ContainsAny(authority, `%\`) {
		return nil, refused("host must not be percent-encoded or carry an IPv6 zone")
	}
	if strings.HasSuffix(u.Host, ":") {
		return nil, refused("port is empty")
	}
	if port := u.Port(); port != "" {
		if err := checkPort(port); err != nil {
			return nil, err
		}
	}
	if err := p.CheckHost(u.Hostname()); err != nil {
		return nil, err
	}
	return u, nil
}

// CheckTarget checks a gRPC consumer target, "host:port" (IPv6 in brackets), and returns its host.
// No resolver scheme ("dns:///...") is taken: the event router dials the target as given.
func (p Policy) CheckTarget(target string) (string, error) {
	if err := checkText(target); err != nil {
		return "", err
	}
	if strings.Contains(target, "%") {
		return "", refused("host must not be percent-encoded or carry an IPv6 zone")
	}
	host, port, err := splitHostPort(target)
	if err != nil {
		return "", err
	}
	if err := checkPort(port); err != nil {
		return "", err
	}
	if err := p.CheckHost(host); err != nil {
		return "", err
	}
	return host, nil
}

// splitHostPort splits "host:port" and "[v6]:port", refusing anything else (brackets around a
// name, a bare IPv6 address, an empty host).
func splitHostPort(target string) (host, port string, err error) {
	notHostPort := refused("not host:port")
	if strings.HasPrefix(target, "[") {
		end := strings.Index(target, "]")
		if end < 0 || !strings.HasPrefix(target[end+1:], ":") {
			return "", "", notHostPort
		}
		host, port = target[1:end], target[end+2:]
		if !strings.Contains(host, ":") {
			return "", "", notHostPort
		}
		return host, port, nil
	}
	i := strings.LastIndex(target, ":")
	if i <= 0 || strings.ContainsAny(target[:i], ":[]") {
		return "", "", notHostPort
	}
	return target[:i], target[i+1:], nil
}

// checkText bounds an endpoint and keeps it to printable ASCII without spaces or backslashes:
// anything else is a way for the checker and the dialler to read two different hosts.
func checkText(s string) error {
	if s == "" {
		return refused("required")
	}
	if len(s) > MaxEndpointLength {
		return refused("longer than %d bytes", MaxEndpointLength)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return refused("must be printable ASCII without spaces or backslashes (non-ASCII host names in their xn-- form)")
		}
	}
	return nil
}

// rawAuthority is the authority of an absolute URL as written: between "//" and the path.
func rawAuthority(raw string) string {
	i := strings.Index(raw, "//")
	if i < 0 {
		return ""
	}
	rest := raw[i+2:]
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func checkPort(port string) error {
	if port == "" || len(port) > 5 || strings.TrimLeft(port, "0123456789") != "" {
		return refused("port must be a number from 1 to 65535")
	}
	if n, _ := strconv.Atoi(port); n < 1 || n > 65535 {
		return refused("port must be a number from 1 to 65535")
	}
	return nil
}

// CheckHost checks a host as it appears in an endpoint (IPv6 without brackets): an IP address in
// canonical form (CheckAddr), or an ASCII DNS name.
func (p Policy) CheckHost(host string) error {
	if host == "" {
		return refused("host is empty")
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return p.CheckAddr(addr)
	}
	if strings.ContainsAny(host, ":%[]") {
		return refused("not a valid IP address")
	}
	if len(host) > 253 {
		return refused("host name longer than 253 bytes")
	}
	name := strings.ToLower(host)
	if strings.HasSuffix(name, ".") {
		// A fully qualified "name." is valid DNS, but it slips past every comparison with a
		// name ("localhost." is localhost), and no consumer needs it.
		return refused("host must not end with a dot")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if !validLabel(l) {
			return refused("host must be a DNS name (letters, digits, hyphens; non-ASCII names in their xn-- form) or an IP address")
		}
	}
	if numericLabel(labels[len(labels)-1]) {
		// As the URL standard does: a host whose last label is a number is an IPv4 address.
		// inet_aton reads 2130706433, 0x7f000001, 0177.0.0.1 and 127.1 as 127.0.0.1, and the
		// platform's resolver may hand them to it; only the canonical dotted quad is taken.
		return refused("an IPv4 address must be written as a dotted quad (a.b.c.d, decimal, no leading zeros)")
	}
	if p.AllowPrivate {
		return nil
	}
	if len(labels) == 1 {
		// A single label is a top-level domain when resolved rooted, as every name is
		// (Rooted), and no consumer lives at a TLD; unrooted it is what /etc/hosts, a cgo
		// resolver or a mistake would resolve through the platform's own search domains (a
		// Kubernetes service, "metadata", "instance-data"). Nothing public is lost.
		return refused("host must be a fully qualified public name")
	}
	if internalName(name) {
		return refused("host names a local, internal or cloud metadata service")
	}
	return nil
}

// validLabel: 1 to 63 letters, digits, hyphens or underscores (seen in real host names), not
// starting or ending with a hyphen.
func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// numericLabel: decimal digits, or 0x and hex digits (the URL standard's IPv4 number).
func numericLabel(l string) bool {
	if strings.HasPrefix(l, "0x") {
		return strings.TrimLeft(l[2:], "0123456789abcdef") == ""
	}
	return l != "" && strings.TrimLeft(l, "0123456789") == ""
}

// internalSuffixes are name suffixes that never name a public consumer: special-use names
// (RFC 6761, RFC 8375), multicast DNS and Kubernetes' cluster domain (.local), the private
// zones of cloud providers (GCP's and AWS's .internal), and reverse-lookup names.
var internalSuffixes = []string{
	"localhost", "local", "localdomain", "internal", "intranet", "lan", "home.arpa", "arpa",
	"test", "invalid", "onion", "svc", "cluster.local",
}

// metadataNames are cloud instance-metadata services reachable under a public-looking name (the
// single-label ones, "metadata" and "instance-data", are refused as single labels).
var metadataNames = []string{
	"metadata.google.internal", "metadata.goog", // GCP
	"instance-data.ec2.internal",                          // AWS
	"metadata.tencentyun.com",                             // Tencent Cloud
	"metadata.platformequinix.com", "metadata.packet.net", // Equinix Metal
	"kubernetes.default.svc", // the Kubernetes API
}

func internalName(name string) bool {
	for _, m := range metadataNames {
		if name == m || strings.HasSuffix(name, "."+m) {
			return true
		}
	}
	for _, s := range internalSuffixes {
		if name == s || strings.HasSuffix(name, "."+s) {
			return true
		}
	}
	return false
}

// CheckAddr checks an IP address: never one with an IPv6 zone (netip prefixes do not contain
// zoned addresses, so "fe80::1%eth0" would pass every range check, and a zone only means
// anything on the router's own links); unless AllowPrivate, only a public address.
func (p Policy) CheckAddr(addr netip.Addr) error {
	if !addr.IsValid() {
		return refused("not an IP address")
	}
	if addr.Zone() != "" {
		return refused("IPv6 zones are not allowed")
	}
	if p.denied(addr) {
		return refused("address is in a range this deployment does not allow")
	}
	if !p.AllowPrivate && !PublicAddress(addr) {
		return refused("private, loopback, link-local and other special-purpose addresses are not allowed")
	}
	return nil
}

// Control is a net.Dialer Control function: it runs after name resolution, on the address
// actually being connected, so a name that resolves to a special address — at registration or
// only later (DNS rebinding) — is never connected to.
func (p Policy) Control(network, address string, _ syscall.RawConn) error {
	if network != "tcp4" && network != "tcp6" {
		return refused("network %s is not allowed", network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return refused("dialled address is not an IP address and port")
	}
	// The address comes from the resolver, not the tenant, so its IPv4-mapped form (Go prints
	// IPv4 addresses as dotted quads, but a tcp6 socket to ::ffff:a.b.c.d connects to
	// a.b.c.d) is judged as the IPv4 address it connects to.
	return p.CheckAddr(ap.Addr().Unmap())
}

// Rooted is the name a host is resolved as: a DNS name with a dot gets a trailing dot, so that the
// resolver asks for exactly that name and never tries it under the search domains of
// /etc/resolv.conf first (in Kubernetes, ndots:5 makes "kubernetes.default" resolve as
// "kubernetes.default.svc.cluster.local" before anything else): otherwise registration and
// delivery would answer, for a name that exists only inside the cluster, differently from a name
// that exists nowhere — an oracle for internal names. IP literals and single labels are returned
// as they are: single labels are refused unless AllowPrivate (see CheckHost), and Go's /etc/hosts
// lookup does not match "localhost." to "localhost", which development relies on.
//
// Only resolution is rooted: the TLS server name, the Host header and the gRPC :authority still
// come from the endpoint as registered.
func Rooted(host string) string {
	if _, err := netip.ParseAddr(host); err == nil {
		return host
	}
	if !strings.Contains(host, ".") || strings.HasSuffix(host, ".") {
		return host
	}
	return host + "."
}

// RootedDial wraps a dial function ("host:port" addresses, as net.Dialer.DialContext takes) so
// that a host name is resolved rooted (Rooted). An address it cannot split is passed on as is,
// for the dialer to refuse.
func RootedDial(dial func(ctx context.Context, network, address string) (net.Conn, error)) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(address); err == nil {
			address = net.JoinHostPort(Rooted(host), port)
		}
		return dial(ctx, network, address)
	}
}

// Resolver looks names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// CheckResolved resolves a host name that CheckHost accepted and refuses it when every address it
// resolves to is refused by CheckAddr: a courtesy at registration, so that a tenant who names an
// internal host learns it at once rather than from failed deliveries. It is not the guard —
// Control is — so it decides nothing it cannot: a name that does not resolve (yet, or from
// here) is accepted (err is nil), and so is a name with at least one public address.
//
// The name is looked up rooted (Rooted), as the event router dials it: an unrooted lookup would
// try the platform's search domains first, and tell a tenant which internal names exist.
func (p Policy) CheckResolved(ctx context.Context, r Resolver, host string) error {
	if (p.AllowPrivate && len(p.Deny) == 0) || r == nil {
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil // an address: CheckAddr has judged it
	}
	addrs, err := r.LookupNetIP(ctx, "ip", Rooted(host))
	if err != nil || len(addrs) == 0 {
		return nil
	}
	for _, a := range addrs {
		// Unmapped: Go's resolver answers /etc/hosts entries as ::ffff:a.b.c.d, and the
		// address comes from the resolver, not the tenant, so it is the IPv4 address it carries.
		if p.CheckAddr(a.Unmap()) == nil {
			return nil
		}
	}
	return refused("host resolves only to addresses the platform does not reach (private, loopback, link-local, other special-purpose or denied by this deployment)")
}

// globalUnicast6 is the only IPv6 block allocated for global unicast: anything outside it
// (loopback, unspecified, IPv4-mapped, -compatible and -translated, NAT64, discard, SRv6,
// unique-local, link-local, site-local, multicast) is not a public address.
var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// specialPurpose lists the special-purpose ranges (RFC 6890 and its updates, IANA's registries)
// a webhook must not reach unless the deployment allows private targets: IPv4 this-network,
// private, shared/CGNAT (cloud metadata at 100.100.100.200), loopback, link-local (cloud metadata
// at 169.254.169.254), IETF protocol assignments, documentation, 6to4 relay, benchmarking,
// multicast and reserved; and inside 2000::/3 the IPv6 IETF protocol assignments (Teredo,
// ORCHID, benchmarking), documentation and 6to4, which carry or translate IPv4 addresses; and
// Azure's host endpoint 168.63.129.16.
var specialPurpose = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
	"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"2001::/23", "2001:db8::/32", "2002::/16", "3fff::/20",
	// Not special-purpose but a cloud's host endpoint inside its VMs: Azure's WireServer and
	// metadata proxy at 168.63.129.16, a public-looking address that answers only from inside
	// Azure (instance metadata, DNS, health probes, VM agent configuration).
	"168.63.129.16/32",
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// PublicAddress reports whether addr is a public unicast address: outside every special-purpose
// range (and not a cloud's host endpoint), without a zone, and for IPv6 inside 2000::/3. An IPv4-mapped IPv6 address (::ffff:a.b.c.d)
// is not public whatever it carries: no consumer needs that form, and judging it as its IPv4
// address is one more place for two parsers to disagree.
func PublicAddress(addr netip.Addr) bool {
	if !addr.IsValid() || addr.Zone() != "" {
		return false
	}
	if addr.Is6() && !globalUnicast6.Contains(addr) {
		return false
	}
	for _, p := range specialPurpose {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}
