package jsonbound

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
)

// nested returns a JSON object nested depth levels deep (the top object is level 1), the
// innermost level a list when list is set.
func nested(depth int, list bool) string {
	inner := `{"x":"y"}`
	if list {
		inner = `["y"]`
	}
	return strings.Repeat(`{"a":`, depth-1) + inner + strings.Repeat("}", depth-1)
}

func mustStruct(t testing.TB, raw string) *structpb.Struct {
	t.Helper()
	s := &structpb.Struct{}
	require.NoError(t, protojson.Unmarshal([]byte(raw), s))
	return s
}

func invalid(t *testing.T, err error, field string) string {
	t.Helper()
	e, ok := apperr.As(err)
	require.True(t, ok, "an apperr: %v", err)
	assert.Equal(t, apperr.KindInvalidArgument, e.Kind)
	assert.Equal(t, field, e.Field)
	return e.Message
}

func TestStruct(t *testing.T) {
	t.Parallel()
	require.NoError(t, Struct("payload", nil))
	require.NoError(t, Struct("payload", mustStruct(t, nested(MaxDepth, false))))
	require.NoError(t, Struct("payload", mustStruct(t, nested(MaxDepth, true))))
	require.NoError(t, Struct("payload", mustStruct(t, `{"a":"é","b":[1,2,{"c":null}],"d":true}`)))

	for name, tc := range map[string]struct{ raw, want string }{
		"deep object":      {nested(MaxDepth+1, false), "nested deeper than 64 levels"},
		"deep list":        {nested(MaxDepth+1, true), "nested deeper than 64 levels"},
		"very deep":        {nested(5000, false), "nested deeper than 64 levels"},
		"NUL in value":     {`{"a":{"b":"x\u0000y"}}`, "a string contains a NUL character (at payload.a.b)"},
		"NUL in key":       {`{"a":{"k\u0000":1}}`, `a key contains a NUL character (at payload.a["k\x00"])`},
		"NUL in list item": {`{"a":[1,"\u0000"]}`, "a string contains a NUL character (at payload.a[1])"},
	} {
		msg := invalid(t, Struct("payload", mustStruct(t, tc.raw)), "payload")
		assert.Equal(t, tc.want, msg, name)
	}

	// Built by hand: protojson would refuse these on the way in, a Go client would not.
	s := &structpb.Struct{Fields: map[string]*structpb.Value{"n": structpb.NewNumberValue(math.NaN())}}
	assert.Contains(t, invalid(t, Struct("result", s), "result"), "not finite")
	s = &structpb.Struct{Fields: map[string]*structpb.Value{"bad": structpb.NewStringValue("a\xffb")}}
	assert.Contains(t, invalid(t, Struct("result", s), "result"), "not valid UTF-8")
}

func TestPathBounded(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 10000)
	raw := fmt.Sprintf(`{%q:{%q:"\u0000"}}`, long, long)
	msg := invalid(t, Struct("payload", mustStruct(t, raw)), "payload")
	assert.Less(t, len(msg), 400, "the path quotes input bounded: %s", msg)
	msg = invalid(t, Struct("payload", mustStruct(t, nested(9000, false))), "payload")
	assert.Less(t, len(msg), 400)
}

func TestTextAndQuote(t *testing.T) {
	t.Parallel()
	require.NoError(t, Text("capability", "dummy.echo"))
	assert.Equal(t, "contains a NUL character", invalid(t, Text("capability", "a\x00"), "capability"))
	assert.Equal(t, "is not valid UTF-8", invalid(t, Text("capability", "a\xc3"), "capability"))
	assert.Equal(t, `"short"`, Quote("short"))
	q := Quote(strings.Repeat("é", 1000))
	assert.LessOrEqual(t, len(q), QuoteMax+5)
	assert.True(t, strings.HasSuffix(q, `"...`))
}

// BenchmarkStruct1MiB measures the walk over a 1 MiB payload (the default
// INTEGRATIONS_MAX_PAYLOAD_BYTES) of many small objects, the shape that costs most per byte.
func BenchmarkStruct1MiB(b *testing.B) {
	s, n := payload1MiB(b)
	b.SetBytes(int64(n))
	for b.Loop() {
		if err := Struct("payload", s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMarshal1MiB is the reference: the gateway already encodes every payload to JSON
// (json.Marshal of AsMap, for the request hash and the row).
func BenchmarkMarshal1MiB(b *testing.B) {
	s, n := payload1MiB(b)
	b.SetBytes(int64(n))
	for b.Loop() {
		if _, err := json.Marshal(s.AsMap()); err != nil {
			b.Fatal(err)
		}
	}
}

func payload1MiB(b *testing.B) (*structpb.Struct, int) {
	var sb strings.Builder
	sb.WriteString(`{"items":[`)
	for i := 0; sb.Len() < 1<<20; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"id":%d,"name":"item %d","tags":["a","b"],"nested":{"ok":true}}`, i, i)
	}
	sb.WriteString(`]}`)
	return mustStruct(b, sb.String()), sb.Len()
}
