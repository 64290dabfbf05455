package grpcx

import (
	"cmp"
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec decodeCodec wraps
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

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
var undecodable sync.Map // request message (pointer) → decodeNote

type decodeCodec struct{ encoding.CodecV2 }

func newDecodeCodec() decodeCodec {
	return decodeCodec{encoding.GetCodecV2("proto")}
}

// decodeNote is what the codec noted of a request it could not decode.
type decodeNote struct {
	// field is the dotted path of the field that failed ("succeeded.result"), or "" when the
	// wire data itself is malformed.
	field string
	err   error
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
	field := salvage(data.Materialize(), m.ProtoReflect(), 0)
	undecodable.Store(v, decodeNote{field: field, err: err})
	return nil
}

// salvageDepth bounds how deep salvage names a field (and the work it does for it).
const salvageDepth = 4

// salvage decodes into m every top-level field of b that decodes on its own, and names the first
// that does not: a dotted path down through message fields, stopping at protobuf's own types
// (a Struct is named, not its innermost key). The service can then tell which field was at fault
// and, where it opted in (UndecodableAcceptor), act on the fields that did decode — the ids of
// the attempt whose result could not be decoded. "" means the wire data itself is malformed.
func salvage(b []byte, m protoreflect.Message, depth int) string {
	bad := ""
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return bad
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return bad
		}
		record := b[:n+vn]
		value := b[n : n+vn]
		b = b[n+vn:]
		if (proto.UnmarshalOptions{Merge: true}).Unmarshal(record, m.Interface()) == nil {
			continue
		}
		fd := m.Descriptor().Fields().ByNumber(num)
		if fd == nil {
			continue // an unknown field is kept as such: it cannot fail
		}
		m.Clear(fd) // what of it decoded before the failure is not to be used
		if bad != "" {
			continue
		}
		bad = string(fd.Name())
		if fd.Kind() == protoreflect.MessageKind && fd.Cardinality() != protoreflect.Repeated && typ == protowire.BytesType &&
			depth+1 < salvageDepth && !strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.") {
			inner, _ := protowire.ConsumeBytes(value)
			if sub := salvage(inner, m.NewField(fd).Message(), depth+1); sub != "" {
				bad += "." + sub
			}
		}
	}
	return bad
}

// UndecodableAcceptor is a service that answers, itself, a request of the methods it names that
// could not be decoded: its handler is called with what of the request did decode, and
// Undecodable(ctx) is the refusal naming the field that did not. The adapter callback service
// does, for an adapter's result that cannot be decoded is the adapter's protocol failure, which
// it records on the attempt — refused before its handler, the attempt ran on until its lease
// ended and the provider work ran again.
type UndecodableAcceptor interface {
	AcceptsUndecodable(fullMethod string) bool
}

type undecodableKey struct{}

// Undecodable is the refusal of the request being handled if it could not be decoded (only for
// an UndecodableAcceptor's methods), or nil.
func Undecodable(ctx context.Context) error {
	err, _ := ctx.Value(undecodableKey{}).(error)
	return err
}

// decodeFailure answers a request whose decoding failed (and forgets the note), or nil.
func decodeFailure(req any) error {
	v, ok := undecodable.LoadAndDelete(req)
	if !ok {
		return nil
	}
	note := v.(decodeNote)
	field := cmp.Or(note.field, "request")
	return apperr.Invalid(field, "not a well-formed message: %s", safetext.Truncate(note.err.Error(), 256))
}

func decodeInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := decodeFailure(req); err != nil {
		if a, ok := info.Server.(UndecodableAcceptor); ok && a.AcceptsUndecodable(info.FullMethod) {
			return handler(context.WithValue(ctx, undecodableKey{}, err), req)
		}
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
