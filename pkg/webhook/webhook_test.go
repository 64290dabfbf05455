package webhook_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/webhook"
)

var (
	body = []byte(`{"type":"execution.completed","data":{"status":"succeeded"}}`)
	now  = time.Unix(1_750_000_000, 0)
)

func newSecret(t *testing.T) string {
	t.Helper()
	s, err := webhook.NewSecret()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(s, "whsec_"))
	return s
}

func signedHeaders(t *testing.T, secret string, ts time.Time) http.Header {
	t.Helper()
	h := http.Header{}
	require.NoError(t, webhook.SetHeaders(h, secret, "evt_01", ts, body))
	return h
}

func TestSignVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)

	h := signedHeaders(t, secret, now)
	require.Equal(t, "evt_01", h.Get(webhook.HeaderID))
	require.Equal(t, strconv.FormatInt(now.Unix(), 10), h.Get(webhook.HeaderTimestamp))
	require.True(t, strings.HasPrefix(h.Get(webhook.HeaderSignature), "v1,"))

	sig, err := webhook.Sign(secret, "evt_01", now, body)
	require.NoError(t, err)
	require.Equal(t, sig, h.Get(webhook.HeaderSignature), "SetHeaders sets what Sign returns")

	require.NoError(t, webhook.Verify(secret, h, body, now, webhook.DefaultTolerance))
}

func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	other := newSecret(t)

	tests := []struct {
		name string
		// tamper changes what the receiver sees; it returns the secret and body to verify with.
		tamper func(h http.Header) (string, []byte)
		want   string
	}{
		{"tampered body", func(h http.Header) (string, []byte) {
			return secret, []byte(strings.Replace(string(body), "succeeded", "failed", 1))
		}, "no webhook-signature matches"},
		{"body with one trailing byte", func(h http.Header) (string, []byte) {
			return secret, append(append([]byte(nil), body...), '\n')
		}, "no webhook-signature matches"},
		{"wrong secret", func(h http.Header) (string, []byte) {
			return other, body
		}, "no webhook-signature matches"},
		{"another message id", func(h http.Header) (string, []byte) {
			h.Set(webhook.HeaderID, "evt_02")
			return secret, body
		}, "no webhook-signature matches"},
		{"timestamp moved within tolerance", func(h http.Header) (string, []byte) {
			h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10))
			return secret, body
		}, "no webhook-signature matches"},
		{"missing webhook-id", func(h http.Header) (string, []byte) {
			h.Del(webhook.HeaderID)
			return secret, body
		}, "webhook-id"},
		{"missing webhook-timestamp", func(h http.Header) (string, []byte) {
			h.Del(webhook.HeaderTimestamp)
			return secret, body
		}, "webhook-timestamp"},
		{"malformed webhook-timestamp", func(h http.Header) (string, []byte) {
			h.Set(webhook.HeaderTimestamp, "yesterday")
			return secret, body
		}, "webhook-timestamp"},
		{"missing webhook-signature", func(h http.Header) (string, []byte) {
			h.Del(webhook.HeaderSignature)
			return secret, body
		}, "no webhook-signature matches"},
		{"signature of another version", func(h http.Header) (string, []byte) {
			h.Set(webhook.HeaderSignature, "v1a,"+strings.TrimPrefix(h.Get(webhook.HeaderSignature), "v1,"))
			return secret, body
		}, "no webhook-signature matches"},
		{"secret without base64", func(h http.Header) (string, []byte) {
			return "whsec_not base64!", body
		}, "whsec_"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := signedHeaders(t, secret, now)
			s, b := tt.tamper(h)
			err := webhook.Verify(s, h, b, now, webhook.DefaultTolerance)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestVerifyTimestampTolerance(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	tolerance := webhook.DefaultTolerance

	tests := []struct {
		name string
		// signedAt is when the sender signed, relative to the receiver's now.
		signedAt time.Duration
		ok       bool
	}{
		{"now", 0, true},
		{"at the tolerance, in the past", -tolerance, true},
		{"at the tolerance, in the future", tolerance, true},
		{"just past the tolerance, in the past", -tolerance - time.Second, false},
		{"just past the tolerance, in the future", tolerance + time.Second, false},
		{"an hour old", -time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := signedHeaders(t, secret, now.Add(tt.signedAt))
			err := webhook.Verify(secret, h, body, now, tolerance)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Contains(t, err.Error(), "webhook-timestamp")
		})
	}
}

func TestVerifyAcceptsAnyOfSeveralSignatures(t *testing.T) {
	t.Parallel()
	oldSecret, currentSecret := newSecret(t), newSecret(t)

	// A sender rotating its secret signs with both; a receiver holding either one accepts.
	oldSig, err := webhook.Sign(oldSecret, "evt_01", now, body)
	require.NoError(t, err)
	newSig, err := webhook.Sign(currentSecret, "evt_01", now, body)
	require.NoError(t, err)

	h := signedHeaders(t, currentSecret, now)
	h.Set(webhook.HeaderSignature, strings.Join([]string{
		"v2,c29tZXRoaW5nIGVsc2U=", // another scheme: ignored
		"v1,not-base64!",          // undecodable: ignored
		"v1," + "AAAA" + strings.TrimPrefix(newSig, "v1,")[4:], // a wrong v1 signature
		oldSig,
		newSig,
	}, " "))
	require.NoError(t, webhook.Verify(oldSecret, h, body, now, webhook.DefaultTolerance))
	require.NoError(t, webhook.Verify(currentSecret, h, body, now, webhook.DefaultTolerance))

	h.Set(webhook.HeaderSignature, oldSig+" v1,AAAA")
	require.Error(t, webhook.Verify(currentSecret, h, body, now, webhook.DefaultTolerance),
		"none of the signatures is of the receiver's secret")
}

// The test vector published in the Standard Webhooks repository
// (github.com/standard-webhooks/standard-webhooks), recomputed independently as
// base64(HMAC-SHA256(base64decode("MfKQ…"), "msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{\"test\": 2432232314}")).
func TestStandardWebhooksTestVector(t *testing.T) {
	t.Parallel()
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	ts := time.Unix(1614265330, 0)
	payload := []byte(`{"test": 2432232314}`)

	got, err := webhook.Sign(secret, id, ts, payload)
	require.NoError(t, err)
	require.Equal(t, want, got)

	h := http.Header{}
	h.Set(webhook.HeaderID, id)
	h.Set(webhook.HeaderTimestamp, "1614265330")
	h.Set(webhook.HeaderSignature, want)
	require.NoError(t, webhook.Verify(secret, h, payload, ts, webhook.DefaultTolerance))
}

// TestRotatingSignaturesEachVerify: while a secret rotates, webhook-signature carries one
// signature per secret, and a receiver holding either secret verifies; a third does not.
func TestRotatingSignaturesEachVerify(t *testing.T) {
	t.Parallel()
	current, previous, other := newSecret(t), newSecret(t), newSecret(t)

	h := http.Header{}
	require.NoError(t, webhook.SetHeadersRotating(h, []string{current, previous}, "evt_01", now, body))
	sigs := strings.Fields(h.Get(webhook.HeaderSignature))
	require.Len(t, sigs, 2)
	for i, secret := range []string{current, previous} {
		want, err := webhook.Sign(secret, "evt_01", now, body)
		require.NoError(t, err)
		require.Equal(t, want, sigs[i], "signature %d is the secret's own, in order", i)
		require.NoError(t, webhook.Verify(secret, h, body, now, webhook.DefaultTolerance))
	}
	require.Error(t, webhook.Verify(other, h, body, now, webhook.DefaultTolerance))
	require.Error(t, webhook.SetHeadersRotating(http.Header{}, nil, "evt_01", now, body), "no secret, no headers")
}
