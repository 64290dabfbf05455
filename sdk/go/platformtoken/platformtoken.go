// Package platformtoken is the platform's credential on its calls to adapters: a short-lived JWT
// signed with Ed25519 (EdDSA) that binds one call to one adapter (aud), one execution (sub), one
// attempt (att), one RPC (rpc) and one request (req, a digest of the request's fields, see
// Digest). The platform's services that call adapters sign with a private key; an adapter,
// through the adapter SDK (package adapter of this module), verifies with one or more public keys
// — several during a rotation. Tokens are used instead of mTLS because adapters often sit behind
// TLS-terminating proxies that drop client certificates, and an adapter then needs only a public
// key, no CA.
//
// The adapter protocol (docs/adapter-protocol.md in the repository) specifies the token, the
// request digest and the refusal marker for adapters in other languages, with test vectors
// (testdata/vectors.json in this package).
//
// A key's id (the token's kid header) is its RFC 7638 JWK thumbprint, so a key pair needs no
// separate name: an adapter given a list of public keys finds the one a token names.
package platformtoken

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/protobuf/proto"
)

// Header is the gRPC metadata key the token travels in. Not `authorization`: proxies and
// platforms in front of an adapter (API gateways, identity-aware proxies) often consume or
// replace that header with their own credential.
const Header = "integrations-platform-token"

// Issuer is every platform token's iss. A deployment is told apart by its key, not by a name.
const Issuer = "integrations-platform"

// Lifetime and Skew bound a token: it expires at the call's deadline or Lifetime after it was
// signed, whichever is sooner, plus Skew for the adapter's clock running ahead of ours. The token
// is checked once, when the call arrives, so it need not outlive the time the call takes to
// reach the adapter; a short life bounds how long a captured token can be replayed.
const (
	Lifetime = time.Minute
	Skew     = 30 * time.Second
)

// Claims are a platform token's claims.
type Claims struct {
	jwt.RegisteredClaims
	// Attempt is the attempt number the call is for.
	Attempt int32 `json:"att"`
	// Method is the full gRPC method name the token was signed for.
	Method string `json:"rpc"`
	// Request is the Digest of the request the token was signed for.
	Request string `json:"req"`
}

// Call is what one token is signed for.
type Call struct {
	AdapterID   string
	ExecutionID string
	Attempt     int32
	// Method is the full gRPC method, e.g. /integrations.adapter.v1.AdapterService/Execute.
	Method string
	// Deadline is the call's deadline (zero: none).
	Deadline time.Time
	// Request is the call's request (an *adapterv1.ExecuteRequest or *adapterv1.CancelRequest),
	// required: the token is bound to its Digest, and Verify recomputes it from the request
	// received. It must not change after Sign.
	Request proto.Message
}

// KeyID is the RFC 7638 JWK thumbprint of an Ed25519 public key (base64url, unpadded).
func KeyID(pub ed25519.PublicKey) string {
	// The canonical JWK: members in lexicographic order, no whitespace.
	jwk := `{"crv":"Ed25519","kty":"OKP","x":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}`
	sum := sha256.Sum256([]byte(jwk))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// Signer signs platform tokens with one private key.
type Signer struct {
	key ed25519.PrivateKey
	kid string
	now func() time.Time
	// rand is where token ids come from; the test vectors' generator makes it fixed.
	rand io.Reader
}

// NewSigner returns a Signer for key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{key: key, kid: KeyID(key.Public().(ed25519.PublicKey)), now: time.Now, rand: rand.Reader}
}

// KeyID is the id of the Signer's key, as its tokens' kid header names it.
func (s *Signer) KeyID() string { return s.kid }

// PublicKey is the public half of the Signer's key, for adapters.
func (s *Signer) PublicKey() (ed25519.PublicKey, string) {
	return s.key.Public().(ed25519.PublicKey), s.kid
}

// Sign returns a token for c.
func (s *Signer) Sign(c Call) (string, error) { return s.SignAt(c, s.now()) }

// SignAt returns a token for c signed as if the clock read now: its iat is now and its expiry
// counts from it. The platform signs with Sign; a conformance check of an adapter signs an expired
// token with a past now, to see the adapter refuse it.
func (s *Signer) SignAt(c Call, now time.Time) (string, error) {
	exp := now.Add(Lifetime)
	if !c.Deadline.IsZero() && c.Deadline.Before(exp) {
		exp = c.Deadline
	}
	digest, err := Digest(c.Request)
	if err != nil {
		return "", fmt.Errorf("sign platform token: %w", err)
	}
	jti := make([]byte, 16)
	if _, err := io.ReadFull(s.rand, jti); err != nil {
		return "", fmt.Errorf("token id: %w", err)
	}
	t := jwt.NewWithClaims(jwt.SigningMethodEdDSA, Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    Issuer,
			Subject:   c.ExecutionID,
			Audience:  jwt.ClaimStrings{c.AdapterID},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(exp.Add(Skew)),
			ID:        base64.RawURLEncoding.EncodeToString(jti),
		},
		Attempt: c.Attempt,
		Method:  c.Method,
		Request: digest,
	})
	t.Header["kid"] = s.kid
	signed, err := t.SignedString(s.key)
	if err != nil {
		return "", fmt.Errorf("sign platform token: %w", err)
	}
	return signed, nil
}

// Reasons a token is refused. Each is wrapped in ErrRefused; the message says which check failed
// and never quotes the token.
var (
	ErrRefused  = errors.New("platform token refused")
	ErrMissing  = errors.New("no platform token")
	ErrKey      = errors.New("token signed by an unknown key")
	ErrInvalid  = errors.New("token invalid (malformed, bad signature or expired)")
	ErrAudience = errors.New("token is for another adapter")
	ErrBinding  = errors.New("token is for another call (execution, attempt, method or request)")
	ErrReplayed = errors.New("token already used")
)

// The names of the checks a token can fail, as Check returns them and the refusal marker's check
// metadata carries them (the adapter protocol names them the same).
const (
	CheckMissing  = "missing"
	CheckKey      = "key"
	CheckInvalid  = "invalid"
	CheckAudience = "audience"
	CheckBinding  = "binding"
	CheckReplayed = "replayed"
)

// checks names each refusal reason.
var checks = []struct {
	err  error
	name string
}{
	{ErrMissing, CheckMissing}, {ErrKey, CheckKey}, {ErrInvalid, CheckInvalid},
	{ErrAudience, CheckAudience}, {ErrBinding, CheckBinding}, {ErrReplayed, CheckReplayed},
}

// Check names the check a refusal (an error of Verify) failed, for machine-readable reports (the
// SDK's refusal carries it): one of the Check constants; "" for an error that is no refusal.
func Check(err error) string {
	for _, c := range checks {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return ""
}

// Verifier checks platform tokens for one adapter.
type Verifier struct {
	keys     map[string]ed25519.PublicKey
	audience string
	now      func() time.Time

	// seen holds the ids of tokens accepted, until they expire: a captured token replayed to
	// this process is refused. (Replicas do not share it; the token's short life and its binding
	// to one attempt bound what a replay to another replica can do.)
	mu   sync.Mutex
	seen map[string]time.Time
	// pruned is when seen was last swept of expired ids: at most every pruneEvery, so that a busy
	// adapter does not walk the whole map on every call.
	pruned time.Time
}

// pruneEvery is how often the replay cache is swept of expired token ids.
const pruneEvery = time.Second

// NewVerifier returns a Verifier accepting tokens signed by any of keys and addressed to
// adapterID.
func NewVerifier(adapterID string, keys []ed25519.PublicKey) (*Verifier, error) {
	if adapterID == "" {
		return nil, errors.New("platform token verifier: the adapter id (the tokens' audience) is required")
	}
	if len(keys) == 0 {
		return nil, errors.New("platform token verifier: at least one platform public key is required")
	}
	v := &Verifier{keys: map[string]ed25519.PublicKey{}, audience: adapterID, now: time.Now, seen: map[string]time.Time{}}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("platform token verifier: a public key of %d bytes, want %d", len(k), ed25519.PublicKeySize)
		}
		v.keys[KeyID(k)] = k
	}
	return v, nil
}

// Verify checks token for call (its AdapterID is ignored: the Verifier's own is the audience;
// its Deadline is ignored; its Request is the request received) and returns its claims. A refusal wraps ErrRefused and one of the
// reasons above.
func (v *Verifier) Verify(token string, call Call) (*Claims, error) {
	if token == "" {
		return nil, refused(ErrMissing)
	}
	var claims Claims
	_, err := jwt.ParseWithClaims(token, &claims, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		k, ok := v.keys[kid]
		if !ok {
			return nil, ErrKey
		}
		return k, nil
	},
		jwt.WithValidMethods([]string{jwt.SigningMethodEdDSA.Alg()}),
		jwt.WithIssuer(Issuer),
		jwt.WithAudience(v.audience),
		// Tokens are issued with Skew added to their expiry: no leeway here on top.
		jwt.WithExpirationRequired(),
		// One encoding per token: no second spelling of the same signature slips past the replay check.
		jwt.WithStrictDecoding(),
		jwt.WithTimeFunc(v.now))
	switch {
	case errors.Is(err, ErrKey):
		return nil, refused(ErrKey)
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return nil, refused(ErrAudience)
	case err != nil:
		return nil, refused(ErrInvalid)
	case claims.Subject != call.ExecutionID || claims.Attempt != call.Attempt || claims.Method != call.Method:
		return nil, refused(ErrBinding)
	case !v.boundTo(&claims, call.Request):
		return nil, refused(ErrBinding)
	case claims.ID == "" || claims.IssuedAt == nil:
		return nil, refused(ErrInvalid)
	case claims.IssuedAt.After(v.now().Add(Skew)) || claims.ExpiresAt.Sub(claims.IssuedAt.Time) > Lifetime+Skew:
		// Signed on a clock far ahead, or for longer than the platform signs: refused, so that
		// no token lives longer than Lifetime+Skew whatever the signer's clock said.
		return nil, refused(ErrInvalid)
	}
	if !v.firstUse(claims.ID, claims.ExpiresAt.Time) {
		return nil, refused(ErrReplayed)
	}
	return &claims, nil
}

// boundTo reports whether claims were signed for req: its digest, recomputed here, is the req
// claim. (No constant-time compare: the digest is no secret, and the signature covers it.)
func (v *Verifier) boundTo(claims *Claims, req proto.Message) bool {
	digest, err := Digest(req)
	return err == nil && claims.Request != "" && claims.Request == digest
}

// firstUse records a token id until exp (plus the leeway it is accepted for), and reports
// whether it was not seen before.
func (v *Verifier) firstUse(jti string, exp time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	if now.Sub(v.pruned) >= pruneEvery {
		for id, until := range v.seen {
			if now.After(until) {
				delete(v.seen, id)
			}
		}
		v.pruned = now
	}
	if until, ok := v.seen[jti]; ok && !now.After(until) {
		return false
	}
	v.seen[jti] = exp.Add(Skew)
	return true
}

func refused(why error) error { return fmt.Errorf("%w: %w", ErrRefused, why) }

// Generate returns a new key pair.
func Generate() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate Ed25519 key: %w", err)
	}
	return pub, priv, nil
}

// EncodePrivateKey is the text form of a private key that ParsePrivateKey reads: the base64 of
// its 32-byte seed.
func EncodePrivateKey(k ed25519.PrivateKey) string {
	return base64.StdEncoding.EncodeToString(k.Seed())
}

// EncodePublicKey is the text form of a public key that ParsePublicKeys reads: base64 of its 32
// bytes.
func EncodePublicKey(k ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(k) }

// ParsePrivateKey reads a private key: a PEM "PRIVATE KEY" block (PKCS #8, as `openssl genpkey
// -algorithm ed25519` writes) or the base64 of the 32-byte seed (as EncodePrivateKey writes).
func ParsePrivateKey(text string) (ed25519.PrivateKey, error) {
	text = strings.TrimSpace(text)
	if strings.HasPrefix(text, "-----BEGIN") {
		block, _ := pem.Decode([]byte(text))
		if block == nil || block.Type != "PRIVATE KEY" {
			return nil, errors.New("not a PEM PRIVATE KEY block")
		}
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse PKCS #8 key: %w", err)
		}
		ek, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("a %T, not an Ed25519 key", k)
		}
		return ek, nil
	}
	seed, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("neither PEM nor the base64 of a %d-byte Ed25519 seed", ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// ParsePublicKeys reads one or more public keys: PEM "PUBLIC KEY" blocks (PKIX), or base64
// 32-byte keys separated by commas or white space.
func ParsePublicKeys(text string) ([]ed25519.PublicKey, error) {
	text = strings.TrimSpace(text)
	var keys []ed25519.PublicKey
	if strings.HasPrefix(text, "-----BEGIN") {
		rest := []byte(text)
		for {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if block.Type != "PUBLIC KEY" {
				return nil, fmt.Errorf("a PEM %q block, want PUBLIC KEY", block.Type)
			}
			k, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse public key %d: %w", len(keys)+1, err)
			}
			ek, ok := k.(ed25519.PublicKey)
			if !ok {
				return nil, fmt.Errorf("public key %d: a %T, not an Ed25519 key", len(keys)+1, k)
			}
			keys = append(keys, ek)
		}
		if strings.TrimSpace(string(rest)) != "" {
			return nil, errors.New("text after the last PEM block")
		}
	} else {
		for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
			b, err := base64.StdEncoding.DecodeString(f)
			if err != nil || len(b) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("public key %d: not the base64 of a %d-byte Ed25519 key", len(keys)+1, ed25519.PublicKeySize)
			}
			keys = append(keys, ed25519.PublicKey(b))
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no public key")
	}
	return keys, nil
}

// SignerConfig is the signing key's settings, for the services that call adapters.
type SignerConfig struct {
	// SigningKey is the private key itself (see ParsePrivateKey); SigningKeyFile a file holding
	// it (a mounted secret). Exactly one is set.
	SigningKey     string `env:"INTEGRATIONS_PLATFORM_SIGNING_KEY"`
	SigningKeyFile string `env:"INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE"`
}

// Signer reads the configured key. The error names the variable at fault.
func (c SignerConfig) Signer() (*Signer, error) {
	name, text := "INTEGRATIONS_PLATFORM_SIGNING_KEY", c.SigningKey
	switch {
	case c.SigningKey != "" && c.SigningKeyFile != "":
		return nil, errors.New("INTEGRATIONS_PLATFORM_SIGNING_KEY and INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE: set only one")
	case c.SigningKey == "" && c.SigningKeyFile == "":
		return nil, errors.New("INTEGRATIONS_PLATFORM_SIGNING_KEY or INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE: one is required " +
			"(the Ed25519 key that signs the platform's calls to adapters; `integrationsctl platform-key generate` makes one)")
	case c.SigningKeyFile != "":
		name = "INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE"
		b, err := os.ReadFile(c.SigningKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		text = string(b)
	}
	k, err := ParsePrivateKey(text)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return NewSigner(k), nil
}

// Validate checks that the key can be read.
func (c SignerConfig) Validate() error {
	_, err := c.Signer()
	return err
}

// PublicKeysConfig is the platform's public keys' settings, for an adapter (the dummy adapter
// reads them so; any adapter built on the SDK may).
type PublicKeysConfig struct {
	// PublicKeys are the keys themselves (see ParsePublicKeys); PublicKeysFile a file holding
	// them. Exactly one is set.
	PublicKeys     string `env:"INTEGRATIONS_PLATFORM_PUBLIC_KEYS"`
	PublicKeysFile string `env:"INTEGRATIONS_PLATFORM_PUBLIC_KEYS_FILE"`
}

// Keys reads the configured keys. The error names the variable at fault.
func (c PublicKeysConfig) Keys() ([]ed25519.PublicKey, error) {
	name, text := "INTEGRATIONS_PLATFORM_PUBLIC_KEYS", c.PublicKeys
	switch {
	case c.PublicKeys != "" && c.PublicKeysFile != "":
		return nil, errors.New("INTEGRATIONS_PLATFORM_PUBLIC_KEYS and INTEGRATIONS_PLATFORM_PUBLIC_KEYS_FILE: set only one")
	case c.PublicKeys == "" && c.PublicKeysFile == "":
		return nil, errors.New("INTEGRATIONS_PLATFORM_PUBLIC_KEYS or INTEGRATIONS_PLATFORM_PUBLIC_KEYS_FILE: one is required " +
			"(the platform's public keys, which every call to this adapter must be signed by)")
	case c.PublicKeysFile != "":
		name = "INTEGRATIONS_PLATFORM_PUBLIC_KEYS_FILE"
		b, err := os.ReadFile(c.PublicKeysFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		text = string(b)
	}
	keys, err := ParsePublicKeys(text)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return keys, nil
}

// Validate checks that the keys can be read.
func (c PublicKeysConfig) Validate() error {
	_, err := c.Keys()
	return err
}
