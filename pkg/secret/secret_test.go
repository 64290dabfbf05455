package secret_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/secret"
)

const keyVar = "INTEGRATIONS_SECRET_KEY"

func newKey(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.StdEncoding.EncodeToString(b)
}

func newBox(t *testing.T, primary string, previous ...string) *secret.Box {
	t.Helper()
	b, err := secret.NewBox(keyVar, primary, previous...)
	require.NoError(t, err)
	return b
}

func TestSealOpenRoundTrip(t *testing.T) {
	t.Parallel()
	box := newBox(t, newKey(t))

	for _, plaintext := range [][]byte{[]byte("whsec_c2lnbmluZyBzZWNyZXQ="), {}, bytes.Repeat([]byte{0}, 4096)} {
		sealed, err := box.Seal(plaintext)
		require.NoError(t, err)
		if len(plaintext) > 8 {
			require.False(t, bytes.Contains(sealed, plaintext), "the sealed value must not contain the plaintext")
		}
		got, err := box.Open(sealed)
		require.NoError(t, err)
		require.Equal(t, len(plaintext), len(got))
		require.True(t, bytes.Equal(plaintext, got))
	}

	a, err := box.Seal([]byte("same"))
	require.NoError(t, err)
	b, err := box.Seal([]byte("same"))
	require.NoError(t, err)
	require.NotEqual(t, a, b, "each seal takes a fresh nonce")
}

func TestRotation(t *testing.T) {
	t.Parallel()
	oldKey, currentKey := newKey(t), newKey(t)

	sealedOld, err := newBox(t, oldKey).Seal([]byte("sealed before the rotation"))
	require.NoError(t, err)

	rotated := newBox(t, currentKey, oldKey)
	got, err := rotated.Open(sealedOld)
	require.NoError(t, err, "the previous key still opens what it sealed")
	require.Equal(t, "sealed before the rotation", string(got))

	sealedNew, err := rotated.Seal([]byte("sealed after the rotation"))
	require.NoError(t, err)
	got, err = newBox(t, currentKey).Open(sealedNew)
	require.NoError(t, err, "a rotated box seals with its primary key")
	require.Equal(t, "sealed after the rotation", string(got))

	_, err = newBox(t, currentKey).Open(sealedOld)
	require.ErrorIs(t, err, secret.ErrUnknownKey, "once the old key is dropped, its values no longer open")

	// An empty previous key (an unset variable) is ignored rather than an error.
	_, err = secret.NewBox(keyVar, currentKey, "")
	require.NoError(t, err)
}

func TestOpenRefusesTamperedValues(t *testing.T) {
	t.Parallel()
	box := newBox(t, newKey(t))
	sealed, err := box.Seal([]byte("whsec_c2lnbmluZyBzZWNyZXQ="))
	require.NoError(t, err)

	tests := []struct {
		name   string
		tamper func([]byte) []byte
	}{
		{"last byte (tag) flipped", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }},
		{"ciphertext byte flipped", func(b []byte) []byte { b[4+12] ^= 0x80; return b }},
		{"nonce byte flipped", func(b []byte) []byte { b[4] ^= 1; return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
		{"key id only", func(b []byte) []byte { return b[:4] }},
		{"empty", func([]byte) []byte { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := box.Open(tt.tamper(bytes.Clone(sealed)))
			require.Error(t, err)
		})
	}

	t.Run("key id changed", func(t *testing.T) {
		t.Parallel()
		b := bytes.Clone(sealed)
		b[0] ^= 1
		_, err := box.Open(b)
		require.ErrorIs(t, err, secret.ErrUnknownKey)
	})
}

func TestNewBoxErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	short := base64.StdEncoding.EncodeToString(make([]byte, 16))
	long := base64.StdEncoding.EncodeToString(make([]byte, 33))

	tests := []struct {
		name     string
		primary  string
		previous []string
		want     string
	}{
		{"missing", "", nil, "missing"},
		{"16-byte key", short, nil, "key 1 must be 32 bytes"},
		{"33-byte key", long, nil, "key 1 must be 32 bytes"},
		{"not base64", "not base64 at all!", nil, "key 1 must be 32 bytes"},
		{"bad previous key", newKey(t), []string{short}, "key 2 must be 32 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := secret.NewBox(keyVar, tt.primary, tt.previous...)
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), keyVar+": "), "error %q must name %s", err, keyVar)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestNewToken(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		tok, hash, err := secret.NewToken("cbt_")
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(tok, "cbt_"))
		require.False(t, seen[tok], "tokens must not repeat")
		seen[tok] = true

		want := sha256.Sum256([]byte(tok))
		require.Equal(t, want[:], hash)
		require.Equal(t, hash, secret.Hash(tok))

		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(tok, "cbt_"))
		require.NoError(t, err, "the token is URL-safe base64")
		require.Len(t, raw, 32)
	}
}
