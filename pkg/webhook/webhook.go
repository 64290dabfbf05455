// Package webhook is the platform's side of event delivery: the address policy every consumer
// target is held to (address.go, docs/decisions.md "SSRF"), the error categories of delivery
// attempts, and the names the platform signs with. The signature scheme itself — Standard Webhooks
// (https://www.standardwebhooks.com): webhook-id, webhook-timestamp and webhook-signature
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>" under a "whsec_" secret — has one
// implementation, the SDK's sdk/go/webhooks, which receivers verify with; the functions here
// call it, so the platform signs exactly as a receiver verifies.
package webhook

import (
	"net/http"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// Header names.
const (
	HeaderID        = webhooks.HeaderID
	HeaderTimestamp = webhooks.HeaderTimestamp
	HeaderSignature = webhooks.HeaderSignature
)

// DefaultTolerance is how far a timestamp may be from the receiver's clock.
const DefaultTolerance = webhooks.DefaultTolerance

// NewSecret returns a fresh signing secret: "whsec_" and 32 random bytes in base64.
func NewSecret() (string, error) { return webhooks.NewSecret() }

// Sign returns the webhook-signature value for a message.
func Sign(secret, id string, ts time.Time, body []byte) (string, error) {
	return webhooks.Sign(secret, id, ts, body)
}

// SetHeaders signs body and sets the three headers on h.
func SetHeaders(h http.Header, secret, id string, ts time.Time, body []byte) error {
	return webhooks.SetHeaders(h, []string{secret}, id, ts, body)
}

// SetHeadersRotating signs body with every secret and sets the three headers on h, the signatures
// space-separated in webhook-signature, as Standard Webhooks prescribes for secret rotation: a
// receiver that knows either the current or the previous secret finds a signature it can verify.
// At least one secret is required.
func SetHeadersRotating(h http.Header, secrets []string, id string, ts time.Time, body []byte) error {
	return webhooks.SetHeaders(h, secrets, id, ts, body)
}

// SignRotating returns the webhook-signature value for a message signed with every secret, the
// signatures space-separated (see SetHeadersRotating): what a gRPC consumer's delivery carries in
// its metadata. At least one secret is required.
func SignRotating(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	return webhooks.SignAll(secrets, id, ts, body)
}

// Timestamp is the webhook-timestamp value for ts: Unix seconds.
func Timestamp(ts time.Time) string { return webhooks.Timestamp(ts) }

// Verify checks the headers of a received webhook against body: one of its v1 signatures (there
// are several while the sender rotates its secret) must match and the timestamp must be within
// tolerance of now (webhooks.Verifier.Verify).
func Verify(secret string, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	return webhooks.Verifier{Secrets: []string{secret}, Tolerance: tolerance, Now: func() time.Time { return now }}.Verify(h, body)
}
