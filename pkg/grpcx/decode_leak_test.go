package grpcx

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
)

// leakRawCodec sends the bytes it is given as the message, as a hostile client would.
type leakRawCodec struct{}

func (leakRawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (leakRawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (leakRawCodec) Name() string { return "proto" }

// A stream that sends two undecodable messages to a server-streaming method (health Watch, open
// on every public port) leaves no note behind in undecodable: grpc-go's second decode into the
// same message, for its cardinality check, used to fail the stream past the note, which stayed
// in the map for good — one entry per hostile stream.
func TestHostileStreamsLeaveNoDecodeNote(t *testing.T) {
	srv := NewServer(ServerConfig{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	notes := func() int {
		n := 0
		undecodable.Range(func(any, any) bool { n++; return true })
		return n
	}
	before := notes()
	bad := []byte{0x0a, 0x01, 0xff} // field 1 (service), a string that is not UTF-8
	watch := func(messages int) error {
		stream, err := conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
			"/grpc.health.v1.Health/Watch", grpc.ForceCodecV2(leakRawCodec{}))
		require.NoError(t, err)
		for range messages {
			_ = stream.SendMsg(&bad)
		}
		_ = stream.CloseSend()
		var resp []byte
		return stream.RecvMsg(&resp)
	}
	for i := range 1000 {
		// Two messages: grpc-go itself answers the second INTERNAL "cardinality violation" (it
		// writes that status inside RecvMsg, before any interceptor sees the error); what is
		// ours is that the note does not outlive the stream.
		err := watch(2)
		require.Error(t, err, "stream %d", i)
	}
	// grpc-go writes the cardinality status before RecvMsg returns to the wrapper that consumes
	// the note: the client can see its stream end first. Wait for the server's side to finish;
	// a note that outlives its stream never goes.
	consumed := func() bool { return notes() == before }
	require.Eventually(t, consumed, 5*time.Second, 5*time.Millisecond, "every note consumed")
	// One hostile message: the caller's INVALID_ARGUMENT.
	require.Equal(t, codes.InvalidArgument, status.Code(watch(1)))
	require.Eventually(t, consumed, 5*time.Second, 5*time.Millisecond)
}

// Two authorization values are refused: which credential counted would be chance.
func TestBearerTokenGivenTwiceIsRefused(t *testing.T) {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer a", "authorization", "Bearer b"))
	_, err := BearerToken(ctx)
	require.Equal(t, codes.Unauthenticated, status.Code(ToStatus(err).Err()), "%v", err)
	tok, err := BearerToken(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer a")))
	require.NoError(t, err)
	require.Equal(t, "a", tok)
}

// salvage names the field at fault down through message fields, stopping at protobuf's own
// types, and keeps the fields that decoded: the ids of an attempt whose result is too deep.
func TestSalvageNamesTheFieldAndKeepsTheRest(t *testing.T) {
	v := structpb.NewNullValue()
	for range 20000 {
		v = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"a": v}})
	}
	raw, err := proto.Marshal(&adapterv1.CompleteRequest{ExecutionId: "e-1", Attempt: 2, CallbackToken: "tok",
		Outcome: &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{Result: v.GetStructValue()}}})
	require.NoError(t, err)
	require.Error(t, proto.Unmarshal(raw, &adapterv1.CompleteRequest{}), "past protobuf's decoding limit")

	req := &adapterv1.CompleteRequest{}
	require.NoError(t, newDecodeCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, req))
	err = decodeFailure(req)
	require.Equal(t, codes.InvalidArgument, status.Code(ToStatus(err).Err()))
	require.Equal(t, "succeeded.result", err.(*apperr.Error).Field)
	require.Equal(t, "e-1", req.GetExecutionId())
	require.Equal(t, int32(2), req.GetAttempt())
	require.Equal(t, "tok", req.GetCallbackToken())
	require.Nil(t, req.GetOutcome(), "what of the bad field decoded is not kept")
	require.Nil(t, decodeFailure(req), "the note is consumed")

	// Malformed wire data names no field.
	req = &adapterv1.CompleteRequest{}
	require.NoError(t, newDecodeCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05, 'a'})}, req))
	require.Equal(t, "request", decodeFailure(req).(*apperr.Error).Field)
}
