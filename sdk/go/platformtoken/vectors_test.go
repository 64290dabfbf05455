package platformtoken

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
)

// The adapter protocol's test vectors (docs/adapter-protocol.md, "Test vectors"): request
// digests, token verifications and refusal markers, in a file any language can read. The file is
// generated from this package and committed; TestVectors runs this implementation against every
// case, and TestVectorsFileIsGenerated fails when the file and its generator disagree.
//
//	go test ./sdk/go/platformtoken/ -run TestVectorsFileIsGenerated -update
const vectorsFile = "testdata/vectors.json"

var update = flag.Bool("update", false, "rewrite "+vectorsFile+" from its generator")

// vectorFile is the file's schema; docs/adapter-protocol.md describes it, and its about says it.
type vectorFile struct {
	About           []string             `json:"about"`
	Version         int                  `json:"version"`
	DigestDomainHex string               `json:"digest_domain_hex"`
	Header          string               `json:"token_header"`
	Issuer          string               `json:"issuer"`
	Keys            map[string]vectorKey `json:"keys"`
	Cases           []vectorCase         `json:"cases"`
}

type vectorKey struct {
	SeedHex      string `json:"seed_hex"`
	PublicBase64 string `json:"public_key_base64"`
	PublicHex    string `json:"public_key_hex"`
	KeyID        string `json:"kid"`
}

type vectorCase struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // digest, token or refusal
	Note string `json:"note,omitempty"`

	// digest and token: the request (for a token, the one received).
	Request *vectorRequest `json:"request,omitempty"`

	// token
	Verifier      *vectorVerifier `json:"verifier,omitempty"`
	Now           int64           `json:"now,omitempty"`
	Method        string          `json:"method,omitempty"`
	Token         *string         `json:"token,omitempty"`
	TokenHeader   json.RawMessage `json:"token_header,omitempty"`
	TokenClaims   json.RawMessage `json:"token_claims,omitempty"`
	Presentations int             `json:"presentations,omitempty"`

	// refusal
	Answer *vectorAnswer `json:"answer,omitempty"`

	Expect json.RawMessage `json:"expect"`
}

type vectorRequest struct {
	Type     string          `json:"type"` // ExecuteRequest or CancelRequest
	JSON     json.RawMessage `json:"json"` // null when protobuf JSON cannot say it
	ProtoHex string          `json:"proto_hex"`
}

type vectorVerifier struct {
	Audience   string   `json:"audience"`
	PublicKeys []string `json:"public_keys"`
}

type vectorAnswer struct {
	Status         json.RawMessage `json:"status"`
	StatusProtoHex string          `json:"status_proto_hex"`
	ReceivedHeader bool            `json:"received_header"`
}

type digestExpect struct {
	InputHex  string `json:"digest_input_hex"`
	SHA256Hex string `json:"sha256_hex"`
	Digest    string `json:"digest"`
}

type tokenExpect struct {
	OK    bool   `json:"ok"`
	Check string `json:"check,omitempty"`
}

type refusalExpect struct {
	Marked       bool   `json:"marked"`
	Check        string `json:"check"`
	Problem      string `json:"problem"`
	AttemptSpent bool   `json:"attempt_spent"`
}

// TestVectors runs this implementation against every case of the committed file.
func TestVectors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	var f vectorFile
	require.NoError(t, json.Unmarshal(b, &f))
	require.Equal(t, hex.EncodeToString([]byte(digestDomain)), f.DigestDomainHex)
	require.GreaterOrEqual(t, len(f.Cases), 20)
	names := map[string]bool{}
	for _, c := range f.Cases {
		require.False(t, names[c.Name], "two cases named %s", c.Name)
		names[c.Name] = true
		t.Run(c.Name, func(t *testing.T) {
			switch c.Kind {
			case "digest":
				runDigestCase(t, c)
			case "token":
				runTokenCase(t, c)
			case "refusal":
				runRefusalCase(t, c)
			default:
				t.Fatalf("case %s: unknown kind %q", c.Name, c.Kind)
			}
		})
	}
}

// TestVectorsFileIsGenerated: the committed file is what the generator writes (with -update, it
// is rewritten).
func TestVectorsFileIsGenerated(t *testing.T) {
	t.Parallel()
	b := generateVectors(t)
	if *update {
		require.NoError(t, os.WriteFile(vectorsFile, b, 0o644))
		return
	}
	have, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	require.Equal(t, string(b), string(have), "%s is not what its generator writes: go test ./sdk/go/platformtoken/ -run TestVectorsFileIsGenerated -update", vectorsFile)
}

// decodeRequest reads a case's request from its protobuf bytes, as an adapter receives it; its
// JSON form, when given, must decode to the same digest.
func decodeRequest(t *testing.T, r *vectorRequest) proto.Message {
	t.Helper()
	var m proto.Message
	switch r.Type {
	case "ExecuteRequest":
		m = &adapterv1.ExecuteRequest{}
	case "CancelRequest":
		m = &adapterv1.CancelRequest{}
	default:
		t.Fatalf("unknown request type %q", r.Type)
	}
	b, err := hex.DecodeString(r.ProtoHex)
	require.NoError(t, err)
	require.NoError(t, proto.Unmarshal(b, m))
	if len(r.JSON) > 0 && string(r.JSON) != "null" {
		fromJSON := m.ProtoReflect().New().Interface()
		require.NoError(t, protojson.Unmarshal(r.JSON, fromJSON))
		require.Equal(t, digest(t, m), digest(t, fromJSON), "the request's JSON and protobuf forms differ")
	}
	return m
}

func runDigestCase(t *testing.T, c vectorCase) {
	var want digestExpect
	require.NoError(t, json.Unmarshal(c.Expect, &want))
	req := decodeRequest(t, c.Request)
	var in bytes.Buffer
	require.NoError(t, encode(&in, req))
	require.Equal(t, want.InputHex, hex.EncodeToString(in.Bytes()), "digest input")
	sum := sha256.Sum256(in.Bytes())
	require.Equal(t, want.SHA256Hex, hex.EncodeToString(sum[:]))
	require.Equal(t, want.Digest, digest(t, req))
}

func runTokenCase(t *testing.T, c vectorCase) {
	var want tokenExpect
	require.NoError(t, json.Unmarshal(c.Expect, &want))
	keys, err := ParsePublicKeys(strings.Join(c.Verifier.PublicKeys, ","))
	require.NoError(t, err)
	v, err := NewVerifier(c.Verifier.Audience, keys)
	require.NoError(t, err)
	v.now = func() time.Time { return time.Unix(c.Now, 0) }
	req := decodeRequest(t, c.Request)
	r := req.(interface {
		GetExecutionId() string
		GetAttempt() int32
	})
	call := Call{ExecutionID: r.GetExecutionId(), Attempt: r.GetAttempt(), Method: c.Method, Request: req}
	n := max(c.Presentations, 1)
	for i := 1; i < n; i++ {
		_, err := v.Verify(*c.Token, call)
		require.NoError(t, err, "presentation %d of %d", i, n)
	}
	claims, err := v.Verify(*c.Token, call)
	if want.OK {
		require.NoError(t, err)
		require.Equal(t, digest(t, req), claims.Request)
		return
	}
	require.ErrorIs(t, err, ErrRefused)
	require.Equal(t, want.Check, Check(err), "%v", err)
}

func runRefusalCase(t *testing.T, c vectorCase) {
	var want refusalExpect
	require.NoError(t, json.Unmarshal(c.Expect, &want))
	b, err := hex.DecodeString(c.Answer.StatusProtoHex)
	require.NoError(t, err)
	var sp spb.Status
	require.NoError(t, proto.Unmarshal(b, &sp))
	var fromJSON spb.Status
	require.NoError(t, protojson.Unmarshal(c.Answer.Status, &fromJSON))
	require.True(t, proto.Equal(&sp, &fromJSON), "the answer's JSON and protobuf forms differ")
	got := ReadRefusal(status.ErrorProto(&sp), c.Answer.ReceivedHeader)
	require.Equal(t, want, refusalExpect{Marked: got.Marked, Check: got.Check, Problem: got.Problem, AttemptSpent: got.AttemptSpent()})
}

// --- the generator ---

// vectorNow is the cases' "now": 2027-01-15T08:00:00Z.
const vectorNow = 1_800_000_000

const vectorAudience = "adp-email"

// vectorSeed is a fixed key's seed: 32 bytes counting up from first.
func vectorSeed(first byte) []byte {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = first + byte(i)
	}
	return seed
}

// gen builds the file's cases.
type gen struct {
	t     testing.TB
	keys  map[string]ed25519.PrivateKey
	cases []vectorCase
	jti   byte
}

func (g *gen) pub(name string) string {
	return EncodePublicKey(g.keys[name].Public().(ed25519.PublicKey))
}

// signer signs as the platform does, at now, with the next fixed token id.
func (g *gen) signer(key string, now int64) *Signer {
	s := NewSigner(g.keys[key])
	s.now = func() time.Time { return time.Unix(now, 0) }
	g.jti++
	s.rand = bytes.NewReader(bytes.Repeat([]byte{g.jti}, 16))
	return s
}

func (g *gen) sign(key string, iat int64, c Call) string {
	g.t.Helper()
	tok, err := g.signer(key, iat).Sign(c)
	require.NoError(g.t, err)
	return tok
}

// craft signs a token of header and claims by hand (for tokens the platform would never send),
// with Ed25519 under key.
func (g *gen) craft(key string, header, claims map[string]any) string {
	g.t.Helper()
	h, err := json.Marshal(header)
	require.NoError(g.t, err)
	c, err := json.Marshal(claims)
	require.NoError(g.t, err)
	text := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	return text + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(g.keys[key], []byte(text)))
}

// claimsOf is the claims the platform would sign for req, as a map to edit.
func (g *gen) claimsOf(key string, iat int64, method string, req proto.Message) map[string]any {
	g.t.Helper()
	tok := g.sign(key, iat, callFor(method, req, time.Time{}))
	var m map[string]any
	b, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
	require.NoError(g.t, err)
	require.NoError(g.t, json.Unmarshal(b, &m))
	return m
}

func (g *gen) headerOf(key string) map[string]any {
	return map[string]any{"alg": "EdDSA", "kid": KeyID(g.keys[key].Public().(ed25519.PublicKey)), "typ": "JWT"}
}

func callFor(method string, req proto.Message, deadline time.Time) Call {
	r := req.(interface {
		GetExecutionId() string
		GetAttempt() int32
	})
	return Call{AdapterID: vectorAudience, ExecutionID: r.GetExecutionId(), Attempt: r.GetAttempt(), Method: method, Request: req, Deadline: deadline}
}

func (g *gen) request(m proto.Message, withJSON bool) *vectorRequest {
	g.t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	require.NoError(g.t, err)
	return g.requestBytes(m, b, withJSON)
}

func (g *gen) requestBytes(m proto.Message, b []byte, withJSON bool) *vectorRequest {
	g.t.Helper()
	r := &vectorRequest{Type: string(m.ProtoReflect().Descriptor().Name()), ProtoHex: hex.EncodeToString(b), JSON: json.RawMessage("null")}
	if withJSON {
		j, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		require.NoError(g.t, err)
		r.JSON = compact(g.t, j)
	}
	return r
}

func compact(t testing.TB, b []byte) json.RawMessage {
	var buf bytes.Buffer
	require.NoError(t, json.Compact(&buf, b))
	return buf.Bytes()
}

func (g *gen) expect(v any) json.RawMessage {
	b, err := json.Marshal(v)
	require.NoError(g.t, err)
	return b
}

func (g *gen) digestCase(name, note string, m proto.Message) {
	g.digestCaseOf(name, note, m, g.request(m, true))
}

func (g *gen) digestCaseOf(name, note string, m proto.Message, r *vectorRequest) {
	g.t.Helper()
	var in bytes.Buffer
	require.NoError(g.t, encode(&in, m))
	sum := sha256.Sum256(in.Bytes())
	g.cases = append(g.cases, vectorCase{Name: name, Kind: "digest", Note: note, Request: r, Expect: g.expect(digestExpect{
		InputHex: hex.EncodeToString(in.Bytes()), SHA256Hex: hex.EncodeToString(sum[:]), Digest: base64.RawURLEncoding.EncodeToString(sum[:]),
	})})
}

// tokenCase adds a token presented with req on method to a verifier of keys at now, expecting
// check ("" for accepted).
func (g *gen) tokenCase(name, note, token string, keys []string, now int64, method string, req proto.Message, presentations int, check string) {
	g.t.Helper()
	c := vectorCase{Name: name, Kind: "token", Note: note, Verifier: &vectorVerifier{Audience: vectorAudience}, Now: now,
		Method: method, Request: g.request(req, true), Token: &token, Presentations: presentations,
		Expect: g.expect(tokenExpect{OK: check == "", Check: check})}
	for _, k := range keys {
		c.Verifier.PublicKeys = append(c.Verifier.PublicKeys, g.pub(k))
	}
	if parts := strings.Split(token, "."); len(parts) == 3 {
		for i, into := range []*json.RawMessage{&c.TokenHeader, &c.TokenClaims} {
			if b, err := base64.RawURLEncoding.DecodeString(parts[i]); err == nil && json.Valid(b) {
				*into = compact(g.t, b)
			}
		}
	}
	g.cases = append(g.cases, c)
}

func (g *gen) refusalCase(name, note string, st *status.Status, received bool) {
	g.t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(st.Proto())
	require.NoError(g.t, err)
	j, err := protojson.Marshal(st.Proto())
	require.NoError(g.t, err)
	r := ReadRefusal(st.Err(), received)
	g.cases = append(g.cases, vectorCase{Name: name, Kind: "refusal", Note: note,
		Answer: &vectorAnswer{Status: compact(g.t, j), StatusProtoHex: hex.EncodeToString(b), ReceivedHeader: received},
		Expect: g.expect(refusalExpect{Marked: r.Marked, Check: r.Check, Problem: r.Problem, AttemptSpent: r.AttemptSpent()})})
}

func withDetails(t testing.TB, code codes.Code, msg string, details ...protoadapt.MessageV1) *status.Status {
	st, err := status.New(code, msg).WithDetails(details...)
	require.NoError(t, err)
	return st
}

// exampleRequest is the spec's worked example: an ExecuteRequest as the execution-consumer sends it.
func exampleRequest(t testing.TB) *adapterv1.ExecuteRequest {
	payload, err := structpb.NewStruct(map[string]any{"to": "ana@example.com", "subject": "Grüße", "n": 3.0})
	require.NoError(t, err)
	return &adapterv1.ExecuteRequest{
		ExecutionId: "0190f5d2-7c1e-7a3b-9f00-5e1d2c3b4a59", Attempt: 2, Capability: "email.send", Payload: payload,
		DeadlineTime: timestamppb.New(time.Unix(vectorNow+90, 0)), CallbackToken: "cbt_2b7e1516",
		Mode: executionv1.Mode_MODE_ASYNC, DeadlineIn: durationpb.New(90 * time.Second),
	}
}

func payloadOf(t testing.TB, fields map[string]*structpb.Value) *adapterv1.ExecuteRequest {
	t.Helper()
	return &adapterv1.ExecuteRequest{ExecutionId: "0190f5d2-7c1e-7a3b-9f00-5e1d2c3b4a59", Attempt: 1, Capability: "c",
		Payload: &structpb.Struct{Fields: fields}}
}

func list(vs ...*structpb.Value) *structpb.Value {
	return structpb.NewListValue(&structpb.ListValue{Values: vs})
}

func obj(fields map[string]*structpb.Value) *structpb.Value {
	return structpb.NewStructValue(&structpb.Struct{Fields: fields})
}

func str(s string) *structpb.Value  { return structpb.NewStringValue(s) }
func num(f float64) *structpb.Value { return structpb.NewNumberValue(f) }

// generateVectors writes the file's bytes.
func generateVectors(t testing.TB) []byte {
	g := &gen{t: t, keys: map[string]ed25519.PrivateKey{
		"platform_a": ed25519.NewKeyFromSeed(vectorSeed(0x00)),
		"platform_b": ed25519.NewKeyFromSeed(vectorSeed(0x20)),
		"stranger":   ed25519.NewKeyFromSeed(vectorSeed(0x40)),
	}}
	const execute = "/integrations.adapter.v1.AdapterService/Execute"
	const cancel = "/integrations.adapter.v1.AdapterService/Cancel"

	// Digests.
	ex := exampleRequest(t)
	g.digestCase("digest/worked-example", "The spec's worked example (docs/adapter-protocol.md): every field set.", ex)
	g.digestCase("digest/pinned-full-request", "Every kind of value; TestDigestIsPinned's value, computed by a separate implementation.", fullRequest(t))
	g.digestCase("digest/pinned-cancel", "A CancelRequest: tag 'C', execution_id, attempt. TestDigestIsPinned's value.",
		&adapterv1.CancelRequest{ExecutionId: "e", Attempt: 1})
	g.digestCase("digest/cancel-zero", "An empty CancelRequest: zero values are encoded, not left out.", &adapterv1.CancelRequest{})
	g.digestCase("digest/execute-empty", "An empty ExecuteRequest: empty strings, 0, the empty Struct for the absent payload, '-' for both absent deadlines, the SHA-256 of the empty callback token.",
		&adapterv1.ExecuteRequest{})
	g.digestCase("digest/execute-empty-payload", "payload {} present: the same digest as digest/execute-empty, where it is absent.",
		&adapterv1.ExecuteRequest{Payload: &structpb.Struct{}})
	g.digestCase("digest/key-order-utf8-bytes", "Keys sorted by their UTF-8 bytes: \"\" < \"B\" < \"a\" < \"z\" < \"é\" (c3 a9) < \"ﬁ\" (ef ac 81) < \"😀\" (f0 9f 98 80). UTF-16 order (JavaScript's default sort) puts 😀 (d83d) before ﬁ (fb01): wrong.",
		payloadOf(t, map[string]*structpb.Value{"z": num(1), "é": num(2), "B": num(3), "a": num(4), "ﬁ": num(5), "😀": num(6), "": num(7)}))
	g.digestCase("digest/non-ascii-values", "String lengths count UTF-8 bytes; no Unicode normalisation: é precomposed (c3 a9) and decomposed (65 cc 81) differ.",
		payloadOf(t, map[string]*structpb.Value{"greeting": str("Grüße"), "nfc": str("\u00e9"), "nfd": str("e\u0301"), "ja": str("日本語"), "emoji": str("👍🏽")}))
	g.digestCase("digest/nested", "Objects in lists in objects; list order kept, object keys sorted at every level.",
		payloadOf(t, map[string]*structpb.Value{"order": obj(map[string]*structpb.Value{
			"lines": list(obj(map[string]*structpb.Value{"sku": str("b-2"), "qty": num(1)}), obj(map[string]*structpb.Value{"sku": str("a-1"), "qty": num(2)})),
			"meta":  obj(map[string]*structpb.Value{"tags": list(str("z"), str("a")), "deep": obj(map[string]*structpb.Value{"deeper": list(list(num(1)))})}),
		})}))
	g.digestCase("digest/empty-values", "Empty string, object and list, null, false, and empties nested in a list: each its own encoding.",
		payloadOf(t, map[string]*structpb.Value{"s": str(""), "o": obj(nil), "l": list(), "null": structpb.NewNullValue(), "f": structpb.NewBoolValue(false),
			"t": structpb.NewBoolValue(true), "nested": list(list(), obj(nil), str(""))}))
	g.digestCase("digest/numbers", "Numbers are IEEE-754 doubles, encoded as their 8 bits big-endian: 0 and -0 differ; 42 is 42.0; 2^53 is exact.",
		payloadOf(t, map[string]*structpb.Value{"zero": num(0), "neg_zero": num(math.Copysign(0, -1)), "int": num(42), "neg": num(-1), "half": num(1.5),
			"tenth": num(0.1), "pi": num(math.Pi), "max": num(math.MaxFloat64), "tiny": num(5e-324), "two53": num(1 << 53), "neg_two53": num(-(1 << 53)), "big": num(1e21)}))
	g.digestCase("digest/integer-beyond-2^53", "A JSON client's 9007199254740993 (2^53+1) and 12345678901234567890 reach the adapter as the nearest doubles, 9007199254740992 and 12345678901234567168: the digest is over the doubles the request carries, never the client's text.",
		payloadOf(t, map[string]*structpb.Value{"id": num(9007199254740993), "bigger": num(12345678901234567890)}))
	g.digestCase("digest/negative-and-odd-scalars", "A deadline_time before 1970 and a negative deadline_in (seconds and nanos both negative, each as 8-byte two's complement), a negative attempt (sign-extended to 8 bytes), an unknown mode number (kept as its number).",
		&adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: -1, Mode: executionv1.Mode(7),
			DeadlineTime: &timestamppb.Timestamp{Seconds: -1, Nanos: 5}, DeadlineIn: &durationpb.Duration{Seconds: -1, Nanos: -500_000_000}})
	long := strings.Repeat("0123456789abcdef", 20)
	g.digestCase("digest/long-and-nul-strings", "A 320-byte string (the length is always 8 bytes) and a key and value holding a NUL byte.",
		payloadOf(t, map[string]*structpb.Value{"long": str(long), "a\x00b": str("x\x00y")}))
	g.digestCase("digest/callback-token-non-ascii", "The callback token is encoded as the SHA-256 of its UTF-8 bytes, a 32-byte string.",
		&adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1, CallbackToken: "cbt_ключ"})
	// Binary-only forms.
	exBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(ex)
	require.NoError(t, err)
	withUnknown := protowire.AppendTag(append([]byte(nil), exBytes...), 99, protowire.BytesType)
	withUnknown = protowire.AppendString(withUnknown, "a field of a later platform")
	g.digestCaseOf("digest/unknown-field-ignored", "digest/worked-example's bytes with an unknown field 99 appended: the digest is over the known fields as decoded, so it is the worked example's.",
		ex, g.requestBytes(ex, withUnknown, false))
	noKind := payloadOf(t, map[string]*structpb.Value{"k": {}})
	g.digestCaseOf("digest/value-without-kind", "A google.protobuf.Value with no kind set (protobuf JSON cannot say it): tag '0'.", noKind, g.request(noKind, false))

	// Tokens.
	iat := int64(vectorNow)
	valid := g.sign("platform_a", iat, callFor(execute, ex, time.Unix(iat+90, 0)))
	all := []string{"platform_a"}
	g.tokenCase("token/valid-execute", "As the platform signs it: exp = min(deadline, iat+60) + 30 = iat+90 here.", valid, all, iat+5, execute, ex, 1, "")
	g.tokenCase("token/valid-at-last-second", "now = exp-1: still accepted (a token is accepted while now < exp).", valid, all, iat+89, execute, ex, 1, "")
	g.tokenCase("token/expired-at-exp", "now = exp: refused.", valid, all, iat+90, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/expired", "An hour after exp.", valid, all, iat+3600, execute, ex, 1, CheckInvalid)
	short := g.sign("platform_a", iat, callFor(execute, ex, time.Unix(iat+10, 0)))
	g.tokenCase("token/valid-short-deadline", "The call's deadline (iat+10) comes before iat+60: exp = iat+10+30.", short, all, iat+39, execute, ex, 1, "")
	can := &adapterv1.CancelRequest{ExecutionId: ex.ExecutionId, Attempt: ex.Attempt}
	g.tokenCase("token/valid-cancel", "A Cancel: rpc names Cancel, req is the CancelRequest's digest.",
		g.sign("platform_a", iat, callFor(cancel, can, time.Time{})), all, iat+1, cancel, can, 1, "")
	g.tokenCase("token/valid-rotation-second-key", "Signed by key B; the adapter holds A and B during a rotation and picks the key by kid.",
		g.sign("platform_b", iat, callFor(execute, ex, time.Time{})), []string{"platform_a", "platform_b"}, iat+1, execute, ex, 1, "")
	claims := g.claimsOf("platform_a", iat, execute, ex)
	claims["aud"] = vectorAudience
	g.tokenCase("token/valid-aud-as-string", "aud as a bare string: RFC 7519 allows it and verifiers accept it; the platform always sends an array of one.",
		g.craft("platform_a", g.headerOf("platform_a"), claims), all, iat+1, execute, ex, 1, "")
	g.tokenCase("token/valid-issued-within-skew", "iat 30 s after the adapter's now (the signer's clock ahead): accepted.",
		g.sign("platform_a", iat+30, callFor(execute, ex, time.Time{})), all, iat, execute, ex, 1, "")
	g.tokenCase("token/issued-in-the-future", "iat 31 s after the adapter's now: refused (not yet valid).",
		g.sign("platform_a", iat+31, callFor(execute, ex, time.Time{})), all, iat, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/missing", "No integrations-platform-token metadata (or an empty one, or more than one).", "", all, iat, execute, ex, 1, CheckMissing)
	g.tokenCase("token/replayed", "The same token presented twice to one adapter: the first is accepted, the second refused.", valid, all, iat+5, execute, ex, 2, CheckReplayed)
	g.tokenCase("token/unknown-key", "Signed by a key the adapter does not hold, kid naming it.",
		g.sign("stranger", iat, callFor(execute, ex, time.Time{})), all, iat+1, execute, ex, 1, CheckKey)
	noKid := g.headerOf("platform_a")
	delete(noKid, "kid")
	g.tokenCase("token/no-kid", "No kid header: no key is found.", g.craft("platform_a", noKid, claims), all, iat+1, execute, ex, 1, CheckKey)
	g.tokenCase("token/forged-kid", "kid names key A, signed by another key: the signature does not verify.",
		g.craft("stranger", g.headerOf("platform_a"), g.claimsOf("platform_a", iat, execute, ex)), all, iat+1, execute, ex, 1, CheckInvalid)
	parts := strings.Split(valid, ".")
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	require.NoError(t, err)
	sig[0] ^= 1
	g.tokenCase("token/bad-signature", "token/valid-execute with one signature bit flipped.",
		parts[0]+"."+parts[1]+"."+base64.RawURLEncoding.EncodeToString(sig), all, iat+5, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/non-canonical-base64", "token/valid-execute's signature with its last character's unused low bits set: the same bytes to a lenient decoder; refused (one spelling per token).",
		parts[0]+"."+parts[1]+"."+nonCanonical(parts[2]), all, iat+5, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/padded-base64", "token/valid-execute's header with base64 padding: refused (base64url without padding only).",
		parts[0]+strings.Repeat("=", (4-len(parts[0])%4)%4)+"."+parts[1]+"."+parts[2], all, iat+5, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/malformed", "Not three dot-separated parts.", "not.a-token", all, iat, execute, ex, 1, CheckInvalid)
	none := map[string]any{"alg": "none", "kid": g.headerOf("platform_a")["kid"], "typ": "JWT"}
	h, _ := json.Marshal(none)
	c, _ := json.Marshal(claims)
	g.tokenCase("token/alg-none", "alg none, no signature.",
		base64.RawURLEncoding.EncodeToString(h)+"."+base64.RawURLEncoding.EncodeToString(c)+".", all, iat+1, execute, ex, 1, CheckInvalid)
	hs := map[string]any{"alg": "HS256", "kid": g.headerOf("platform_a")["kid"], "typ": "JWT"}
	h, _ = json.Marshal(hs)
	text := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	mac := hmac.New(sha256.New, g.keys["platform_a"].Public().(ed25519.PublicKey))
	mac.Write([]byte(text))
	g.tokenCase("token/alg-hs256-with-public-key", "HS256 keyed with the public key's bytes (algorithm confusion): only EdDSA is accepted.",
		text+"."+base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), all, iat+1, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/wrong-audience", "Signed for another adapter.",
		g.sign("platform_a", iat, Call{AdapterID: "adp-sms", ExecutionID: ex.ExecutionId, Attempt: ex.Attempt, Method: execute, Request: ex}),
		all, iat+1, execute, ex, 1, CheckAudience)
	edit := func(k string, v any) map[string]any {
		m := g.claimsOf("platform_a", iat, execute, ex)
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	g.tokenCase("token/wrong-issuer", "iss is not integrations-platform.", g.craft("platform_a", g.headerOf("platform_a"), edit("iss", "someone-else")), all, iat+1, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/no-exp", "exp is required.", g.craft("platform_a", g.headerOf("platform_a"), edit("exp", nil)), all, iat+1, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/no-iat", "iat is required.", g.craft("platform_a", g.headerOf("platform_a"), edit("iat", nil)), all, iat+1, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/no-jti", "jti is required.", g.craft("platform_a", g.headerOf("platform_a"), edit("jti", nil)), all, iat+1, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/lifetime-too-long", "exp - iat = 91 s, more than 60 + 30: refused whatever the clocks say.",
		g.craft("platform_a", g.headerOf("platform_a"), edit("exp", iat+91)), all, iat+1, execute, ex, 1, CheckInvalid)
	g.tokenCase("token/no-req", "No req claim: bound to no request.", g.craft("platform_a", g.headerOf("platform_a"), edit("req", nil)), all, iat+1, execute, ex, 1, CheckBinding)
	forged := exampleRequest(t)
	forged.Payload.Fields["to"] = str("mallory@example.com")
	g.tokenCase("token/wrong-digest", "token/valid-execute presented with another payload (to changed): the digest differs.", valid, all, iat+5, execute, forged, 1, CheckBinding)
	next := exampleRequest(t)
	next.Attempt = 3
	g.tokenCase("token/wrong-attempt", "token/valid-execute presented with attempt 3 (the token says 2).", valid, all, iat+5, execute, next, 1, CheckBinding)
	g.tokenCase("token/wrong-method", "A token signed for Cancel (with the ExecuteRequest's digest) presented on Execute.",
		g.sign("platform_a", iat, callFor(cancel, ex, time.Time{})), all, iat+1, execute, ex, 1, CheckBinding)

	// Refusal markers.
	refusedBy := func(why error) error { return fmt.Errorf("%w: %w", ErrRefused, why) }
	g.refusalCase("refusal/valid-key", "RefusalStatus for an unknown key: taken; nothing ran; no attempt spent.", RefusalStatus(refusedBy(ErrKey)), false)
	g.refusalCase("refusal/valid-missing", "RefusalStatus for a call without a token.", RefusalStatus(refusedBy(ErrMissing)), false)
	g.refusalCase("refusal/valid-binding", "RefusalStatus for a token bound to another request.", RefusalStatus(refusedBy(ErrBinding)), false)
	g.refusalCase("refusal/valid-replayed", "RefusalStatus for a replayed token: taken, but the attempt is spent (someone ran this very request with it).",
		RefusalStatus(refusedBy(ErrReplayed)), false)
	info := func(domain, reason string, md map[string]string) *errdetails.ErrorInfo {
		return &errdetails.ErrorInfo{Domain: domain, Reason: reason, Metadata: md}
	}
	chk := map[string]string{RefusalCheckKey: CheckKey}
	g.refusalCase("refusal/valid-among-other-details", "The marker after a RetryInfo and another domain's ErrorInfo: any position counts.",
		withDetails(t, codes.Unauthenticated, "refused", &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)},
			info("provider.example", "KEY_REVOKED", nil), info(RefusalDomain, RefusalReason, chk)), false)
	g.refusalCase("refusal/plain-unauthenticated", "UNAUTHENTICATED without the marker (the adapter's provider refused its key, perhaps after the work): an ordinary failure, attempt spent.",
		status.New(codes.Unauthenticated, "provider rejected our API key"), false)
	g.refusalCase("refusal/wrong-domain", "The reason under the platform services' domain \"integrations\": not taken, attempt spent, the platform warns.",
		withDetails(t, codes.Unauthenticated, "refused", info("integrations", RefusalReason, chk)), false)
	g.refusalCase("refusal/wrong-reason-case", "The reason in lower case: not taken.",
		withDetails(t, codes.Unauthenticated, "refused", info(RefusalDomain, strings.ToLower(RefusalReason), chk)), false)
	g.refusalCase("refusal/wrong-code", "The marker on PERMISSION_DENIED: not taken.",
		withDetails(t, codes.PermissionDenied, "refused", info(RefusalDomain, RefusalReason, chk)), false)
	g.refusalCase("refusal/message-only", "PLATFORM_TOKEN_REFUSED in the message, no ErrorInfo: not taken.",
		status.New(codes.Unauthenticated, "PLATFORM_TOKEN_REFUSED: check=key"), false)
	g.refusalCase("refusal/after-received-header", "A well-formed marker after the integrations-received header: not taken (the handler may have run).",
		RefusalStatus(refusedBy(ErrKey)), true)
	g.refusalCase("refusal/check-missing", "No check metadata: taken (not spent), and the platform warns.",
		withDetails(t, codes.Unauthenticated, "refused", info(RefusalDomain, RefusalReason, nil)), false)
	g.refusalCase("refusal/check-unknown", "check \"expired\" (not a check name; expiry is \"invalid\"): taken (not spent), and the platform warns.",
		withDetails(t, codes.Unauthenticated, "refused", info(RefusalDomain, RefusalReason, map[string]string{RefusalCheckKey: "expired"})), false)

	f := vectorFile{
		About: []string{
			"Test vectors of the adapter protocol: docs/adapter-protocol.md, \"Test vectors\", describes this file.",
			"Generated by sdk/go/platformtoken/vectors_test.go (go test ./sdk/go/platformtoken/ -run TestVectorsFileIsGenerated -update); do not edit.",
			"kind digest: decode request.proto_hex as request.type (or parse request.json, protobuf JSON, when not null); expect.digest_input_hex is the bytes hashed, expect.digest the req claim.",
			"kind token: a verifier for verifier.audience holding verifier.public_keys (base64), clock at now (Unix seconds), receives token on method with request; presentations times in a row (all but the last accepted); expect.ok, or expect.check the refusal.",
			"kind refusal: an adapter's answer: answer.status (google.rpc.Status as protobuf JSON; answer.status_proto_hex its bytes, the grpc-status-details-bin trailer), after the integrations-received header or not; expect: taken as the marker, its check, the problem (\"\" for none), whether the attempt is spent.",
			"token_header and token_claims of a token case are the token's decoded JSON, for reading only.",
		},
		Version: 1, DigestDomainHex: hex.EncodeToString([]byte(digestDomain)), Header: Header, Issuer: Issuer,
		Keys: map[string]vectorKey{}, Cases: g.cases,
	}
	for name, k := range g.keys {
		pub := k.Public().(ed25519.PublicKey)
		f.Keys[name] = vectorKey{SeedHex: hex.EncodeToString(k.Seed()), PublicBase64: EncodePublicKey(pub), PublicHex: hex.EncodeToString(pub), KeyID: KeyID(pub)}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	require.NoError(t, enc.Encode(f))
	return buf.Bytes()
}

// nonCanonical sets the unused low bits of a base64url (unpadded) text's last character.
func nonCanonical(s string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, s[len(s)-1])
	unused := map[int]int{2: 0b1111, 3: 0b11}[len(s)%4] // 2 chars: 4 unused bits; 3 chars: 2
	if unused == 0 || last&unused != 0 {
		panic(errors.New("no unused bits to set"))
	}
	return s[:len(s)-1] + string(alphabet[last|1])
}
