// Package jsonbound holds the rules every service applies, at its edge, to the text and JSON
// it will store: Postgres refuses a NUL character in text and in jsonb (`\u0000`), protobuf and
// Postgres refuse invalid UTF-8, and JSON nested thousands of levels deep is accepted by
// Postgres but then makes every read of the row fail (protojson's recursion limit) — so a value
// that is not refused here must be storable and readable back. One package, so that the
// gateway, the callback service and settlement refuse the same inputs with the same words.
//
// Refusals are apperr.Invalid naming the field; the messages quote the caller's input only
// through Quote, bounded, so that no refusal (and no log of one) echoes megabytes.
package jsonbound

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/apperr"
)

// MaxDepth is the deepest nesting of objects and lists a payload, result or progress may have:
// the top-level object is depth 1. 64 is far beyond any real document and far below the
// 10 000 at which protobuf and protojson refuse to decode what was stored.
const MaxDepth = 64

// QuoteMax bounds the bytes of caller input a refusal message quotes.
const QuoteMax = 64

// Problem says what makes s unstorable as text ("" when nothing does).
func Problem(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		return "contains a NUL character"
	}
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	return ""
}

// Text refuses a string field that Postgres could not store (NUL, invalid UTF-8).
func Text(field, s string) error {
	if p := Problem(s); p != "" {
		return apperr.Invalid(field, "%s", p)
	}
	return nil
}

// Quote renders caller input for a message: quoted, at most QuoteMax bytes of it (cut on a rune
// boundary, "..." marking the cut), invalid bytes and control characters escaped by %q.
func Quote(s string) string {
	if len(s) <= QuoteMax {
		return strconv.Quote(s)
	}
	cut := QuoteMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}

// Struct refuses a JSON object field (payload, result, progress) that is nested deeper than
// MaxDepth, or holds a key or string with NUL or invalid UTF-8, or a number that is not finite
// (JSON has no NaN). A nil struct passes: whether one is required is the caller's rule. The
// message names the path to the first problem, bounded.
func Struct(field string, s *structpb.Struct) error {
	if s == nil {
		return nil
	}
	w := walker{}
	if !w.object(s, 1) {
		if w.deep {
			// The path would be the same key a thousand times: no help.
			return apperr.Invalid(field, "%s", w.problem)
		}
		return apperr.Invalid(field, "%s (at %s)", w.problem, w.where(field))
	}
	return nil
}

// walker visits a structpb tree depth first, stopping at the first problem; path holds the keys
// and indexes down to it, innermost last (built only on the way out of a problem).
type walker struct {
	problem string
	deep    bool
	path    []string
}

func (w *walker) where(field string) string {
	var b strings.Builder
	b.WriteString(field)
	for i := len(w.path) - 1; i >= 0; i-- {
		if b.Len() > 2*QuoteMax {
			b.WriteString("...")
			break
		}
		b.WriteString(w.path[i])
	}
	return b.String()
}

func (w *walker) object(s *structpb.Struct, depth int) bool {
	if depth > MaxDepth {
		w.problem, w.deep = "nested deeper than "+strconv.Itoa(MaxDepth)+" levels", true
		return false
	}
	for k, v := range s.GetFields() {
		if p := Problem(k); p != "" {
			w.problem = "a key " + p
			w.path = append(w.path, "["+Quote(k)+"]")
			return false
		}
		if !w.value(v, depth) {
			w.path = append(w.path, "."+keyPart(k))
			return false
		}
	}
	return true
}

func (w *walker) value(v *structpb.Value, depth int) bool {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		if p := Problem(k.StringValue); p != "" {
			w.problem = "a string " + p
			return false
		}
	case *structpb.Value_NumberValue:
		if math.IsNaN(k.NumberValue) || math.IsInf(k.NumberValue, 0) {
			w.problem = "a number is not finite"
			return false
		}
	case *structpb.Value_StructValue:
		return w.object(k.StructValue, depth+1)
	case *structpb.Value_ListValue:
		if depth+1 > MaxDepth {
			w.problem, w.deep = "nested deeper than "+strconv.Itoa(MaxDepth)+" levels", true
			return false
		}
		for i, e := range k.ListValue.GetValues() {
			if !w.value(e, depth+1) {
				w.path = append(w.path, "["+strconv.Itoa(i)+"]")
				return false
			}
		}
	}
	return true
}

// keyPart is a key as a path element, bounded (a problem's path names keys, which are input).
func keyPart(k string) string {
	if len(k) <= QuoteMax && Problem(k) == "" && !strings.ContainsAny(k, ".[]\"") {
		return k
	}
	return "[" + Quote(k) + "]"
}
