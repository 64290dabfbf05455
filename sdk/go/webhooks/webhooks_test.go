package webhooks_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// The test vector published in the Standard Webhooks repository
// (github.com/standard-webhooks/standard-webhooks): the scheme is theirs, not only ours.
func TestStandardWebhooksTestVector(t *testing.T) {
	t.Parallel()
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	ts := time.Unix(1614265330, 0)
	payload := []byte(`{"test": 2432232314}`)

	got, err := webhooks.Sign(secret, id, ts, payload)
	require.NoError(t, err)
	require.Equal(t, want, got)
	got, err = webhooks.Sign(strings.TrimPrefix(secret, webhooks.SecretPrefix), id, ts, payload)
	require.NoError(t, err)
	require.Equal(t, want, got, "the prefix is optional, as in the reference libraries")

	h := http.Header{}
	h.Set(webhooks.HeaderID, id)
	h.Set(webhooks.HeaderTimestamp, "1614265330")
	h.Set(webhooks.HeaderSignature, want)
	v := webhooks.Verifier{Secrets: []string{secret}, Now: func() time.Time { return ts }}
	require.NoError(t, v.Verify(h, payload))
}

// TestSignAllIsIndependentSigning: the package's signatures are those this test computes apart
// from it (signAll, in delivery_test.go), one per secret, in order.
func TestSignAllIsIndependentSigning(t *testing.T) {
	t.Parallel()
	current, previous := secret(t), secret(t)
	now := time.Now()
	got, err := webhooks.SignAll([]string{current, previous}, "evt-1", now, []byte(body))
	require.NoError(t, err)
	want, err := signAll([]string{current, previous}, "evt-1", now, []byte(body))
	require.NoError(t, err)
	require.Equal(t, want, got)

	_, err = webhooks.SignAll(nil, "evt-1", now, []byte(body))
	require.Error(t, err, "no secret, no signature")
	_, err = webhooks.Sign("whsec_not base64!", "evt-1", now, []byte(body))
	require.ErrorIs(t, err, webhooks.ErrSecret)

	s, err := webhooks.NewSecret()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(s, webhooks.SecretPrefix))
	_, err = webhooks.Sign(s, "evt-1", now, []byte(body))
	require.NoError(t, err)
}

func TestVerifyHTTP(t *testing.T) {
	t.Parallel()
	current, previous, other := secret(t), secret(t), secret(t)
	now := time.Now()
	h := http.Header{}
	require.NoError(t, webhooks.SetHeaders(h, []string{current, previous}, "evt-1", now, []byte(body)))
	require.Len(t, strings.Fields(h.Get(webhooks.HeaderSignature)), 2, "one signature per secret")

	require.NoError(t, webhooks.Verify(h, []byte(body), current))
	require.NoError(t, webhooks.Verify(h, []byte(body), previous))
	require.NoError(t, webhooks.Verify(h, []byte(body), other, previous), "any of the receiver's secrets")
	require.ErrorIs(t, webhooks.Verify(h, []byte(body), other), webhooks.ErrUnverified)
	require.ErrorIs(t, webhooks.Verify(h, []byte(body)), webhooks.ErrUnverified, "no secret verifies nothing")
	err := webhooks.Verify(h, []byte(body), "whsec_not base64!")
	require.ErrorIs(t, err, webhooks.ErrSecret)
	require.NotContains(t, err.Error(), "not base64!", "a secret is never repeated")

	for _, tc := range []struct {
		name   string
		tamper func(h http.Header) []byte
		want   string
	}{
		{"body", func(http.Header) []byte { return []byte(strings.Replace(body, "succeeded", "failed", 1)) }, "no webhook-signature matches"},
		{"a trailing byte", func(http.Header) []byte { return append([]byte(body), '\n') }, "no webhook-signature matches"},
		{"id", func(h http.Header) []byte { h.Set(webhooks.HeaderID, "evt-2"); return []byte(body) }, "no webhook-signature matches"},
		{"two ids", func(h http.Header) []byte { h.Add(webhooks.HeaderID, "evt-2"); return []byte(body) }, "webhook-id given 2 times"},
		{"no id", func(h http.Header) []byte { h.Del(webhooks.HeaderID); return []byte(body) }, "no webhook-id"},
		{"timestamp moved", func(h http.Header) []byte {
			h.Set(webhooks.HeaderTimestamp, webhooks.Timestamp(now.Add(time.Second)))
			return []byte(body)
		}, "no webhook-signature matches"},
		{"timestamp not a number", func(h http.Header) []byte { h.Set(webhooks.HeaderTimestamp, "yesterday"); return []byte(body) }, "webhook-timestamp"},
		{"no signature", func(h http.Header) []byte { h.Del(webhooks.HeaderSignature); return []byte(body) }, "no webhook-signature matches"},
		{"another version", func(h http.Header) []byte {
			h.Set(webhooks.HeaderSignature, strings.ReplaceAll(h.Get(webhooks.HeaderSignature), "v1,", "v1a,"))
			return []byte(body)
		}, "no webhook-signature matches"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			require.NoError(t, webhooks.SetHeaders(h, []string{current}, "evt-1", now, []byte(body)))
			b := tc.tamper(h)
			err := webhooks.Verify(h, b, current)
			require.ErrorIs(t, err, webhooks.ErrUnverified)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestVerifyHTTPTolerance(t *testing.T) {
	t.Parallel()
	s := secret(t)
	now := time.Unix(1_750_000_000, 0)
	for _, tc := range []struct {
		name      string
		signedAt  time.Duration // relative to the receiver's now
		tolerance time.Duration
		ok        bool
	}{
		{"now", 0, 0, true},
		{"at the default tolerance, past", -webhooks.DefaultTolerance, 0, true},
		{"at the default tolerance, future", webhooks.DefaultTolerance, 0, true},
		{"past the default tolerance, past", -webhooks.DefaultTolerance - time.Second, 0, false},
		{"past the default tolerance, future", webhooks.DefaultTolerance + time.Second, 0, false},
		{"an hour old, an hour's tolerance", -time.Hour, time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			require.NoError(t, webhooks.SetHeaders(h, []string{s}, "evt-1", now.Add(tc.signedAt), []byte(body)))
			err := webhooks.Verifier{Secrets: []string{s}, Tolerance: tc.tolerance, Now: func() time.Time { return now }}.Verify(h, []byte(body))
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, webhooks.ErrUnverified)
			require.Contains(t, err.Error(), "webhook-timestamp")
		})
	}
}

// TestVerifyRequest: a receiver's handler gets the event decoded, the body still readable, and a
// refusal for anything not signed, or whose body names another event than its header.
func TestVerifyRequest(t *testing.T) {
	t.Parallel()
	s := secret(t)
	request := func(id, b string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(b))
		require.NoError(t, webhooks.SetHeaders(r.Header, []string{s}, id, time.Now(), []byte(b)))
		return r
	}
	v := webhooks.Verifier{Secrets: []string{s}}

	r := request("evt-1", body)
	ev, err := v.VerifyRequest(r)
	require.NoError(t, err)
	require.Equal(t, "evt-1", ev.ID)
	require.Equal(t, webhooks.TypeExecutionCompleted, ev.Type)
	require.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC), ev.Timestamp.UTC())
	require.Equal(t, "ex-1", ev.Data.ExecutionID)
	require.Equal(t, "succeeded", ev.Data.Status)
	require.EqualValues(t, 2, ev.Data.Sequence)
	require.JSONEq(t, `{"echo":"hé"}`, string(ev.Data.Result))
	again, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	require.Equal(t, body, string(again), "the body is left readable")

	_, err = v.VerifyRequest(request("evt-2", body))
	require.ErrorIs(t, err, webhooks.ErrUnverified, "signed, but the body is another event's")

	r = request("evt-1", body)
	r.Body = io.NopCloser(bytes.NewReader([]byte(strings.Replace(body, "ex-1", "ex-2", 1))))
	_, err = v.VerifyRequest(r)
	require.ErrorIs(t, err, webhooks.ErrUnverified)
}

// readCounter is a request body that counts the bytes read from it.
type readCounter struct {
	r     io.Reader
	reads int
	bytes int
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.reads++
	c.bytes += n
	return n, err
}

func (c *readCounter) Close() error { return nil }

// TestVerifyRequestChecksHeadersFirst: a request that is no delivery — a header missing, a
// timestamp out of the tolerance, no signature — is refused before any of its body is read, and
// a body over the Verifier's MaxBodyBytes is refused after reading one byte more than it.
func TestVerifyRequestChecksHeadersFirst(t *testing.T) {
	t.Parallel()
	s := secret(t)
	now := time.Now()
	for _, tc := range []struct {
		name   string
		change func(h http.Header)
		want   string
	}{
		{"no signature headers at all", func(h http.Header) {
			h.Del(webhooks.HeaderID)
			h.Del(webhooks.HeaderTimestamp)
			h.Del(webhooks.HeaderSignature)
		}, "no webhook-id"},
		{"no webhook-signature", func(h http.Header) { h.Del(webhooks.HeaderSignature) }, "no webhook-signature"},
		{"an empty webhook-signature", func(h http.Header) { h.Set(webhooks.HeaderSignature, " ") }, "no webhook-signature"},
		{"no webhook-timestamp", func(h http.Header) { h.Del(webhooks.HeaderTimestamp) }, "no webhook-timestamp"},
		{"a timestamp out of the tolerance", func(h http.Header) {
			h.Set(webhooks.HeaderTimestamp, webhooks.Timestamp(now.Add(-time.Hour)))
		}, "webhook-timestamp is 1h0m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &readCounter{r: strings.NewReader(body)}
			r := httptest.NewRequest(http.MethodPost, "/webhook", nil)
			r.Body = b
			require.NoError(t, webhooks.SetHeaders(r.Header, []string{s}, "evt-1", now, []byte(body)))
			tc.change(r.Header)
			_, err := webhooks.Verifier{Secrets: []string{s}}.VerifyRequest(r)
			require.ErrorIs(t, err, webhooks.ErrUnverified)
			require.Contains(t, err.Error(), tc.want)
			require.Zero(t, b.reads, "the body was not read")
		})
	}

	t.Run("a body over MaxBodyBytes", func(t *testing.T) {
		t.Parallel()
		b := &readCounter{r: strings.NewReader(body + strings.Repeat(" ", 1<<20))}
		r := httptest.NewRequest(http.MethodPost, "/webhook", nil)
		r.Body = b
		require.NoError(t, webhooks.SetHeaders(r.Header, []string{s}, "evt-1", now, []byte(body)))
		_, err := webhooks.Verifier{Secrets: []string{s}, MaxBodyBytes: 64}.VerifyRequest(r)
		require.ErrorIs(t, err, webhooks.ErrUnverified)
		require.Contains(t, err.Error(), "larger than 64 bytes")
		require.Equal(t, 65, b.bytes, "the limit and one byte more")

		r = httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(body))
		require.NoError(t, webhooks.SetHeaders(r.Header, []string{s}, "evt-1", now, []byte(body)))
		_, err = webhooks.Verifier{Secrets: []string{s}, MaxBodyBytes: int64(len(body))}.VerifyRequest(r)
		require.NoError(t, err, "a body of exactly MaxBodyBytes")
	})
}
