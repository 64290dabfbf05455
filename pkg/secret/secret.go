// Package secret seals secrets that must be used in clear later (webhook signing secrets) with
// the deployment's key, AES-256-GCM, so that a database dump alone does not reveal them. A sealed
// value names the key that sealed it, so keys can be rotated: seal with the new key, keep the
// previous one to open what is not yet re-sealed.
package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

const keyIDLen = 4

// Box seals with its primary key and opens with any of its keys.
type Box struct {
	primary [keyIDLen]byte
	aeads   map[[keyIDLen]byte]cipher.AEAD
}

// NewBox builds a Box from base64-encoded 32-byte keys: the primary first, then previous keys.
// name is the variable the keys came from, for error messages.
func NewBox(name string, primary string, previous ...string) (*Box, error) {
	b := &Box{aeads: map[[keyIDLen]byte]cipher.AEAD{}}
	for i, enc := range append([]string{primary}, previous...) {
		if enc == "" {
			if i == 0 {
				return nil, fmt.Errorf("%s: missing; generate one with: head -c 32 /dev/urandom | base64", name)
			}
			continue
		}
		key, err := base64.StdEncoding.DecodeString(enc)
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("%s: key %d must be 32 bytes, base64-encoded", name, i+1)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		sum := sha256.Sum256(key)
		var id [keyIDLen]byte
		copy(id[:], sum[:keyIDLen])
		if i == 0 {
			b.primary = id
		}
		b.aeads[id] = aead
	}
	return b, nil
}

// Seal encrypts plaintext with the primary key.
func (b *Box) Seal(plaintext []byte) ([]byte, error) {
	aead := b.aeads[b.primary]
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: nonce: %w", err)
	}
	out := append(append(b.primary[:0:0], b.primary[:]...), nonce...)
	return aead.Seal(out, nonce, plaintext, b.primary[:]), nil
}

// ErrUnknownKey means the value was sealed with a key this Box does not hold.
var ErrUnknownKey = errors.New("sealed with a key that is not configured")

// Open decrypts a value sealed by Seal with any configured key.
func (b *Box) Open(sealed []byte) ([]byte, error) {
	if len(sealed) < keyIDLen+12 {
		return nil, errors.New("open sealed secret: too short")
	}
	var id [keyIDLen]byte
	copy(id[:], sealed[:keyIDLen])
	aead, ok := b.aeads[id]
	if !ok {
		return nil, fmt.Errorf("open sealed secret: %w", ErrUnknownKey)
	}
	rest := sealed[keyIDLen:]
	nonce, ct := rest[:aead.NonceSize()], rest[aead.NonceSize():]
	pt, err := aead.Open(nil, nonce, ct, id[:])
	if err != nil {
		return nil, fmt.Errorf("open sealed secret: %w", err)
	}
	return pt, nil
}

// Hash is how API keys, adapter credentials and callback tokens are stored and looked up:
// SHA-256. They are long random tokens, so a slow password hash would add nothing but latency.
func Hash(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// NewToken returns a random URL-safe token with the given prefix, and its Hash.
func NewToken(prefix string) (string, []byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("generate token: %w", err)
	}
	tok := prefix + base64.RawURLEncoding.EncodeToString(b)
	return tok, Hash(tok), nil
}
