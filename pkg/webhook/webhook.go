// Package webhook is the platform's side of event delivery: the address policy every consumer
// target is held to (address.go, docs/decisions.md "SSRF"), the error categories of delivery
// attempts. The signature scheme — Standard Webhooks (https://www.standardwebhooks.com):
// webhook-id, webhook-timestamp and webhook-signature "v1,<base64 HMAC-SHA256 of
// id.timestamp.body>" under a "whsec_" secret — has one implementation, the SDK's
// sdk/go/webhooks, which the platform signs with and receivers verify with.
package webhook
