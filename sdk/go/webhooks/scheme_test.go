package webhooks_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/stretchr/testify/require"
)

var (
	schemeBody = []byte(`{"type":"execution.completed","data":{"status":"succeeded"}}`)
	schemeNow  = time.Unix(1_750_000_000, 0)
)

func newSecret(t *testing.T) string {
	t.Helper()
	s, err := webhooks.NewSecret()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(s, "whsec_"))
	return s
}

func signedHeaders(t *testing.T, secret string, ts time.Time) http.Header {
	t.Helper()
	h := http.Header{}
	require.NoError(t, webhooks.SetHeaders(h, []string{secret}, "evt_01", ts, schemeBody))
	return h
}

func TestSignVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)

	h := signedHeaders(t, secret, schemeNow)
	require.Equal(t, "evt_01", h.Get(webhooks.HeaderID))
	require.Equal(t, strconv.FormatInt(schemeNow.Unix(), 10), h.Get(webhooks.HeaderTimestamp))
	require.True(t, strings.HasPrefix(h.Get(webhooks.HeaderSignature), "v1,"))

	sig, err := webhooks.Sign(secret, "evt_01", schemeNow, schemeBody)
	require.NoError(t, err)
	require.Equal(t, sig, h.Get(webhooks.HeaderSignature), "SetHeaders sets what Sign returns")

	require.NoError(t, webhooks.Verifier{Secrets: []string{secret}, Tolerance: webhooks.DefaultTolerance, Now: func() time.Time { return schemeNow }}.Verify(h, schemeBody))
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
		{"tampered schemeBody", func(h http.Header) (string, []byte) {
			return secret, []byte(strings.Replace(string(schemeBody), "succeeded", "failed", 1))
		}, "no webhook-signature matches"},
		{"schemeBody with one trailing byte", func(h http.Header) (string, []byte) {
			return secret, append(append([]byte(nil), schemeBody...), '\n')
		}, "no webhook-signature matches"},
		{"wrong secret", func(h http.Header) (string, []byte) {
			return other, schemeBody
		}, "no webhook-signature matches"},
		{"another message id", func(h http.Header) (string, []byte) {
			h.Set(webhooks.HeaderID, "evt_02")
			return secret, schemeBody
		}, "no webhook-signature matches"},
		{"timestamp moved within tolerance", func(h http.Header) (string, []byte) {
			h.Set(webhooks.HeaderTimestamp, strconv.FormatInt(schemeNow.Unix()+1, 10))
			return secret, schemeBody
		}, "no webhook-signature matches"},
		{"missing webhook-id", func(h http.Header) (string, []byte) {
			h.Del(webhooks.HeaderID)
			return secret, schemeBody
		}, "webhook-id"},
		{"missing webhook-timestamp", func(h http.Header) (string, []byte) {
			h.Del(webhooks.HeaderTimestamp)
			return secret, schemeBody
		}, "webhook-timestamp"},
		{"malformed webhook-timestamp", func(h http.Header) (string, []byte) {
			h.Set(webhooks.HeaderTimestamp, "yesterday")
			return secret, schemeBody
		}, "webhook-timestamp"},
		{"missing webhook-signature", func(h http.Header) (string, []byte) {
			h.Del(webhooks.HeaderSignature)
			return secret, schemeBody
		}, "no webhook-signature matches"},
		{"signature of another version", func(h http.Header) (string, []byte) {
			h.Set(webhooks.HeaderSignature, "v1a,"+strings.TrimPrefix(h.Get(webhooks.HeaderSignature), "v1,"))
			return secret, schemeBody
		}, "no webhook-signature matches"},
		{"secret without base64", func(h http.Header) (string, []byte) {
			return "whsec_not base64!", schemeBody
		}, "whsec_"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := signedHeaders(t, secret, schemeNow)
			s, b := tt.tamper(h)
			err := webhooks.Verifier{Secrets: []string{s}, Tolerance: webhooks.DefaultTolerance, Now: func() time.Time { return schemeNow }}.Verify(h, b)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestVerifyTimestampTolerance(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	tolerance := webhooks.DefaultTolerance

	tests := []struct {
		name string
		// signedAt is when the sender signed, relative to the receiver's now.
		signedAt time.Duration
		ok       bool
	}{
		{"schemeNow", 0, true},
		{"at the tolerance, in the past", -tolerance, true},
		{"at the tolerance, in the future", tolerance, true},
		{"just past the tolerance, in the past", -tolerance - time.Second, false},
		{"just past the tolerance, in the future", tolerance + time.Second, false},
		{"an hour old", -time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := signedHeaders(t, secret, schemeNow.Add(tt.signedAt))
			err := webhooks.Verifier{Secrets: []string{secret}, Tolerance: tolerance, Now: func() time.Time { return schemeNow }}.Verify(h, schemeBody)
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
	oldSig, err := webhooks.Sign(oldSecret, "evt_01", schemeNow, schemeBody)
	require.NoError(t, err)
	newSig, err := webhooks.Sign(currentSecret, "evt_01", schemeNow, schemeBody)
	require.NoError(t, err)

	h := signedHeaders(t, currentSecret, schemeNow)
	h.Set(webhooks.HeaderSignature, strings.Join([]string{
		"v2,c29tZXRoaW5nIGVsc2U=", // another scheme: ignored
		"v1,not-base64!",          // undecodable: ignored
		"v1," + "AAAA" + strings.TrimPrefix(newSig, "v1,")[4:], // a wrong v1 signature
		oldSig,
		newSig,
	}, " "))
	require.NoError(t, webhooks.Verifier{Secrets: []string{oldSecret}, Tolerance: webhooks.DefaultTolerance, Now: func() time.Time { return schemeNow }}.Verify(h, schemeBody))
	require.NoError(t, webhooks.Verifier{Secrets: []string{currentSecret}, Tolerance: webhooks.DefaultTolerance, Now: func() time.Time { return schemeNow }}.Verify(h, schemeBody))

	h.Set(webhooks.HeaderSignature, oldSig+" v1,AAAA")
	require.Error(t, webhooks.Verifier{Secrets: []string{currentSecret}, Tolerance: webhooks.DefaultTolerance, Now: func() time.Time { return schemeNow }}.Verify(h, schemeBody),
		"none of the signatures is of the receiver's secret")
}

// TestRotatingSignaturesEachVerify: while a secret rotates, webhook-signature carries one
// signature per secret, and a receiver holding either secret verifies; a third does not.
func TestRotatingSignaturesEachVerify(t *testing.T) {
	t.Parallel()
	current, previous, other := newSecret(t), newSecret(t), newSecret(t)

	h := http.Header{}
	require.NoError(t, webhooks.SetHeaders(h, []string{current, previous}, "evt_01", schemeNow, schemeBody))
	sigs := strings.Fields(h.Get(webhooks.HeaderSignature))
	require.Len(t, sigs, 2)
	for i, secret := range []string{current, previous} {
		want, err := webhooks.Sign(secret, "evt_01", schemeNow, schemeBody)
		require.NoError(t, err)
		require.Equal(t, want, sigs[i], "signature %d is the secret's own, in order", i)
		require.NoError(t, webhooks.Verifier{Secrets: []string{secret}, Tolerance: webhooks.DefaultTolerance, Now: func() time.Time { return schemeNow }}.Verify(h, schemeBody))
	}
	require.Error(t, webhooks.Verifier{Secrets: []string{other}, Tolerance: webhooks.DefaultTolerance, Now: func() time.Time { return schemeNow }}.Verify(h, schemeBody))
	require.Error(t, webhooks.SetHeaders(http.Header{}, nil, "evt_01", schemeNow, schemeBody), "no secret, no headers")
}
