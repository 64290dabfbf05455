package webhooks

import (
	"bytes"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
)

// readData skips members it does not know: a platform newer than the reader may add to the data,
// and the rest still reads.
var readData = protojson.UnmarshalOptions{DiscardUnknown: true}

// TypedData reads an event's "data" object — as the webhook body carries it, as the platform
// stores it — into the message of the event's type: an *eventsv1.ExecutionCompletedData for
// TypeExecutionCompleted, an *eventsv1.ExecutionProgressData for TypeExecutionProgress. Another
// type, or no data (empty, or JSON null), answers nil and no error. Members the message does not
// know are skipped, so that a member a later release adds does not break the read. The platform
// fills Event's and DeliverRequest's typed_data with it.
func TypedData(eventType string, data []byte) (proto.Message, error) {
	var m proto.Message
	switch eventType {
	case TypeExecutionCompleted:
		m = &eventsv1.ExecutionCompletedData{}
	case TypeExecutionProgress:
		m = &eventsv1.ExecutionProgressData{}
	default:
		return nil, nil
	}
	if len(bytes.TrimSpace(data)) == 0 || bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return nil, nil
	}
	if err := readData.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("%s data: %w", eventType, err)
	}
	return m, nil
}

// deliveredData is req's typed data, or nil when none is set.
func deliveredData(req *eventsv1.DeliverRequest) proto.Message {
	switch d := req.GetTypedData().(type) {
	case *eventsv1.DeliverRequest_ExecutionCompleted:
		return d.ExecutionCompleted
	case *eventsv1.DeliverRequest_ExecutionProgress:
		return d.ExecutionProgress
	}
	return nil
}

// typedDataOfBody checks that req's typed data, when it has any (a router before v0.2 sets none),
// is what its body's data reads as: the signature covers the body only.
func typedDataOfBody(req *eventsv1.DeliverRequest, typ string, data []byte) bool {
	got := deliveredData(req)
	if got == nil {
		return true
	}
	want, err := TypedData(typ, data)
	return err == nil && want != nil && proto.Equal(known(got), want)
}

// known is a copy of m without the fields this build does not know — a later router's, kept from
// the wire as unknown fields — which the body's reading (TypedData) skips too.
func known(m proto.Message) proto.Message {
	c := proto.Clone(m)
	dropUnknown(c.ProtoReflect())
	return c
}

func dropUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				dropUnknown(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				dropUnknown(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			dropUnknown(v.Message())
		}
		return true
	})
}
