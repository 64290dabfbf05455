package grpcx

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec decodeCodec wraps
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/safetext"
)

// A request gRPC cannot decode — a string that is not valid UTF-8, nesting past protobuf's
// recursion limit (a structpb payload a few thousand levels deep), malformed wire data — is the
// caller's error. But grpc-go answers a codec failure INTERNAL, before any interceptor runs. So
// the server's codec (decodeCodec) takes the failure instead of returning it: it resets the
// message, notes the failure against it in undecodable, and returns nil; the first interceptor
// (decodeInterceptor, and decodeStreamInterceptor for streams) finds the note for the request
// it is handed and answers INVALID_ARGUMENT. The note lives from one to the other, on the same
// goroutine's call path: the generated handler decodes the request and passes that very
// message to the interceptor chain.
var undecodable sync.Map // request message (pointer) → error

type decodeCodec struct{ encoding.CodecV2 }

func newDecodeCodec() decodeCodec {
	return decodeCodec{encoding.GetCodecV2("proto")}
}

func (c decodeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	proto.Reset(m)
	undecodable.Store(v, err)
	return nil
}

// decodeFailure answers a request whose decoding failed (and forgets the note), or nil.
func decodeFailure(req any) error {
	v, ok := undecodable.LoadAndDelete(req)
	if !ok {
		return nil
	}
	return apperr.Invalid("request", "not a well-formed message: %s", safetext.Truncate(v.(error).Error(), 256))
}

func decodeInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := decodeFailure(req); err != nil {
		return nil, ToStatus(err).Err()
	}
	return handler(ctx, req)
}

func decodeStreamInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, decodeStream{ss})
}

type decodeStream struct{ grpc.ServerStream }

// RecvMsg consumes the note whatever the wrapped call answered: on a server-streaming method
// grpc-go decodes a second message into the same m to refuse it ("cardinality violation",
// INTERNAL), after the codec noted the first; returning that error early left the note in
// undecodable for good, one entry per hostile stream. A noted failure is the answer: the
// request was not well-formed, INVALID_ARGUMENT, whatever else went wrong after.
func (s decodeStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if derr := decodeFailure(m); derr != nil {
		return ToStatus(derr).Err()
	}
	return err
}
