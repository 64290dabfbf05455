// Package webhook signs and verifies webhook requests per the Standard Webhooks convention
// (https://www.standardwebhooks.com): headers webhook-id, webhook-timestamp and
// webhook-signature: "v1,<base64 HMAC-SHA256 of id.timestamp.body>", with a "whsec_" secret.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	secretPrefix    = "whsec_"
)

// DefaultTolerance is how far a timestamp may be from the receiver's clock.
const DefaultTolerance = 5 * time.Minute

// NewSecret returns a fresh signing secret: "whsec_" and 32 random bytes in base64.
func NewSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate signing secret: %w", err)
	}
	return secretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

func secretKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, secretPrefix))
	if err != nil || len(key) == 0 {
		return nil, errors.New("signing secret must be whsec_ followed by base64")
	}
	return key, nil
}

// Sign returns the webhook-signature value for a message.
func Sign(secret, id string, ts time.Time, body []byte) (string, error) {
	key, err := secretKey(secret)
	if err != nil {
		return "", err
	}
	return "v1," + base64.StdEncoding.EncodeToString(mac(key, id, ts.Unix(), body)), nil
}

// SetHeaders signs body and sets the three headers on h.
func SetHeaders(h http.Header, secret, id string, ts time.Time, body []byte) error {
	return SetHeadersRotating(h, []string{secret}, id, ts, body)
}

// SetHeadersRotating signs body with every secret and sets the three headers on h, the signatures
// space-separated in webhook-signature, as Standard Webhooks prescribes for secret rotation: a
// receiver that knows either the current or the previous secret finds a signature it can verify.
// At least one secret is required.
func SetHeadersRotating(h http.Header, secrets []string, id string, ts time.Time, body []byte) error {
	sigs, err := SignRotating(secrets, id, ts, body)
	if err != nil {
		return err
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, Timestamp(ts))
	h.Set(HeaderSignature, sigs)
	return nil
}

// SignRotating returns the webhook-signature value for a message signed with every secret, the
// signatures space-separated (see SetHeadersRotating): what a gRPC consumer's delivery carries in
// its metadata. At least one secret is required.
func SignRotating(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	if len(secrets) == 0 {
		return "", errors.New("no signing secret")
	}
	sigs := make([]string, len(secrets))
	for i, secret := range secrets {
		sig, err := Sign(secret, id, ts, body)
		if err != nil {
			return "", err
		}
		sigs[i] = sig
	}
	return strings.Join(sigs, " "), nil
}

// Timestamp is the webhook-timestamp value for ts: Unix seconds.
func Timestamp(ts time.Time) string { return strconv.FormatInt(ts.Unix(), 10) }

// Verify checks the headers of a received webhook against body: one of its v1 signatures (there
// are several while the sender rotates its secret) must match and the timestamp must be within
// tolerance of now.
func Verify(secret string, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	key, err := secretKey(secret)
	if err != nil {
		return err
	}
	id := h.Get(HeaderID)
	if id == "" {
		return errors.New("missing webhook-id")
	}
	ts, err := strconv.ParseInt(h.Get(HeaderTimestamp), 10, 64)
	if err != nil {
		return errors.New("missing or malformed webhook-timestamp")
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("webhook-timestamp is %s away from now", d.Round(time.Second))
	}
	want := mac(key, id, ts, body)
	for _, sig := range strings.Fields(h.Get(HeaderSignature)) {
		version, value, ok := strings.Cut(sig, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(value)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no webhook-signature matches")
}

func mac(key []byte, id string, ts int64, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}
