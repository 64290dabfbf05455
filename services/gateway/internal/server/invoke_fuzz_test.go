package server

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/integrations-platform/integrations/pkg/apperr"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
)

// checkInvoke is the invariant of the invoke fuzz targets: validateInvoke refuses with
// INVALID_ARGUMENT naming a field and a bounded message, or what it accepts is storable — the
// payload's JSON valid UTF-8 without a NUL escape and at most jsonbound.MaxDepth deep, the
// idempotency key printable ASCII, the capability a capability name.
func checkInvoke(t *testing.T, req *gatewayv1.InvokeCapabilityRequest, key string) {
	s := &Server{opts: Options{MaxPayloadBytes: 1 << 20}}
	ctx := context.Background()
	if key != "" && utf8.ValidString(key) {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(IdempotencyKeyHeader, key))
	}
	in, err := s.validateInvoke(ctx, req)
	if err != nil {
		e, ok := apperr.As(err)
		if !ok || e.Kind != apperr.KindInvalidArgument || e.Field == "" {
			t.Fatalf("refusal is not INVALID_ARGUMENT naming a field: %v", err)
		}
		if len(e.Message) > 512 {
			t.Fatalf("refusal message of %d bytes on %s", len(e.Message), e.Field)
		}
		return
	}
	if !utf8.Valid(in.payload) || bytes.Contains(in.payload, []byte(`\u0000`)) || !json.Valid(in.payload) {
		t.Fatalf("accepted payload not storable: %.200q", in.payload)
	}
	if d := invokeDepth(in.payload); d > jsonbound.MaxDepth {
		t.Fatalf("accepted payload %d deep", d)
	}
	if strings.ContainsFunc(in.idempotencyKey, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		t.Fatalf("accepted idempotency key %q", in.idempotencyKey)
	}
	if !capabilityPattern.MatchString(req.GetCapability()) {
		t.Fatalf("accepted capability %q", req.GetCapability())
	}
}

func invokeDepth(raw []byte) int {
	d, most, inString, escaped := 0, 0, false, false
	for _, c := range raw {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && (c == '{' || c == '['):
			d++
			most = max(most, d)
		case !inString && (c == '}' || c == ']'):
			d--
		}
	}
	return most
}

// FuzzInvokeBody is the REST invoke: the body decoded as grpc-gateway decodes it (protojson,
// unknown fields refused), the capability from the path, the Idempotency-Key header.
func FuzzInvokeBody(f *testing.F) {
	f.Add("dummy.echo", []byte(`{"mode":"MODE_ASYNC","payload":{"n":1}}`), "")
	f.Add("dummy.echo", []byte(`{"mode":"MODE_SYNC","payload":{"k\u0000":"v"}}`), "key-1")
	f.Add("dummy.echo", []byte(`{"mode":"MODE_ASYNC","idempotency_key":"a b"}`), "")
	f.Add("DUMMY", []byte(`{"mode":1,"payload":{"a":[[[[{}]]]]}}`), "clé")
	f.Fuzz(func(t *testing.T, capability string, body []byte, key string) {
		req := &gatewayv1.InvokeCapabilityRequest{}
		if protojson.Unmarshal(body, req) != nil {
			return // grpc-gateway's 400
		}
		if utf8.ValidString(capability) {
			req.Capability = capability // a path parameter; invalid UTF-8 is the REST guard's 400
		}
		checkInvoke(t, req, key)
	})
}

// FuzzInvokeProto is the gRPC invoke: the request as it arrives on the wire.
func FuzzInvokeProto(f *testing.F) {
	for _, body := range []string{`{"capability":"dummy.echo","mode":"MODE_ASYNC","payload":{"n":1}}`,
		`{"capability":"dummy.echo","mode":"MODE_SYNC","payload":{"a":"\u0000"}}`,
		`{"capability":"x\u0000","mode":"MODE_ASYNC"}`} {
		req := &gatewayv1.InvokeCapabilityRequest{}
		if err := protojson.Unmarshal([]byte(body), req); err != nil {
			f.Fatal(err)
		}
		raw, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, "")
	}
	f.Fuzz(func(t *testing.T, raw []byte, key string) {
		req := &gatewayv1.InvokeCapabilityRequest{}
		if proto.Unmarshal(raw, req) != nil {
			return // refused by gRPC's codec
		}
		checkInvoke(t, req, key)
	})
}
