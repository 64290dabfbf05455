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
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/adapter"
	"github.com/integrations-platform/integrations/pkg/adaptercall"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/platformtoken"
	"github.com/integrations-platform/integrations/pkg/platformtoken/tokentest"
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

// setupAuthOn is setupAuth on srv: a plain grpc.Server, or the platform's grpcx one, whose error
// mapping must keep the refusal UNAUTHENTICATED too.
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
	conn, err := grpcx.Dial(lis.Addr().String())
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

// sign is a token from k for an Execute of exec-1 attempt 2, as the platform signs it.
func sign(t *testing.T, k *tokentest.Keys, edit func(*platformtoken.Call)) string {
	t.Helper()
	c := platformtoken.Call{AdapterID: tokenAdapterID, ExecutionID: "exec-1", Attempt: 2,
		Method: adapterv1.AdapterService_Execute_FullMethodName, Deadline: time.Now().Add(10 * time.Second)}
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
	now := time.Now()
	c := platformtoken.Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: platformtoken.Issuer, Subject: "exec-1", Audience: jwt.ClaimStrings{tokenAdapterID},
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute)), ID: "forged-" + now.String(),
		},
		Attempt: 2, Method: adapterv1.AdapterService_Execute_FullMethodName,
	}
	if edit != nil {
		edit(&c)
	}
	tk := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
	tk.Header["kid"] = kid
	s, err := tk.SignedString(priv)
	require.NoError(t, err)
	return s
}

func (b *authBundle) execute(tok string) (*adapterv1.ExecuteResponse, metadata.MD, error) {
	var header metadata.MD
	resp, err := b.client.Execute(withToken(tok), &adapterv1.ExecuteRequest{ExecutionId: "exec-1", Attempt: 2, Capability: "c"},
		grpc.Header(&header))
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
		require.NotEmpty(t, header.Get(adaptercall.ReceivedHeader), "received is acknowledged once the token passed")
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

	for name, tc := range map[string]struct {
		token string
		why   error
	}{
		"missing":           {"", platformtoken.ErrMissing},
		"not a JWT":         {"not-a-token", platformtoken.ErrInvalid},
		"unknown key":       {sign(t, stranger, nil), platformtoken.ErrKey},
		"bad signature":     {forge(t, otherPriv, b.new.Signer.KeyID(), nil), platformtoken.ErrInvalid},
		"tampered claims":   {tampered, platformtoken.ErrInvalid},
		"wrong audience":    {sign(t, b.new, func(c *platformtoken.Call) { c.AdapterID = "another-adapter" }), platformtoken.ErrAudience},
		"another execution": {sign(t, b.new, func(c *platformtoken.Call) { c.ExecutionID = "exec-2" }), platformtoken.ErrBinding},
		"another attempt":   {sign(t, b.new, func(c *platformtoken.Call) { c.Attempt = 1 }), platformtoken.ErrBinding},
		"another method":    {sign(t, b.new, func(c *platformtoken.Call) { c.Method = adapterv1.AdapterService_Cancel_FullMethodName }), platformtoken.ErrBinding},
		"replayed":          {reused, platformtoken.ErrReplayed},
		"expired": {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) {
			c.IssuedAt = jwt.NewNumericDate(time.Now().Add(-2 * time.Minute))
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Second))
		}), platformtoken.ErrInvalid},
		"no expiry":      {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.ExpiresAt = nil }), platformtoken.ErrInvalid},
		"lives too long": {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour)) }), platformtoken.ErrInvalid},
		"issued in the future": {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) {
			c.IssuedAt = jwt.NewNumericDate(time.Now().Add(10 * time.Minute))
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(11 * time.Minute))
		}), platformtoken.ErrInvalid},
		"wrong issuer": {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.Issuer = "someone" }), platformtoken.ErrInvalid},
		"no token id":  {forge(t, b.new.Private, b.new.Signer.KeyID(), func(c *platformtoken.Claims) { c.ID = "" }), platformtoken.ErrInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			resp, header, err := b.execute(tc.token)
			require.Nil(t, resp)
			require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.why.Error())
			require.Empty(t, header.Get(adaptercall.ReceivedHeader), "refused before the received header")
		})
	}
	require.Equal(t, ran, b.handlerRan.Load(), "the handler never ran for a refused call")
}

// TestPlatformTokenRefusedOnAGrpcxServer: served by grpcx.Server (as the dummy adapter is), a
// refusal is still UNAUTHENTICATED with its reason, not mapped to INTERNAL.
func TestPlatformTokenRefusedOnAGrpcxServer(t *testing.T) {
	t.Parallel()
	b := setupAuthOn(t, grpcx.NewServer(grpcx.ServerConfig{Logger: zaptest.NewLogger(t)}).Server)
	_, _, err := b.execute("")
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), platformtoken.ErrMissing.Error())
	resp, _, err := b.execute(sign(t, b.old, nil))
	require.NoError(t, err)
	require.NotNil(t, resp.GetCompleted())
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
	resp, err := b.client.Cancel(withToken(sign(t, b.new, func(c *platformtoken.Call) {
		c.Method = adapterv1.AdapterService_Cancel_FullMethodName
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
