// Package tokentest gives tests of adapters a platform key pair and a client that signs its calls
// as the platform does, so that they exercise the SDK's token check rather than turn it off.
package tokentest

import (
	"context"
	"crypto/ed25519"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// Keys is a platform key pair for one adapter id.
type Keys struct {
	AdapterID string
	Public    ed25519.PublicKey
	Private   ed25519.PrivateKey
	Signer    *platformtoken.Signer
}

// New generates a key pair for tokens addressed to adapterID.
func New(t testing.TB, adapterID string) *Keys {
	t.Helper()
	pub, priv, err := platformtoken.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return &Keys{AdapterID: adapterID, Public: pub, Private: priv, Signer: platformtoken.NewSigner(priv)}
}

// attemptRequest is what ExecuteRequest and CancelRequest have in common.
type attemptRequest interface {
	proto.Message
	GetExecutionId() string
	GetAttempt() int32
}

// DialOption signs every unary call whose request names an attempt, as the platform signs its
// calls to adapters.
func (k *Keys) DialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(attemptRequest); ok {
			deadline, _ := ctx.Deadline()
			tok, err := k.Signer.Sign(platformtoken.Call{
				AdapterID: k.AdapterID, ExecutionID: r.GetExecutionId(), Attempt: r.GetAttempt(), Method: method, Deadline: deadline,
				Request: r,
			})
			if err != nil {
				return err
			}
			ctx = metadata.AppendToOutgoingContext(ctx, platformtoken.Header, tok)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}
