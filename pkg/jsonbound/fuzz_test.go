package jsonbound

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
)

// depthOf measures a JSON text's nesting (objects and lists) by hand, outside strings: the
// fuzz target's own judge of what Struct let through.
func depthOf(raw []byte) int {
	depth, most, inString, escaped := 0, 0, false, false
	for _, c := range raw {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && (c == '{' || c == '['):
			depth++
			most = max(most, depth)
		case !inString && (c == '}' || c == ']'):
			depth--
		}
	}
	return most
}

// FuzzStruct: whatever JSON object arrives, Struct either refuses it as INVALID_ARGUMENT naming
// the field, or it is storable: it encodes to JSON that is valid UTF-8, holds no NUL escape
// (Postgres jsonb refuses \u0000) and is nested at most MaxDepth deep.
func FuzzStruct(f *testing.F) {
	for _, seed := range []string{`{}`, `{"a":"\u0000"}`, `{"\u0000":1}`, `{"a":[[[[1]]]]}`, `{"a":"\ud800"}`, `{"a":1e308}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		s := &structpb.Struct{}
		if protojson.Unmarshal(raw, s) != nil {
			return // refused before it reaches a handler (grpc-gateway's 400)
		}
		err := Struct("payload", s)
		if err != nil {
			e, ok := apperr.As(err)
			if !ok || e.Kind != apperr.KindInvalidArgument || e.Field != "payload" {
				t.Fatalf("refusal is not INVALID_ARGUMENT on payload: %v", err)
			}
			if len(e.Message) > 512 {
				t.Fatalf("refusal message of %d bytes", len(e.Message))
			}
			return
		}
		out, err := json.Marshal(s.AsMap())
		if err != nil {
			t.Fatalf("accepted but not encodable: %v", err)
		}
		if !utf8.Valid(out) || bytes.Contains(out, []byte(`\u0000`)) || depthOf(out) > MaxDepth {
			t.Fatalf("accepted but not storable: %.200s", out)
		}
	})
}
