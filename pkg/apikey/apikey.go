// Package apikey is the format of the API keys the platform generates:
//
//	igk_<key id: 12 base62>_<secret: 43 base62><checksum: 6 base62>
//
// The prefix makes a leaked key recognisable (and lets a secret scanner look for it); the key id
// is public and is how the gateway finds the key's row; the secret carries 256 bits of
// randomness (62^43 > 2^256); the checksum is the CRC-32 (IEEE) of everything before it, so a
// scanner can tell a real key from a lookalike offline and the gateway refuses a mistyped key
// without reading the database. GitHub's tokens follow the same scheme.
//
// Keys are stored as Hash(token): SHA-256 of the whole token. The token holds its key id, which is
// unique per key, so equal secrets never hash alike; and with 256 random bits a slow KDF adds
// nothing against guessing (docs/decisions.md, "API keys with a lifecycle").
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
)

// Prefix starts every generated key.
const Prefix = "igk_"

// Lengths of the parts, in base62 characters.
const (
	IDLen       = 12
	SecretLen   = 43
	ChecksumLen = 6
	// Len is the length of a whole key.
	Len = len(Prefix) + IDLen + 1 + SecretLen + ChecksumLen
	// MaxTokenLen bounds a key of any kind (a catalog's chosen key too): a longer token is refused
	// before it is hashed.
	MaxTokenLen = 512
)

const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// Errors of Parse.
var (
	// ErrNotGenerated means the token does not claim to be a generated key (no prefix): it may be
	// a key an operator chose, declared in the catalog.
	ErrNotGenerated = errors.New("not a generated API key")
	// ErrMalformed means the token claims to be a generated key but is not one: a typo, a
	// truncation or a forgery. It never matches a stored key.
	ErrMalformed = errors.New("malformed API key")
)

// Key is a parsed generated key.
type Key struct {
	// ID is the key's public id.
	ID string
	// Token is the whole key, as the client sends it.
	Token string
}

// Generate returns a new key from crypto/rand.
func Generate() (Key, error) {
	id, err := randomBase62(IDLen)
	if err != nil {
		return Key{}, err
	}
	secret, err := randomBase62(SecretLen)
	if err != nil {
		return Key{}, err
	}
	body := Prefix + id + "_" + secret
	return Key{ID: id, Token: body + checksum(body)}, nil
}

// Parse checks a token's form and checksum. A token without the prefix is ErrNotGenerated; one
// with the prefix that is not exactly a generated key (length, characters, checksum) is
// ErrMalformed. Parse reads only the token: it never needs the database.
func Parse(token string) (Key, error) {
	if !strings.HasPrefix(token, Prefix) {
		return Key{}, ErrNotGenerated
	}
	if len(token) != Len {
		return Key{}, ErrMalformed
	}
	idEnd := len(Prefix) + IDLen
	if token[idEnd] != '_' {
		return Key{}, ErrMalformed
	}
	for i := len(Prefix); i < len(token); i++ {
		if i != idEnd && !isBase62(token[i]) {
			return Key{}, ErrMalformed
		}
	}
	body, sum := token[:Len-ChecksumLen], token[Len-ChecksumLen:]
	if checksum(body) != sum {
		return Key{}, ErrMalformed
	}
	return Key{ID: token[len(Prefix):idEnd], Token: token}, nil
}

// Hash is how keys are stored: SHA-256 of the whole token. Keys an operator chose (catalog
// bootstrap keys) are hashed the same way, so one column serves both.
func Hash(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// UnusableHash is a stored hash no token has: the SHA-256 of random bytes nobody keeps. A revoked
// catalog key's hash in applications.api_key_hash (the column gateways of the release before
// migration 00009 read) is overwritten with it, so that the key stays dead in a rolling upgrade,
// a rollback or after a migrate down.
func UnusableHash() ([]byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("random bytes for an unusable hash: %w", err)
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// PrintableASCII reports whether s holds only printable ASCII (0x20–0x7e): the only bytes a key
// of any kind may hold (an HTTP header carries nothing else faithfully). Anything else is refused
// before any lookup. A chosen catalog key may hold spaces; a generated one never does.
func PrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func checksum(body string) string {
	n := crc32.ChecksumIEEE([]byte(body))
	var out [ChecksumLen]byte
	for i := ChecksumLen - 1; i >= 0; i-- {
		out[i] = alphabet[n%62]
		n /= 62
	}
	return string(out[:])
}

// randomBase62 returns n characters drawn uniformly from the alphabet: bytes of 248 and more are
// rejected so that each of the 62 characters is equally likely (248 = 4·62).
func randomBase62(n int) (string, error) {
	out := make([]byte, 0, n)
	buf := make([]byte, n+n/2)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("generate API key: %w", err)
		}
		for _, b := range buf {
			if b < 248 && len(out) < n {
				out = append(out, alphabet[b%62])
			}
		}
	}
	return string(out), nil
}

func isBase62(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
}

// Strength rules of a secret an operator chooses (the admin token, a catalog key): what
// WeakSecret calls random-looking.
const (
	MinSecretLen      = 32
	MinSecretDistinct = 10
)

// WeakSecret says why s does not look like 32 random bytes, or "" if it does: it must be at least
// MinSecretLen characters, hold at least MinSecretDistinct distinct characters, and no character
// may make up more than a quarter of it. A rough test, not an entropy measure: it passes 32 or
// more characters of base64 or hex from a random source (`head -c 24 /dev/urandom | base64`, `keys
// generate`) and refuses the short, the repetitive and the typed-by-hand ("dev-admin-token").
func WeakSecret(s string) string {
	if len(s) < MinSecretLen {
		return fmt.Sprintf("%d characters, fewer than %d", len(s), MinSecretLen)
	}
	var counts [256]int
	distinct, most := 0, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if counts[c] == 0 {
			distinct++
		}
		counts[c]++
		most = max(most, counts[c])
	}
	if distinct < MinSecretDistinct {
		return fmt.Sprintf("only %d distinct characters, fewer than %d", distinct, MinSecretDistinct)
	}
	if most*4 > len(s) {
		return "one character makes up more than a quarter of it"
	}
	return ""
}
