package grpcx_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// rawCodec sends the bytes it is given as the message, as a hostile client would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

// A request the server cannot decode (a string that is not UTF-8, malformed wire data) is the
// caller's INVALID_ARGUMENT, not grpc-go's INTERNAL; the server goes on answering.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	t.Parallel()
	srv := grpcx.NewServer(grpcx.ServerConfig{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpcx.Dial(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	check := func(req []byte) error {
		var resp []byte
		return conn.Invoke(context.Background(), "/grpc.health.v1.Health/Check", &req, &resp, grpc.ForceCodecV2(rawCodec{}))
	}
	for name, tc := range map[string]struct {
		req   []byte
		field string
	}{
		"invalid UTF-8 in a string": {[]byte{0x0a, 0x02, 0xff, 0xfe}, "service"}, // HealthCheckRequest.service
		"truncated wire data":       {[]byte{0x0a, 0x05, 'a'}, "request"},
	} {
		err := check(tc.req)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		require.Contains(t, status.Convert(err).Message(), tc.field+": not a well-formed message", name)
	}
	require.NoError(t, check([]byte{}), "a well-formed request is answered")

	// A stream's message too (Watch).
	stream, err := conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true}, "/grpc.health.v1.Health/Watch", grpc.ForceCodecV2(rawCodec{}))
	require.NoError(t, err)
	bad := []byte{0x0a, 0x01, 0xff}
	require.NoError(t, stream.SendMsg(&bad))
	require.NoError(t, stream.CloseSend())
	var resp []byte
	err = stream.RecvMsg(&resp)
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
}
