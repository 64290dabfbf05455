package platformtoken

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
)

// testReq is the request the tests' tokens are signed for.
var testReq = &adapterv1.ExecuteRequest{ExecutionId: "e1", Attempt: 3, Capability: "c"}

func newKey(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := Generate()
	require.NoError(t, err)
	return pub, priv
}

func TestSignVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	pub, priv := newKey(t)
	s := NewSigner(priv)
	v, err := NewVerifier("adp", []ed25519.PublicKey{pub})
	require.NoError(t, err)
	deadline := time.Now().Add(5 * time.Second)
	call := Call{AdapterID: "adp", ExecutionID: "e1", Attempt: 3, Method: "/m", Request: testReq, Deadline: deadline}
	tok, err := s.Sign(call)
	require.NoError(t, err)

	c, err := v.Verify(tok, call)
	require.NoError(t, err)
	require.Equal(t, Issuer, c.Issuer)
	require.Equal(t, "e1", c.Subject)
	require.Equal(t, []string{"adp"}, []string(c.Audience))
	require.EqualValues(t, 3, c.Attempt)
	require.Equal(t, "/m", c.Method)
	require.NotEmpty(t, c.ID)
	// Expires at the call's deadline plus the skew allowance (NumericDate keeps whole seconds).
	require.WithinDuration(t, deadline.Add(Skew), c.ExpiresAt.Time, time.Second)

	// A call without a near deadline gets a token of Lifetime.
	tok, err = s.Sign(Call{AdapterID: "adp", ExecutionID: "e1", Attempt: 3, Method: "/m", Request: testReq, Deadline: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	c, err = v.Verify(tok, call)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(Lifetime+Skew), c.ExpiresAt.Time, 2*time.Second)
}

func TestVerifyExpiresOnTheVerifiersClock(t *testing.T) {
	t.Parallel()
	pub, priv := newKey(t)
	s := NewSigner(priv)
	v, err := NewVerifier("adp", []ed25519.PublicKey{pub})
	require.NoError(t, err)
	call := Call{AdapterID: "adp", ExecutionID: "e1", Attempt: 1, Method: "/m", Request: testReq, Deadline: time.Now().Add(time.Second)}
	tok, err := s.Sign(call)
	require.NoError(t, err)
	// Within the skew allowance after the deadline: still taken (the adapter's clock ahead).
	v.now = func() time.Time { return time.Now().Add(Skew - 2*time.Second) }
	_, err = v.Verify(tok, call)
	require.NoError(t, err)
	tok, err = s.Sign(call)
	require.NoError(t, err)
	v.now = func() time.Time { return time.Now().Add(Skew + 3*time.Second) }
	_, err = v.Verify(tok, call)
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorIs(t, err, ErrInvalid)
}

// TestReplayCacheForgetsExpiredTokens: the ids of accepted tokens are kept only while the tokens
// could still be accepted, so the cache does not grow without bound.
func TestReplayCacheForgetsExpiredTokens(t *testing.T) {
	t.Parallel()
	pub, priv := newKey(t)
	s := NewSigner(priv)
	v, err := NewVerifier("adp", []ed25519.PublicKey{pub})
	require.NoError(t, err)
	call := Call{AdapterID: "adp", ExecutionID: "e1", Attempt: 1, Method: "/m", Request: testReq, Deadline: time.Now().Add(time.Second)}
	for range 3 {
		tok, err := s.Sign(call)
		require.NoError(t, err)
		_, err = v.Verify(tok, call)
		require.NoError(t, err)
	}
	require.Len(t, v.seen, 3)
	v.now = func() time.Time { return time.Now().Add(time.Hour) }
	_, err = v.Verify("x", call) // malformed: refused before the cache, which it does not prune
	require.Error(t, err)
	require.True(t, v.firstUse("fresh", time.Now().Add(2*time.Hour)))
	require.Len(t, v.seen, 1, "expired ids pruned")
}

func TestKeyIDIsTheJWKThumbprint(t *testing.T) {
	t.Parallel()
	// RFC 8037 appendix A.3: the thumbprint of its example Ed25519 key.
	x, err := base64.RawURLEncoding.DecodeString("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
	require.NoError(t, err)
	require.Equal(t, "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k", KeyID(ed25519.PublicKey(x)))
}

func TestParseKeys(t *testing.T) {
	t.Parallel()
	pub, priv := newKey(t)
	pub2, _ := newKey(t)

	got, err := ParsePrivateKey(EncodePrivateKey(priv) + "\n")
	require.NoError(t, err)
	require.True(t, priv.Equal(got))
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	got, err = ParsePrivateKey(string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
	require.NoError(t, err)
	require.True(t, priv.Equal(got))
	for _, bad := range []string{"", "abc", base64.StdEncoding.EncodeToString([]byte("short")),
		"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"} {
		_, err := ParsePrivateKey(bad)
		require.Error(t, err, "%q", bad)
	}

	keys, err := ParsePublicKeys(EncodePublicKey(pub) + ", " + EncodePublicKey(pub2))
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.True(t, pub.Equal(keys[0]) && pub2.Equal(keys[1]))
	var pems []byte
	for _, k := range []ed25519.PublicKey{pub, pub2} {
		der, err := x509.MarshalPKIXPublicKey(k)
		require.NoError(t, err)
		pems = append(pems, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	keys, err = ParsePublicKeys(string(pems))
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.True(t, pub2.Equal(keys[1]))
	for _, bad := range []string{"", " , ", "abc", EncodePrivateKey(priv) + "x", string(pems) + "junk"} {
		_, err := ParsePublicKeys(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestConfigsNameTheVariable(t *testing.T) {
	t.Parallel()
	pub, priv := newKey(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "signing.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(EncodePrivateKey(priv)+"\n"), 0o600))

	s, err := SignerConfig{SigningKeyFile: keyFile}.Signer()
	require.NoError(t, err)
	require.Equal(t, KeyID(pub), s.KeyID())
	_, err = SignerConfig{SigningKey: EncodePrivateKey(priv)}.Signer()
	require.NoError(t, err)
	for cfg, name := range map[SignerConfig]string{
		{}: "INTEGRATIONS_PLATFORM_SIGNING_KEY or INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE",
		{SigningKey: "x", SigningKeyFile: keyFile}:      "set only one",
		{SigningKey: "not-a-key"}:                       "INTEGRATIONS_PLATFORM_SIGNING_KEY:",
		{SigningKeyFile: filepath.Join(dir, "missing")}: "INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE:",
	} {
		err := cfg.Validate()
		require.ErrorContains(t, err, name)
		require.NotContains(t, err.Error(), "not-a-key", "the value is not echoed")
	}

	keys, err := PublicKeysConfig{PublicKeys: EncodePublicKey(pub)}.Keys()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	for cfg, name := range map[PublicKeysConfig]string{
		{}:                          "INTEGRATIONS_PLATFORM_PUBLIC_KEYS or INTEGRATIONS_PLATFORM_PUBLIC_KEYS_FILE",
		{PublicKeys: "nope"}:        "INTEGRATIONS_PLATFORM_PUBLIC_KEYS:",
		{PublicKeysFile: "/nope/x"}: "INTEGRATIONS_PLATFORM_PUBLIC_KEYS_FILE:",
	} {
		require.ErrorContains(t, cfg.Validate(), name)
	}
}

// FuzzVerify: no input makes the verifier panic or accept a token it did not see signed.
func FuzzVerify(f *testing.F) {
	pub, priv := newKey(f)
	call := Call{AdapterID: "adp", ExecutionID: "e1", Attempt: 1, Method: "/m", Request: testReq, Deadline: time.Now().Add(time.Hour)}
	tok, err := NewSigner(priv).Sign(call)
	require.NoError(f, err)
	f.Add(tok)
	f.Add("")
	f.Add("a.b.c")
	f.Add(strings.Join(strings.Split(tok, ".")[:2], ".") + ".")
	f.Add(`eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJpc3MiOiJpbnRlZ3JhdGlvbnMtcGxhdGZvcm0ifQ.`)
	f.Fuzz(func(t *testing.T, s string) {
		v, err := NewVerifier("adp", []ed25519.PublicKey{pub})
		require.NoError(t, err)
		c, err := v.Verify(s, call)
		if err == nil {
			// Only the one token signed above verifies; anything else is refused.
			require.Equal(t, tok, s)
			require.Equal(t, "e1", c.Subject)
			return
		}
		require.True(t, errors.Is(err, ErrRefused), "%v", err)
	})
}

// BenchmarkSignVerify is the token's cost on one call: signed by the platform, checked by the
// adapter.
func BenchmarkSignVerify(b *testing.B) {
	pub, priv := newKey(b)
	s := NewSigner(priv)
	v, err := NewVerifier("adp", []ed25519.PublicKey{pub})
	require.NoError(b, err)
	call := Call{AdapterID: "adp", ExecutionID: "01a233f8-ef43-77bc-8182-ce8f53992118", Attempt: 1, Method: "/integrations.adapter.v1.AdapterService/Execute", Request: testReq,
		Deadline: time.Now().Add(time.Minute)}
	for b.Loop() {
		tok, err := s.Sign(call)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.Verify(tok, call); err != nil {
			b.Fatal(err)
		}
	}
}
