package catalog

import (
	"regexp"
	"strings"
	"testing"

	"github.com/integrations-platform/integrations/pkg/jsonbound"
)

// fieldError is how every line of a refusal starts: the decoder's or the environment's words, or
// the path of the entry at fault.
var fieldError = regexp.MustCompile(`^(decode: |environment variables not set: |(applications|adapters|capabilities)\[\d+\][.:])`)

// FuzzParse: any file is parsed without a panic; a refusal names, line by line, what is wrong;
// an accepted catalog holds only text Postgres can store.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`
applications:
  - id: app
    api_key: ${APP_KEY}
    consumer: {grpc: {target: "consumer:9000"}}
adapters:
  - id: adp
    endpoint: 127.0.0.1:50070
    credential: test-credential-0123456789
capabilities:
  - name: test.echo
    adapter: adp
    modes: [async, sync]
    retry_delays: [1s]
`))
	f.Add([]byte("adapters:\n  - id: a\n    endpoint: \"x\\0y\"\n    credential_sha256: \"" + strings.Repeat("0", 64) + "\"\n"))
	f.Add([]byte("applications: [{id: A, api_key: short}]\ncapabilities: [{name: x, adapter: nope, modes: [never]}]"))
	f.Add([]byte("{{{{"))
	lookup := func(name string) (string, bool) {
		if name == "MISSING" {
			return "", false
		}
		return "value-of-" + name + "-0123456789", true
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := Parse(raw, lookup)
		if err != nil {
			// Validate joins one error per entry at fault; a value quoted in one may hold a
			// newline, so the errors are taken one by one, not line by line.
			errs := []error{err}
			if joined, ok := err.(interface{ Unwrap() []error }); ok {
				errs = joined.Unwrap()
			}
			for _, e := range errs {
				if !fieldError.MatchString(e.Error()) {
					t.Fatalf("refusal names no field: %q", e.Error())
				}
			}
			return
		}
		texts := []string{}
		for _, a := range c.Applications {
			texts = append(texts, a.ID, a.Name)
			if a.Consumer != nil {
				_, endpoint, _, _ := a.Consumer.stored()
				texts = append(texts, endpoint)
			}
		}
		for _, a := range c.Adapters {
			texts = append(texts, a.ID, a.Endpoint)
		}
		for _, cp := range c.Capabilities {
			texts = append(texts, cp.Name, cp.Adapter)
			texts = append(texts, cp.Modes...)
		}
		for _, s := range texts {
			if p := jsonbound.Problem(s); p != "" {
				t.Fatalf("accepted text %q %s", s, p)
			}
		}
	})
}
