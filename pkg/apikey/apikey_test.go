package apikey

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGenerateParseRoundTrip(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		k, err := Generate()
		require.NoError(t, err)
		require.Len(t, k.Token, Len)
		require.True(t, strings.HasPrefix(k.Token, Prefix+k.ID+"_"), k.Token)
		require.Len(t, k.ID, IDLen)
		require.True(t, PrintableASCII(k.Token))
		got, err := Parse(k.Token)
		require.NoError(t, err)
		require.Equal(t, k, got)
		require.False(t, seen[k.ID], "key ids repeat")
		seen[k.ID] = true
	}
}

func TestSecretUsesTheWholeAlphabet(t *testing.T) {
	// 200 secrets of 43 characters: every one of the 62 characters turns up (a bias to a subset,
	// e.g. a modulo bug, would leave some out).
	counts := map[byte]int{}
	for range 200 {
		k, err := Generate()
		require.NoError(t, err)
		for i := len(Prefix) + IDLen + 1; i < Len-ChecksumLen; i++ {
			counts[k.Token[i]]++
		}
	}
	require.Len(t, counts, 62)
}

func TestChecksumCatchesEveryChangedCharacter(t *testing.T) {
	k, err := Generate()
	require.NoError(t, err)
	for i := len(Prefix); i < Len; i++ {
		if k.Token[i] == '_' {
			continue
		}
		for _, c := range []byte(alphabet) {
			if c == k.Token[i] {
				continue
			}
			b := []byte(k.Token)
			b[i] = c
			_, err := Parse(string(b))
			require.ErrorIs(t, err, ErrMalformed, "position %d changed to %q", i, c)
		}
	}
	// Two characters swapped.
	b := []byte(k.Token)
	for i := len(Prefix) + IDLen + 1; i+1 < Len; i++ {
		if b[i] != b[i+1] {
			b[i], b[i+1] = b[i+1], b[i]
			break
		}
	}
	_, err = Parse(string(b))
	require.ErrorIs(t, err, ErrMalformed)
}

func TestParseRefusesWhatIsNotAGeneratedKey(t *testing.T) {
	k, err := Generate()
	require.NoError(t, err)
	for name, tok := range map[string]string{
		"truncated":          k.Token[:Len-1],
		"extended":           k.Token + "0",
		"separator moved":    Prefix + k.Token[len(Prefix)+1:len(Prefix)+IDLen+1] + "_" + k.Token[len(Prefix)+IDLen+1:],
		"non-base62":         k.Token[:20] + "-" + k.Token[21:],
		"NUL":                k.Token[:20] + "\x00" + k.Token[21:],
		"non-ASCII":          k.Token[:20] + "é" + k.Token[22:],
		"trailing newline":   k.Token[:Len-1] + "\n",
		"prefix only":        Prefix,
		"uppercase checksum": k.Token[:Len-ChecksumLen] + strings.ToUpper(k.Token[Len-ChecksumLen:]) + "",
	} {
		if tok == k.Token {
			continue // the checksum happened to have no lower-case letter
		}
		_, err := Parse(tok)
		require.ErrorIs(t, err, ErrMalformed, name)
	}
	for _, tok := range []string{"", "test-api-key-0123456789", "IGK_" + k.Token[4:], "ghp_abc"} {
		_, err := Parse(tok)
		require.ErrorIs(t, err, ErrNotGenerated, tok)
	}
}

func TestHashIsSHA256OfTheWholeToken(t *testing.T) {
	// The catalog's api_key_sha256 is documented as `printf %s KEY | sha256sum`.
	require.Equal(t, "a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3", hexOf(Hash("123")))
	a, _ := Generate()
	b, _ := Generate()
	require.False(t, bytes.Equal(Hash(a.Token), Hash(b.Token)))
}

func TestPrintableASCII(t *testing.T) {
	require.True(t, PrintableASCII("abc~! x"))
	for _, s := range []string{"a\tb", "a\x00", "é", "\x7f", "a\n"} {
		require.False(t, PrintableASCII(s), "%q", s)
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// FuzzParseKey: Parse never panics, accepts only tokens of the exact form with a valid checksum,
// and what it accepts is printable ASCII that parses back to the same key.
func FuzzParseKey(f *testing.F) {
	k, _ := Generate()
	f.Add(k.Token)
	f.Add("igk_000000000000_0000000000000000000000000000000000000000000000000")
	f.Add("test-api-key-0123456789")
	f.Add("igk_")
	f.Add("")
	f.Add(k.Token[:Len-1] + "\x00")
	f.Fuzz(func(t *testing.T, tok string) {
		got, err := Parse(tok)
		if err != nil {
			if err != ErrMalformed && err != ErrNotGenerated {
				t.Fatalf("unexpected error %v", err)
			}
			if err == ErrNotGenerated && strings.HasPrefix(tok, Prefix) {
				t.Fatalf("a prefixed token reported as not generated: %q", tok)
			}
			return
		}
		if got.Token != tok || len(tok) != Len || !PrintableASCII(tok) || !strings.HasPrefix(tok, Prefix+got.ID+"_") {
			t.Fatalf("accepted %q as %+v", tok, got)
		}
		if checksum(tok[:Len-ChecksumLen]) != tok[Len-ChecksumLen:] {
			t.Fatalf("accepted a bad checksum: %q", tok)
		}
	})
}

func TestUnusableHashIsFreshEachTime(t *testing.T) {
	a, err := UnusableHash()
	require.NoError(t, err)
	b, err := UnusableHash()
	require.NoError(t, err)
	require.Len(t, a, 32, "the size of a stored hash (the column's CHECK)")
	require.NotEqual(t, a, b)
	require.NotEqual(t, Hash(""), a)
}

func TestWeakSecret(t *testing.T) {
	generated, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		secret string
		weak   bool
	}{
		{generated.Token, false},
		{"q8ZxW2vN0pL5tR7yB1cD4fG6hJ9kM3sA", false},                                 // 32 base64 characters
		{"0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0", false}, // 64 hex
		{"dev-admin-token", true},
		{"dev-api-key-change-me", true},
		{"q8ZxW2vN0pL5tR7yB1cD4fG6hJ9kM3s", true}, // 31
		{"abababababababababababababababababab", true},
		{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa0123456789", true},
	} {
		if got := WeakSecret(tc.secret) != ""; got != tc.weak {
			t.Errorf("WeakSecret(%q) weak = %v, want %v (%s)", tc.secret, got, tc.weak, WeakSecret(tc.secret))
		}
	}
}
