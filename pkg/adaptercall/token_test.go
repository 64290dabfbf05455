package adaptercall_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken/tokentest"
)

// tokenRecorder answers every call and keeps the platform token each carried, and its request.
type tokenRecorder struct {
	adapterv1.UnimplementedAdapterServiceServer
	tokens   chan string
	requests chan proto.Message
}

func (r *tokenRecorder) keep(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(platformtoken.Header)
	if len(v) != 1 {
		r.tokens <- ""
		return
	}
	r.tokens <- v[0]
}

func (r *tokenRecorder) Execute(ctx context.Context, in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	r.keep(ctx)
	r.requests <- in
	return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Completed{Completed: &adapterv1.Completed{}}}, nil
}

func (r *tokenRecorder) Cancel(ctx context.Context, in *adapterv1.CancelRequest) (*adapterv1.CancelResponse, error) {
	r.keep(ctx)
	r.requests <- in
	return &adapterv1.CancelResponse{}, nil
}

func serve(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestCallsCarryABoundPlatformToken: Execute and Cancel each carry a token for the adapter, the
// execution, the attempt and the method, that expires with the call.
func TestCallsCarryABoundPlatformToken(t *testing.T) {
	t.Parallel()
	keys := tokentest.New(t, "adp-1")
	rec := &tokenRecorder{tokens: make(chan string, 2), requests: make(chan proto.Message, 2)}
	addr := serve(t, func(s *grpc.Server) { adapterv1.RegisterAdapterServiceServer(s, rec) })
	p := adaptercall.NewPool(adaptercall.WithSigner(keys.Signer))
	t.Cleanup(func() { _ = p.Close() })
	target := adaptercall.Adapter{ID: "adp-1", Endpoint: addr}

	deadline := time.Now().Add(7 * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	payload, err := structpb.NewStruct(map[string]any{"to": "a@example.com"})
	require.NoError(t, err)
	out := p.Execute(ctx, target, &adapterv1.ExecuteRequest{ExecutionId: "exec-9", Attempt: 4, Capability: "email.send", Payload: payload})
	require.Equal(t, execution.OutcomeCompleted, out.Kind)
	_, err = p.Cancel(context.Background(), target, "exec-9", 4)
	require.NoError(t, err)

	v, err := platformtoken.NewVerifier("adp-1", []ed25519.PublicKey{keys.Public})
	require.NoError(t, err)
	// Bound to the request as the adapter received it.
	exec := platformtoken.Call{ExecutionID: "exec-9", Attempt: 4, Method: adapterv1.AdapterService_Execute_FullMethodName, Request: <-rec.requests}
	c, err := v.Verify(<-rec.tokens, exec)
	require.NoError(t, err)
	require.Equal(t, "exec-9", c.Subject)
	require.Equal(t, []string{"adp-1"}, []string(c.Audience))
	require.EqualValues(t, 4, c.Attempt)
	require.WithinDuration(t, deadline.Add(platformtoken.Skew), c.ExpiresAt.Time, time.Second, "expires with the call")

	_, err = v.Verify(<-rec.tokens, platformtoken.Call{ExecutionID: "exec-9", Attempt: 4, Method: adapterv1.AdapterService_Cancel_FullMethodName,
		Request: <-rec.requests})
	require.NoError(t, err, "Cancel's token is for Cancel")
}

// TestRefusedTokenIsNotSent: an adapter on the SDK that does not trust the platform's key refuses
// the call before its handler: the outcome is NotSent and Refused (no attempt spent), with a
// message that names no key; with the right key the same adapter answers.
func TestRefusedTokenIsNotSent(t *testing.T) {
	t.Parallel()
	trusted, other := tokentest.New(t, "adp-1"), tokentest.New(t, "adp-1")
	var ran atomic.Int32
	ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result {
		ran.Add(1)
		return adapter.Complete(nil)
	}, adapter.Options{Logger: zaptest.NewLogger(t), AdapterID: "adp-1", PlatformKeys: []ed25519.PublicKey{trusted.Public}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ad.Close() })
	addr := serve(t, func(s *grpc.Server) { ad.Register(s) })
	target := adaptercall.Adapter{ID: "adp-1", Endpoint: addr}

	for name, p := range map[string]*adaptercall.Pool{
		"another key": adaptercall.NewPool(adaptercall.WithSigner(other.Signer)),
		"no token":    adaptercall.NewPool(),
	} {
		t.Cleanup(func() { _ = p.Close() })
		out := p.Execute(context.Background(), target, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
		require.Equal(t, execution.OutcomeFailed, out.Kind, name)
		require.True(t, out.NotSent, name)
		require.True(t, out.Refused, name)
		require.True(t, out.Retryable, name)
		require.Equal(t, execution.ClassUnavailable, out.Failure.Class, name)
		require.Equal(t, "adapter refused the platform's credential", out.Failure.Message, name)
	}
	require.Zero(t, ran.Load(), "the handler never ran")

	p := adaptercall.NewPool(adaptercall.WithSigner(trusted.Signer))
	t.Cleanup(func() { _ = p.Close() })
	out := p.Execute(context.Background(), target, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
	require.Equal(t, execution.OutcomeCompleted, out.Kind)
	require.EqualValues(t, 1, ran.Load())
	_, err = p.Cancel(context.Background(), adaptercall.Adapter{ID: "adp-2", Endpoint: addr}, "e", 1)
	require.Error(t, err, "a token for another adapter does not cancel")
}

// workThenUnauthenticated is an adapter not on the SDK that does the work, then answers
// UNAUTHENTICATED because its provider refused its key (with details, optionally).
type workThenUnauthenticated struct {
	adapterv1.UnimplementedAdapterServiceServer
	work    atomic.Int32
	details []protoadapt.MessageV1
}

func (w *workThenUnauthenticated) Execute(context.Context, *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	w.work.Add(1)
	st, err := status.New(codes.Unauthenticated, "provider rejected our API key").WithDetails(w.details...)
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

// TestUnauthenticatedWithoutTheMarkerSpendsTheAttempt: only the SDK's marked refusal means that
// nothing ran. An UNAUTHENTICATED of an adapter's own (its provider refused its key, perhaps
// after the work), or one marked by another domain, spends the attempt and keeps its message.
func TestUnauthenticatedWithoutTheMarkerSpendsTheAttempt(t *testing.T) {
	t.Parallel()
	keys := tokentest.New(t, "adp-1")
	for name, details := range map[string][]protoadapt.MessageV1{
		"no details":     nil,
		"another domain": {&errdetails.ErrorInfo{Domain: "provider.example", Reason: adaptercall.TokenRefusedReason}},
		"another reason": {&errdetails.ErrorInfo{Domain: adaptercall.TokenRefusedDomain, Reason: "KEY_REVOKED"}},
	} {
		w := &workThenUnauthenticated{details: details}
		addr := serve(t, func(s *grpc.Server) { adapterv1.RegisterAdapterServiceServer(s, w) })
		p := adaptercall.NewPool(adaptercall.WithSigner(keys.Signer))
		t.Cleanup(func() { _ = p.Close() })
		out := p.Execute(context.Background(), adaptercall.Adapter{ID: "adp-1", Endpoint: addr}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
		require.EqualValues(t, 1, w.work.Load(), name)
		require.Equal(t, execution.OutcomeFailed, out.Kind, name)
		require.False(t, out.NotSent, "%s: the work ran, the attempt is spent", name)
		require.False(t, out.Refused, name)
		require.False(t, out.Replayed, name)
		require.True(t, out.Retryable, name)
		require.Equal(t, codes.Unauthenticated.String(), out.Failure.Code, name)
		require.Equal(t, "adapter answered Unauthenticated: provider rejected our API key", out.Failure.Message, name)
		// A marker got wrong is named, for the platform's warning to the adapter's author.
		require.Equal(t, details != nil, out.MalformedRefusal != "", "%s: %q", name, out.MalformedRefusal)
	}
}

// TestIsTokenRefusal: the SDK's refusal is recognised, wrapped too; a bare UNAUTHENTICATED is not.
func TestIsTokenRefusal(t *testing.T) {
	t.Parallel()
	marked, err := status.New(codes.Unauthenticated, "refused").WithDetails(
		&errdetails.ErrorInfo{Domain: adaptercall.TokenRefusedDomain, Reason: adaptercall.TokenRefusedReason})
	require.NoError(t, err)
	require.True(t, adaptercall.IsTokenRefusal(marked.Err()))
	require.True(t, adaptercall.IsTokenRefusal(fmt.Errorf("cancel: %w", marked.Err())))
	require.False(t, adaptercall.IsTokenRefusal(status.Error(codes.Unauthenticated, "refused")))
	require.False(t, adaptercall.IsTokenRefusal(nil))
	otherCode, err := status.New(codes.PermissionDenied, "refused").WithDetails(
		&errdetails.ErrorInfo{Domain: adaptercall.TokenRefusedDomain, Reason: adaptercall.TokenRefusedReason})
	require.NoError(t, err)
	require.False(t, adaptercall.IsTokenRefusal(otherCode.Err()))
}

// TestReplayedTokenSpendsTheAttempt: an adapter that saw the call's token used before (someone
// captured it and ran this very request first) refuses it; the work may have run, so the attempt
// is spent — Replayed, neither NotSent nor Refused.
func TestReplayedTokenSpendsTheAttempt(t *testing.T) {
	t.Parallel()
	keys := tokentest.New(t, "adp-1")
	var ran atomic.Int32
	ad, err := adapter.New(func(context.Context, *adapter.Request) adapter.Result {
		ran.Add(1)
		return adapter.Complete(nil)
	}, adapter.Options{Logger: zaptest.NewLogger(t), AdapterID: "adp-1", PlatformKeys: []ed25519.PublicKey{keys.Public}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ad.Close() })
	// The attacker's copy reaches the adapter first: the handler runs it on a context of its own
	// (its answer goes elsewhere), then the platform's call arrives with the same token.
	attackerFirst := grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if _, err := h(metadata.NewIncomingContext(context.Background(), md), req); err != nil {
			return nil, err
		}
		return h(ctx, req)
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(attackerFirst)
	ad.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	p := adaptercall.NewPool(adaptercall.WithSigner(keys.Signer))
	t.Cleanup(func() { _ = p.Close() })
	out := p.Execute(context.Background(), adaptercall.Adapter{ID: "adp-1", Endpoint: lis.Addr().String()},
		&adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
	require.EqualValues(t, 1, ran.Load(), "the attacker's copy ran")
	require.Equal(t, execution.OutcomeFailed, out.Kind)
	require.True(t, out.Replayed)
	require.False(t, out.NotSent, "the work may have run")
	require.False(t, out.Refused)
	require.Equal(t, "adapter refused the platform's credential", out.Failure.Message)
}

// refuseAfterReceipt acknowledges the call, then answers the refusal marker: a contradiction.
type refuseAfterReceipt struct {
	adapterv1.UnimplementedAdapterServiceServer
}

func (refuseAfterReceipt) Execute(ctx context.Context, _ *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	if err := grpc.SendHeader(ctx, metadata.Pairs(platformtoken.ReceivedHeader, "1")); err != nil {
		return nil, err
	}
	return nil, platformtoken.RefusalStatus(fmt.Errorf("%w: %w", platformtoken.ErrRefused, platformtoken.ErrKey)).Err()
}

// TestRefusalAfterReceiptSpendsTheAttempt: a marker sent after the integrations-received header
// is not taken (the handler may have started): the attempt is spent, and the problem named.
func TestRefusalAfterReceiptSpendsTheAttempt(t *testing.T) {
	t.Parallel()
	keys := tokentest.New(t, "adp-1")
	addr := serve(t, func(s *grpc.Server) { adapterv1.RegisterAdapterServiceServer(s, refuseAfterReceipt{}) })
	p := adaptercall.NewPool(adaptercall.WithSigner(keys.Signer))
	t.Cleanup(func() { _ = p.Close() })
	out := p.Execute(context.Background(), adaptercall.Adapter{ID: "adp-1", Endpoint: addr}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
	require.Equal(t, execution.OutcomeFailed, out.Kind)
	require.False(t, out.NotSent)
	require.False(t, out.Refused)
	require.Contains(t, out.MalformedRefusal, "integrations-received")
}
