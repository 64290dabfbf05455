package webhook

// Delivery error categories: all a tenant is told of why a delivery attempt failed, in the
// event's last_error and each delivery attempt's error. Raw network text ("connect: connection
// refused" against "tls: first record does not look like a TLS handshake", with addresses and
// timings) would turn the event router into a port scanner of whatever a consumer URL can name;
// the raw text goes only to the event router's log.
const (
	// CategoryConnectionRefused: the consumer's host refused the connection.
	CategoryConnectionRefused = "connection_refused"
	// CategoryConnectionClosed: the connection was reset or closed before a whole answer came.
	CategoryConnectionClosed = "connection_closed"
	// CategoryTLS: the TLS handshake failed (certificate, protocol).
	CategoryTLS = "tls"
	// CategoryTimeout: no (whole) answer within the attempt's timeout.
	CategoryTimeout = "timeout"
	// CategoryDNS: the consumer's host name did not resolve.
	CategoryDNS = "dns"
	// CategoryHTTPStatus: a webhook answered with a status other than 2xx (the attempt's
	// status_code says which; a redirect is one, as redirects are not followed).
	CategoryHTTPStatus = "http_status"
	// CategoryGRPCStatus: a gRPC consumer answered with a status other than OK (the attempt's
	// status_code holds the gRPC code).
	CategoryGRPCStatus = "grpc_status"
	// CategoryRefusedAddress: the endpoint, or an address its name resolved to, is refused by the
	// address Policy; nothing was sent (or even connected).
	CategoryRefusedAddress = "refused_address"
	// CategoryNoConsumer: the application has no consumer registered.
	CategoryNoConsumer = "no_consumer"
	// CategoryOther: anything else, including faults of the platform's own.
	CategoryOther = "other"
)

var categories = map[string]bool{
	CategoryConnectionRefused: true, CategoryConnectionClosed: true, CategoryTLS: true,
	CategoryTimeout: true, CategoryDNS: true, CategoryHTTPStatus: true, CategoryGRPCStatus: true,
	CategoryRefusedAddress: true, CategoryNoConsumer: true, CategoryOther: true,
}

// PublicCategory is what a tenant is shown of a stored delivery error: the error itself when it
// is a category, CategoryOther for anything else (rows recorded before errors were categories
// hold raw network text, which is never shown). The empty string (no error) stays empty.
func PublicCategory(stored string) string {
	if stored == "" || categories[stored] {
		return stored
	}
	return CategoryOther
}
