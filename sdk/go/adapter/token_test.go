package adapter_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken/tokentest"
)

const tokenAdapterID = "tok-adapter"

// authBundle is an SDK server that trusts two platform keys (a rotation in progress), reached by
// a client that sends whatever token a test puts on the call.
type authBundle struct {
	client     adapterv1.AdapterServiceClient
	old, new   *tokentest.Keys
	handlerRan atomic.Int32
}

func setupAuth(t *testing.T) *authBundle { return setupAuthOn(t, grpc.NewServer()) }

// setupAuthOn is setupAuth on srv.
func setupAuthOn(t *testing.T, srv *grpc.Server) *authBundle {
	t.Helper()
	b := &authBundle{old: tokentest.New(t, tokenAdapterID), new: tokentest.New(t, tokenAdapterID)}
	s, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result {
		b.handlerRan.Add(1)
		return adapter.Complete(map[string]any{"ok": true})
	}, adapter.Options{Logger: zaptest.NewLogger(t), AdapterID: tokenAdapterID,
		PlatformKeys: []ed25519.PublicKey{b.old.Public, b.new.Public}})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	conn, err := dialTest(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop(); require.NoError(t, s.Close()) })
	b.client = adapterv1.NewAdapterServiceClient(conn)
	return b
}

func withToken(tok string) context.Context {
	if tok == "" {
		return context.Background()
	}
	return metadata.AppendToOutgoingContext(context.Background(), platformtoken.Header, tok)
}

// execRequest is the request the tests send: an Execute of exec-1 attempt 2.
func execRequest() *adapterv1.ExecuteRequest {
	return &adapterv1.ExecuteRequest{ExecutionId: "exec-1", Attempt: 2, Capability: "c"}
}

// sign is a token from k for execRequest, as the platform signs it.
func sign(t *testing.T, k *tokentest.Keys, edit func(*platformtoken.Call)) string {
	t.Helper()
	c := platformtoken.Call{AdapterID: tokenAdapterID, ExecutionID: "exec-1", Attempt: 2,
		Method: adapterv1.AdapterService_Execute_FullMethodName, Deadline: time.Now().Add(10 * time.Second), Request: execRequest()}
	if edit != nil {
		edit(&c)
	}
	tok, err := k.Signer.Sign(c)
	require.NoError(t, err)
	return tok
}

// forge signs claims of a test's choosing with priv, under kid.
func forge(t *testing.T, priv ed25519.PrivateKey, kid string, edit func(*platformtoken.Claims)) string {
	t.Helper()
	tk := jwt.NewWithClaims(jwt.SigningMethodEdDSA, claims(t, edit))
	tk.Header["kid"] = kid
	s, err := tk.SignedString(priv)
	require.NoError(t, err)
	return s
}

// claims are valid claims for execRequest, edited.
func claims(t *testing.T, edit func(*platformtoken.Claims)) platformtoken.Claims {
	t.Helper()
	digest, err := platformtoken.Digest(execRequest())
	require.NoError(t, err)
	now := time.Now()
	c := platformtoken.Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: platformtoken.Issuer, Subject: "exec-1", Audience: jwt.ClaimStrings{tokenAdapterID},
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute)), ID: "forged-" + now.String(),
		},
		Attempt: 2, Method: adapterv1.AdapterService_Execute_FullMethodName, Request: digest,
	}
	if edit != nil {
		edit(&c)
	}
	return c
}

func (b *authBundle) execute(tok string) (*adapterv1.ExecuteResponse, metadata.MD, error) {
	return b.executeRequest(tok, execRequest())
}

func (b *authBundle) executeRequest(tok string, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, metadata.MD, error) {
	var header metadata.MD
	resp, err := b.client.Execute(withToken(tok), req, grpc.Header(&header))
	return resp, header, err
}

// TestPlatformTokenAccepted: a token signed by either key of a rotation runs the handler.
func TestPlatformTokenAccepted(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	for _, k := range []*tokentest.Keys{b.old, b.new} {
		resp, header, err := b.execute(sign(t, k, nil))
		require.NoError(t, err)
		require.NotNil(t, resp.GetCompleted())
		require.NotEmpty(t, header.Get(platformtoken.ReceivedHeader), "received is acknowledged once the token passed")
	}
	require.EqualValues(t, 2, b.handlerRan.Load())
}

// TestPlatformTokenRefusals: every way a token can be wrong is refused with UNAUTHENTICATED,
// before the received header and without the handler running.
func TestPlatformTokenRefusals(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	stranger := tokentest.New(t, tokenAdapterID)
	reused := sign(t, b.new, nil)
	_, _, err := b.execute(reused)
	require.NoError(t, err, "the first use of a token is accepted")
	ran := b.handlerRan.Load()

	tampered := func() string {
		parts := strings.Split(sign(t, b.new, nil), ".")
		claims, err := base64.RawURLEncoding.DecodeString(parts[1])
		require.NoError(t, err)
		parts[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(claims), `"att":2`, `"att":3`, 1)))
		return strings.Join(parts, ".")
	}()
	_, otherPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	// The classic confusions: HMAC keyed with the public key's bytes, and no signature at all,
	// both under the kid of a trusted key.
	hs256 := func() string {
		tk := jwt.NewWithClaims(jwt.SigningMethodHS256, claims(t, nil))
		tk.Header["kid"] = b.new.Signer.KeyID()
		s, err := tk.SignedString([]byte(b.new.Public))
		require.NoError(t, err)
		return s
	}()
	none := func() string {
		tk := jwt.NewWithClaims(jwt.SigningMethodNone, claims(t, nil))
		tk.Header["kid"] = b.new.Signer.KeyID()
		s, err := tk.SignedString(jwt.UnsafeAllowNoneSignatureType)
		require.NoError(t, err)
		return s
	}()
	forged := func(edit func(*adapterv1.ExecuteRequest)) *adapterv1.ExecuteRequest {
		r := execRequest()
		edit(r)
		return r
	}

	for name, tc := range map[string]struct {
		token string
		why   error
		// req is what the caller sends with the token (nil: execRequest, which it was signed for).
		req *adapterv1.ExecuteRequest
	}{
		"missing":           {"", platformtoken.ErrMissing, nil},
		"not a JWT":         {"not-a-token", platformtoken.ErrInvalid, nil},
		"unknown key":       {sign(t, stranger, nil), platformtoken.ErrKey, nil},
		"bad signature":     {forge(t, otherPriv, b.new.Signer.KeyID(), nil), platformtoken.ErrInvalid, nil},
		"tampered claims":   {tampered, platformtoken.ErrInvalid, nil},
		"wrong audience":    {sign(t, b.new, func(c *platformtoken.Call) { c.AdapterID = "another-adapter" }), platformtoken.ErrAudience, nil},
		"another execution": {sign(t, b.new, func(c *platformtoken.Call) { c.ExecutionID = "exec-2" }), platformtoken.ErrBinding, nil},
		"another attempt":   {sign(t, b.new, func(c *platformtoken.Call) { c.Attempt = 1 }), platformtoken.ErrBinding, nil},
		"another method":    {sign(t, b.new, func(c *platformtoken.Call) { c.Method = adapterv1.AdapterService_Cancel_FullMethodName }), platformtoken.ErrBinding, nil},
		"replayed":          {reused, platformtoken.ErrReplayed, nil},
		// Within the maximum lifetime, so that only the expiry is at fault.
		"expired": {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) {
			c.IssuedAt = jwt.NewNumericDate(time.Now().Add(-60 * time.Second))
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Second))
		}), platformtoken.ErrInvalid, nil},
		"HS256 keyed with the public key": {hs256, platformtoken.ErrInvalid, nil},
		"alg none":                        {none, platformtoken.ErrInvalid, nil},
		"another capability":              {sign(t, b.new, nil), platformtoken.ErrBinding, forged(func(r *adapterv1.ExecuteRequest) { r.Capability = "forged.capability" })},
		"another payload": {sign(t, b.new, nil), platformtoken.ErrBinding, forged(func(r *adapterv1.ExecuteRequest) {
			r.Payload, _ = structpb.NewStruct(map[string]any{"to": "attacker@example.com"})
		})},
		"another mode":           {sign(t, b.new, nil), platformtoken.ErrBinding, forged(func(r *adapterv1.ExecuteRequest) { r.Mode = executionv1.Mode_MODE_SYNC })},
		"another callback token": {sign(t, b.new, nil), platformtoken.ErrBinding, forged(func(r *adapterv1.ExecuteRequest) { r.CallbackToken = "cbt_attacker" })},
		"no request digest":      {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.Request = "" }), platformtoken.ErrBinding, nil},
		"no expiry":              {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.ExpiresAt = nil }), platformtoken.ErrInvalid, nil},
		"lives too long":         {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour)) }), platformtoken.ErrInvalid, nil},
		"issued in the future": {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) {
			c.IssuedAt = jwt.NewNumericDate(time.Now().Add(10 * time.Minute))
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(11 * time.Minute))
		}), platformtoken.ErrInvalid, nil},
		"wrong issuer": {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.Issuer = "someone" }), platformtoken.ErrInvalid, nil},
		"no token id":  {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.ID = "" }), platformtoken.ErrInvalid, nil},
	} {
		t.Run(name, func(t *testing.T) {
			req := tc.req
			if req == nil {
				req = execRequest()
			}
			resp, header, err := b.executeRequest(tc.token, req)
			require.Nil(t, resp)
			require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.why.Error())
			require.Empty(t, header.Get(platformtoken.ReceivedHeader), "refused before the received header")
			requireRefusalMarker(t, err, platformtoken.Check(tc.why))
		})
	}
	require.Equal(t, ran, b.handlerRan.Load(), "the handler never ran for a refused call")
}

// requireRefusalMarker: err carries the SDK's ErrorInfo marker, naming the check that failed.
func requireRefusalMarker(t *testing.T, err error, check string) {
	t.Helper()
	require.True(t, platformtoken.ReadRefusal(err, false).Marked, "%v", err)
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == platformtoken.RefusalDomain {
			require.Equal(t, platformtoken.RefusalReason, info.GetReason())
			require.Equal(t, check, info.GetMetadata()[platformtoken.RefusalCheckKey])
			return
		}
	}
	t.Fatalf("no ErrorInfo of %s on %v", platformtoken.RefusalDomain, err)
}

// TestPlatformTokenOnCancel: Cancel is refused without a token for its attempt, taken with one.
func TestPlatformTokenOnCancel(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	req := &adapterv1.CancelRequest{ExecutionId: "exec-1", Attempt: 2}
	_, err := b.client.Cancel(context.Background(), req)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	_, err = b.client.Cancel(withToken(sign(t, b.new, nil)), req)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "an Execute token does not cancel")
	_, err = b.client.Cancel(withToken(sign(t, b.new, func(c *platformtoken.Call) {
		c.Method = adapterv1.AdapterService_Cancel_FullMethodName
	})), req)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "bound to the Execute request, not this one")
	resp, err := b.client.Cancel(withToken(sign(t, b.new, func(c *platformtoken.Call) {
		c.Method = adapterv1.AdapterService_Cancel_FullMethodName
		c.Request = req
	})), req)
	require.NoError(t, err)
	require.False(t, resp.GetStopped())
}

// TestNewRequiresPlatformKeys: an adapter that forgot its keys does not start; the opt-out is
// explicit.
func TestNewRequiresPlatformKeys(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *adapter.Request) adapter.Result { return adapter.Complete(nil) }
	k := tokentest.New(t, tokenAdapterID)
	_, err := adapter.New(h, adapter.Options{})
	require.ErrorContains(t, err, "PlatformKeys")
	_, err = adapter.New(h, adapter.Options{AdapterID: "a"})
	require.ErrorContains(t, err, "public key")
	_, err = adapter.New(h, adapter.Options{PlatformKeys: []ed25519.PublicKey{k.Public}})
	require.ErrorContains(t, err, "adapter id")
	s, err := adapter.New(h, adapter.Options{InsecureSkipPlatformAuth: true})
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

// TestRefusalsDoNotFloodTheLog: a caller without a token cannot write a log line per call: at
// most one a second, and the next counts those left out.
func TestRefusalsDoNotFloodTheLog(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.WarnLevel)
	s, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result { return adapter.Complete(nil) },
		adapter.Options{Logger: zap.New(core), AdapterID: tokenAdapterID, PlatformKeys: []ed25519.PublicKey{tokentest.New(t, tokenAdapterID).Public}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	s.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := dialTest(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := adapterv1.NewAdapterServiceClient(conn)

	const calls = 50
	start := time.Now()
	for range calls {
		_, err := client.Execute(context.Background(), execRequest())
		require.Equal(t, codes.Unauthenticated, status.Code(err))
	}
	elapsed := time.Since(start)
	lines := logs.FilterMessage("call refused: platform token").All()
	require.NotEmpty(t, lines)
	require.LessOrEqual(t, len(lines), 1+int(elapsed/time.Second), "one line a second at most")
	logged := 0
	for _, l := range lines {
		logged += 1 + int(l.ContextMap()["refused_unlogged"].(int64))
	}
	require.LessOrEqual(t, logged, calls, "no refusal counted twice")
}
