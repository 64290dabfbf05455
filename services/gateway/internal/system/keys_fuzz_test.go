package system

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzCreateKeyBody: a create body is accepted only as one JSON object with known fields and
// nothing after it; a refusal is a 400 or 413 naming `body`, bounded, whatever the input; a free
// text field that passes checkText holds no control or format character.
func FuzzCreateKeyBody(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `{"description": "ci"}`, `{"description": "ci"} {}`, `{"description": "ci"}x`,
		`{"secret": 1}`, `[`, `null`, `"x"`, `{"created_by": "ops\u202e"}`, "{\"description\": \"a\u200bb\"}", `  {}  `,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req createKeyRequest
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		code, msg := decodeBody(httptest.NewRecorder(), r, &req)
		if msg == "" {
			trimmed := bytes.TrimSpace([]byte(body))
			if len(trimmed) == 0 {
				return
			}
			if trimmed[0] != '{' {
				t.Fatalf("accepted a body that is not an object: %q", body)
			}
			dec := json.NewDecoder(bytes.NewReader(trimmed))
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				t.Fatalf("accepted a body that is not JSON: %v", err)
			}
			if rest := trimmed[dec.InputOffset():]; len(rest) != 0 {
				t.Fatalf("accepted data after the object: %q", rest)
			}
		} else {
			if code != http.StatusBadRequest && code != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d for bad input", code)
			}
			if !strings.HasPrefix(msg, "body: ") || len(msg) > 400 {
				t.Fatalf("message %q does not name body or is unbounded", msg)
			}
		}
		for _, s := range []string{req.Description, req.CreatedBy, body} {
			if checkText(s, 1<<20) != "" {
				continue
			}
			if !utf8.ValidString(s) {
				t.Fatalf("accepted invalid UTF-8 %q", s)
			}
			for _, c := range s {
				if unicode.IsControl(c) || unicode.Is(unicode.Cf, c) {
					t.Fatalf("accepted %U in %q", c, s)
				}
			}
		}
	})
}
