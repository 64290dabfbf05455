package platformtoken

import (
	"crypto/ed25519"
	"math"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
)

// fullRequest is an ExecuteRequest with every field set, and a payload of every kind of value.
func fullRequest(t testing.TB) *adapterv1.ExecuteRequest {
	t.Helper()
	payload, err := structpb.NewStruct(map[string]any{
		"to": "a@example.com", "n": 1.5, "ok": true, "none": nil,
		"list": []any{"x", 2.0, map[string]any{"deep": "y"}}, "obj": map[string]any{"k": "v"},
	})
	require.NoError(t, err)
	return &adapterv1.ExecuteRequest{
		ExecutionId: "01a233f8-ef43-77bc-8182-ce8f53992118", Attempt: 2, Capability: "email.send", Payload: payload,
		DeadlineTime: timestamppb.New(time.Unix(1_800_000_000, 5)), CallbackToken: "cbt_secret",
		Mode: executionv1.Mode_MODE_SYNC, DeadlineIn: durationpb.New(90 * time.Second),
	}
}

func digest(t testing.TB, m proto.Message) string {
	t.Helper()
	d, err := Digest(m)
	require.NoError(t, err)
	return d
}

// TestDigestIsPinned: the encoding is a protocol (an adapter in another language computes it):
// it does not change by accident. (The values were computed by a separate implementation of the
// encoding as Digest's doc describes it, not by Digest.)
func TestDigestIsPinned(t *testing.T) {
	t.Parallel()
	require.Equal(t, "W0xDYJ5jv8bhFjL4FXJ2JWXDbZ8t6j4_LbEWk-Uct1Y", digest(t, fullRequest(t)))
	require.Equal(t, "0tlHX5wl6A5XzXw4hPx3dh62NT7hbKwqjWaCzUWHU-Y", digest(t, &adapterv1.CancelRequest{ExecutionId: "e", Attempt: 1}))
}

// TestDigestSurvivesTheWire: the adapter, decoding the bytes the platform sent, computes the
// platform's digest.
func TestDigestSurvivesTheWire(t *testing.T) {
	t.Parallel()
	for _, m := range []proto.Message{fullRequest(t), &adapterv1.ExecuteRequest{}, &adapterv1.CancelRequest{ExecutionId: "e", Attempt: 7}} {
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		got := m.ProtoReflect().New().Interface()
		require.NoError(t, proto.Unmarshal(b, got))
		require.Equal(t, digest(t, m), digest(t, got))
	}
	// What the SDK hands the handler is the same for no payload and an empty one.
	require.Equal(t, digest(t, &adapterv1.ExecuteRequest{}), digest(t, &adapterv1.ExecuteRequest{Payload: &structpb.Struct{}}))
}

// TestDigestCoversEveryField: changing any field of the request changes its digest, and a field
// added to the protos fails here until the digest covers it (under a new digestDomain) or it is
// left out on purpose.
func TestDigestCoversEveryField(t *testing.T) {
	t.Parallel()
	base := digest(t, fullRequest(t))
	edits := map[protoreflect.Name]func(*adapterv1.ExecuteRequest){
		"execution_id": func(r *adapterv1.ExecuteRequest) { r.ExecutionId = "other" },
		"attempt":      func(r *adapterv1.ExecuteRequest) { r.Attempt = 3 },
		"capability":   func(r *adapterv1.ExecuteRequest) { r.Capability = "forged.capability" },
		"payload": func(r *adapterv1.ExecuteRequest) {
			r.Payload.Fields["to"] = structpb.NewStringValue("attacker@example.com")
		},
		"deadline_time":  func(r *adapterv1.ExecuteRequest) { r.DeadlineTime = timestamppb.New(time.Unix(1_900_000_000, 0)) },
		"callback_token": func(r *adapterv1.ExecuteRequest) { r.CallbackToken = "cbt_other" },
		"mode":           func(r *adapterv1.ExecuteRequest) { r.Mode = executionv1.Mode_MODE_ASYNC },
		"deadline_in":    func(r *adapterv1.ExecuteRequest) { r.DeadlineIn = durationpb.New(time.Hour) },
	}
	fields := fullRequest(t).ProtoReflect().Descriptor().Fields()
	require.Equal(t, len(edits), fields.Len(), "a field of ExecuteRequest the digest does not know")
	for i := range fields.Len() {
		name := fields.Get(i).Name()
		edit, ok := edits[name]
		require.True(t, ok, "ExecuteRequest.%s is not covered by the digest", name)
		r := fullRequest(t)
		edit(r)
		require.NotEqual(t, base, digest(t, r), name)
		r = fullRequest(t)
		r.ProtoReflect().Clear(fields.Get(i))
		require.NotEqual(t, base, digest(t, r), "%s cleared", name)
	}
	require.Equal(t, 2, (&adapterv1.CancelRequest{}).ProtoReflect().Descriptor().Fields().Len(), "a field of CancelRequest the digest does not know")

	// Payload values: kinds, nesting and order within lists are told apart.
	values := []*structpb.Value{
		nil, structpb.NewNullValue(), structpb.NewBoolValue(false), structpb.NewBoolValue(true),
		structpb.NewNumberValue(0), structpb.NewNumberValue(math.Copysign(0, -1)), structpb.NewStringValue(""),
		structpb.NewStringValue("0"), structpb.NewStructValue(&structpb.Struct{}), structpb.NewListValue(&structpb.ListValue{}),
		structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("a"), structpb.NewStringValue("b")}}),
		structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("b"), structpb.NewStringValue("a")}}),
		structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("ab")}}),
	}
	seen := map[string]int{}
	for i, v := range values {
		d := digest(t, &adapterv1.ExecuteRequest{Payload: &structpb.Struct{Fields: map[string]*structpb.Value{"k": v}}})
		prev, dup := seen[d]
		require.False(t, dup, "values %d and %d have one digest", prev, i)
		seen[d] = i
	}
	// Lengths prefix strings: moving bytes between two fields changes the digest.
	require.NotEqual(t, digest(t, &adapterv1.ExecuteRequest{ExecutionId: "ab", Capability: "c"}),
		digest(t, &adapterv1.ExecuteRequest{ExecutionId: "a", Capability: "bc"}))
	require.NotEqual(t, digest(t, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1}), digest(t, &adapterv1.CancelRequest{ExecutionId: "e", Attempt: 1}))
}

func TestDigestOfAnotherMessage(t *testing.T) {
	t.Parallel()
	_, err := Digest(&structpb.Struct{})
	require.ErrorContains(t, err, "not a request to an adapter")
	_, err = Digest(nil)
	require.Error(t, err)
	_, priv := newKey(t)
	_, err = NewSigner(priv).Sign(Call{AdapterID: "adp", ExecutionID: "e1", Attempt: 1, Method: "/m"})
	require.Error(t, err, "a token is always bound to a request")
}

// TestVerifyBindsTheRequest: a token signed for one request does not verify for another, and a
// token without the req claim (or a verifier given no request) verifies for none.
func TestVerifyBindsTheRequest(t *testing.T) {
	t.Parallel()
	pub, priv := newKey(t)
	s := NewSigner(priv)
	signed := fullRequest(t)
	call := Call{AdapterID: "adp", ExecutionID: signed.ExecutionId, Attempt: signed.Attempt, Method: "/m", Request: signed}

	forged := fullRequest(t)
	forged.Payload.Fields["to"] = structpb.NewStringValue("attacker@example.com")
	noClaim := func() string {
		now := time.Now()
		tk := jwt.NewWithClaims(jwt.SigningMethodEdDSA, Claims{RegisteredClaims: jwt.RegisteredClaims{
			Issuer: Issuer, Subject: call.ExecutionID, Audience: jwt.ClaimStrings{"adp"}, ID: "no-req",
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute)),
		}, Attempt: call.Attempt, Method: call.Method})
		tk.Header["kid"] = s.KeyID()
		tok, err := tk.SignedString(priv)
		require.NoError(t, err)
		return tok
	}()
	for name, tc := range map[string]struct {
		token string
		req   proto.Message
	}{
		"another payload":  {"", forged},
		"no request":       {"", nil},
		"a cancel":         {"", &adapterv1.CancelRequest{ExecutionId: signed.ExecutionId, Attempt: signed.Attempt}},
		"no req claim":     {noClaim, signed},
		"no claim nor req": {noClaim, nil},
	} {
		v, err := NewVerifier("adp", []ed25519.PublicKey{pub})
		require.NoError(t, err)
		tok := tc.token
		if tok == "" {
			tok, err = s.Sign(call)
			require.NoError(t, err)
		}
		c := call
		c.Request = tc.req
		_, err = v.Verify(tok, c)
		require.ErrorIs(t, err, ErrBinding, name)
		require.Equal(t, "binding", Check(err), name)
		// Refused before the replay cache: the token is still good for its own request.
		if tc.token == "" {
			_, err = v.Verify(tok, call)
			require.NoError(t, err, name)
		}
	}
}

// FuzzDigest: whatever request the platform sends, the adapter that decodes it computes the same
// digest, and no input makes the digest panic.
func FuzzDigest(f *testing.F) {
	b, err := proto.Marshal(fullRequest(f))
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r adapterv1.ExecuteRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		again, err := proto.Marshal(&r)
		require.NoError(t, err)
		var decoded adapterv1.ExecuteRequest
		require.NoError(t, proto.Unmarshal(again, &decoded))
		require.Equal(t, digest(t, &r), digest(t, &decoded))
	})
}
