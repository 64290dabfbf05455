package grpcx

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/apperr"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
)

// FuzzDecodeSalvage feeds hostile wire data to the server codec: it never fails the call (gRPC
// would answer INTERNAL) nor panics; a request that does not decode leaves exactly one note,
// naming a field of bounded length, and what salvage kept is a message that marshals again.
func FuzzDecodeSalvage(f *testing.F) {
	good, _ := proto.Marshal(&adapterv1.CompleteRequest{ExecutionId: "e", Attempt: 1, CallbackToken: "t",
		Outcome: &adapterv1.CompleteRequest_Succeeded{Succeeded: &adapterv1.Completed{}}})
	f.Add(good)
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Add([]byte{0x1a, 0x02, 0xff, 0xfe})
	f.Add([]byte{0x22, 0x04, 0x0a, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &adapterv1.CompleteRequest{}
		if err := newDecodeCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, req); err != nil {
			t.Fatalf("the codec failed the call: %v", err)
		}
		err := decodeFailure(req)
		if proto.Unmarshal(data, &adapterv1.CompleteRequest{}) == nil {
			if err != nil {
				t.Fatalf("a well-formed request was noted: %v", err)
			}
			return
		}
		e, ok := apperr.As(err)
		if !ok || e.Field == "" || len(e.Field) > 200 {
			t.Fatalf("refusal %v names no bounded field", err)
		}
		if decodeFailure(req) != nil {
			t.Fatal("the note outlived its answer")
		}
		if _, err := proto.Marshal(req); err != nil {
			t.Fatalf("salvaged message does not marshal: %v", err)
		}
	})
}
