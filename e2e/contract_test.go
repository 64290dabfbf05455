package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/require"
)

// openAPIPath is the REST API's document, as make generate writes it.
var openAPIPath = filepath.Join("..", "pkg", "gen", "openapi", "integrations.openapi.yaml")

// contract holds the suite's REST traffic to the OpenAPI document: every request a stack's
// client (stack.http) sends to the gateway's API, and every answer, is validated against it with
// kin-openapi's openapi3filter, in both directions — a property the document does not declare
// fails as surely as a required one that is missing (closed: see strict). A request the document
// refuses must be refused by the gateway with a declared 4xx; one it accepts is answered as it
// says.
type contract struct {
	doc    *openapi3.T
	router routers.Router
}

var (
	contractOnce sync.Once
	sharedDoc    *contract
	contractErr  error
)

// suiteContract is the committed document's contract, loaded once for the suite.
func suiteContract(t testing.TB) *contract {
	t.Helper()
	contractOnce.Do(func() {
		var text []byte
		if text, contractErr = os.ReadFile(openAPIPath); contractErr == nil {
			sharedDoc, contractErr = newContract(text)
		}
	})
	require.NoError(t, contractErr, "load %s", openAPIPath)
	return sharedDoc
}

// newContract loads a document's text as the contract test holds traffic to it.
func newContract(text []byte) (*contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(text)
	if err != nil {
		return nil, fmt.Errorf("load the document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("the document is not valid OpenAPI: %w", err)
	}
	strict(doc)
	// Any host: the stacks listen on ports of their own.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("route the document: %w", err)
	}
	return &contract{doc: doc, router: router}, nil
}

// strict closes every object schema that declares its properties and says nothing of others
// (additionalProperties: false): the published document leaves them open, so that a client's
// validator takes a field added later, but the suite holds the gateway to exactly what it says.
// Free-form objects (payloads, results, progress, a refusal's details) declare
// additionalProperties and stay open.
func strict(doc *openapi3.T) {
	seen := map[*openapi3.Schema]bool{}
	var walk func(*openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if s.Type.Is(openapi3.TypeObject) && s.AdditionalProperties.Has == nil && s.AdditionalProperties.Schema == nil &&
			len(s.OneOf) == 0 && len(s.AllOf) == 0 && len(s.AnyOf) == 0 {
			closed := false
			s.AdditionalProperties.Has = &closed
		}
		for _, p := range s.Properties {
			walk(p)
		}
		walk(s.Items)
		walk(s.AdditionalProperties.Schema)
		for _, group := range []openapi3.SchemaRefs{s.OneOf, s.AllOf, s.AnyOf} {
			for _, x := range group {
				walk(x)
			}
		}
	}
	for _, s := range doc.Components.Schemas {
		walk(s)
	}
	each := func(content openapi3.Content) {
		for _, m := range content {
			walk(m.Schema)
		}
	}
	for _, r := range doc.Components.Responses {
		each(r.Value.Content)
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.RequestBody != nil && op.RequestBody.Value != nil {
				each(op.RequestBody.Value.Content)
			}
			for _, r := range op.Responses.Map() {
				if r.Value != nil {
					each(r.Value.Content)
				}
			}
		}
	}
}

// transport is an http.RoundTripper that holds each exchange with the gateway's API to c and
// reports every mismatch through report.
func (c *contract) transport(base http.RoundTripper, report func(string)) http.RoundTripper {
	return &contractTransport{c: c, base: base, report: report}
}

type contractTransport struct {
	c      *contract
	base   http.RoundTripper
	report func(string)
}

// apiPath reports whether a path is the API's or the system endpoints' (the console's pages, the
// metrics and anything else are not in the document).
func apiPath(p string) bool {
	return strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/api/v1/")
}

func (ct *contractTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !apiPath(req.URL.Path) {
		return ct.base.RoundTrip(req)
	}
	var reqBody []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		if reqBody, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	resp, err := ct.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	respBody, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	if problem := ct.c.check(req, reqBody, resp, respBody); problem != "" {
		ct.report(problem)
	}
	return resp, nil
}

// check validates one exchange and describes its mismatch ("" for none).
func (c *contract) check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) string {
	ctx := context.Background()
	exchange := fmt.Sprintf("%s %s answered %d", req.Method, req.URL.Path, resp.StatusCode)
	// A copy to validate: the validator reads the body, and the request has been sent.
	vreq := req.Clone(ctx)
	vreq.Body = io.NopCloser(bytes.NewReader(reqBody))
	if len(reqBody) > 0 && vreq.Header.Get("Content-Type") == "" {
		// The gateway reads every body as JSON, whatever its Content-Type (the document says so).
		vreq.Header.Set("Content-Type", "application/json")
	}
	route, params, err := c.router.FindRoute(vreq)
	if err != nil {
		// No operation: the gateway must refuse it too (an unknown path, another method).
		switch {
		case resp.StatusCode == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "":
			return fmt.Sprintf("contract: %s: 405 without Allow", exchange)
		case resp.StatusCode < 400 || resp.StatusCode >= 500:
			return fmt.Sprintf("contract: %s: the document has no operation for it (%v), yet the gateway served it", exchange, err)
		}
		return ""
	}
	name := route.Operation.OperationID
	exercised.add(name, resp.StatusCode)
	opts := &openapi3filter.Options{
		MultiError:            true,
		IncludeResponseStatus: true,
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts}
	if reqErr := openapi3filter.ValidateRequest(ctx, in); reqErr != nil {
		// The document refuses the request: so must the gateway, as the operation says it refuses.
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			return fmt.Sprintf("contract: %s (%s): the document refuses the request the gateway accepted:\n%s",
				name, exchange, describe(reqErr))
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(respBody)), Options: opts,
	}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return fmt.Sprintf("contract: %s (%s): the answer is not as the document says:\n%s\nanswer: %s",
			name, exchange, describe(err), clip(respBody))
	}
	if err := c.checkErrorInfo(respBody); err != nil {
		return fmt.Sprintf("contract: %s (%s): a refusal's ErrorInfo is not as the document says:\n%s\nanswer: %s",
			name, exchange, describe(err), clip(respBody))
	}
	return ""
}

// checkErrorInfo holds a refusal's google.rpc.ErrorInfo details to the document's ErrorInfo
// schema: above all, its reason is one of ErrorReason, the enum every reason the platform sends
// is declared in. An answer that is no refusal passes.
func (c *contract) checkErrorInfo(body []byte) error {
	var refusal struct {
		Details []map[string]any `json:"details"`
	}
	if json.Unmarshal(body, &refusal) != nil {
		return nil
	}
	schema := c.doc.Components.Schemas["ErrorInfo"].Value
	for _, d := range refusal.Details {
		if d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" {
			if err := schema.VisitJSON(d, openapi3.MultiErrors()); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkWebhook validates a delivery the suite received against the document's webhook of its
// type (the body's "type"): its body, and its Standard Webhooks headers. It describes the
// mismatch ("" for none).
func (c *contract) checkWebhook(h http.Header, body map[string]any) string {
	typ, _ := body["type"].(string)
	item := c.doc.Webhooks[typ]
	if item == nil || item.Post == nil {
		return fmt.Sprintf("contract: webhook %q: the document has no such webhook", typ)
	}
	op := item.Post
	var lines []string
	for _, p := range op.Parameters {
		if p.Value.In == openapi3.ParameterInHeader && p.Value.Required && h.Get(p.Value.Name) == "" {
			lines = append(lines, fmt.Sprintf("  header %s: missing", p.Value.Name))
		}
	}
	schema := op.RequestBody.Value.Content.Get("application/json").Schema.Value
	if err := schema.VisitJSON(body, openapi3.MultiErrors()); err != nil {
		lines = append(lines, describe(err))
	}
	if len(lines) == 0 {
		return ""
	}
	return fmt.Sprintf("contract: webhook %s (%s): the delivery is not as the document says:\n%s\nbody: %v",
		typ, op.OperationID, strings.Join(lines, "\n"), body)
}

// exercised counts the suite's validated exchanges, by operation and status.
var exercised = &tally{n: map[string]map[int]int{}}

type tally struct {
	mu sync.Mutex
	n  map[string]map[int]int
}

func (t *tally) add(op string, status int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n[op] == nil {
		t.n[op] = map[int]int{}
	}
	t.n[op][status]++
}

// contractSummary is how many of the suite's exchanges were held to the document, by operation
// and status, and which of the document's operations the run never called.
func contractSummary() string {
	exercised.mu.Lock()
	defer exercised.mu.Unlock()
	if sharedDoc == nil {
		return "contract: no REST exchange validated"
	}
	var b strings.Builder
	total := 0
	var never []string
	for _, path := range sharedDoc.doc.Paths.InMatchingOrder() {
		for _, op := range sharedDoc.doc.Paths.Value(path).Operations() {
			byStatus := exercised.n[op.OperationID]
			if len(byStatus) == 0 {
				never = append(never, op.OperationID)
				continue
			}
			var parts []string
			for _, code := range slices.Sorted(maps.Keys(byStatus)) {
				parts = append(parts, fmt.Sprintf("%d×%d", code, byStatus[code]))
				total += byStatus[code]
			}
			fmt.Fprintf(&b, "  %-22s %s\n", op.OperationID, strings.Join(parts, " "))
		}
	}
	head := fmt.Sprintf("contract: %d REST exchanges validated against %s, by operation (status×count):\n", total, openAPIPath)
	if len(never) > 0 {
		b.WriteString("  not called in this run: " + strings.Join(never, ", ") + "\n")
	}
	return head + b.String()
}

// describe lists a validation error's mismatches, one a line, each naming the field by its
// path in the body.
func describe(err error) string {
	var lines []string
	var walk func(error)
	walk = func(err error) {
		var multi openapi3.MultiError
		if errors.As(err, &multi) {
			for _, e := range multi {
				walk(e)
			}
			return
		}
		var se *openapi3.SchemaError
		if errors.As(err, &se) {
			field := strings.Join(se.JSONPointer(), ".")
			if field == "" {
				field = "(the body)"
			}
			lines = append(lines, fmt.Sprintf("  field %s: %s", field, se.Reason))
			return
		}
		lines = append(lines, "  "+err.Error())
	}
	walk(err)
	return strings.Join(lines, "\n")
}

func clip(b []byte) string {
	const n = 600
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// contractClient is base's transport (the default one if nil) holding the stack's traffic to the
// document: a mismatch fails t, naming the operation and the field.
func contractClient(t testing.TB, base *http.Client) *http.Client {
	t.Helper()
	c := suiteContract(t)
	rt := http.DefaultTransport
	if base != nil && base.Transport != nil {
		rt = base.Transport
	}
	return &http.Client{Transport: c.transport(rt, func(problem string) { t.Errorf("%s", problem) })}
}

// TestContractNamesARenamedField is the contract test's own check: a document that differs from
// the wire in one field's name makes a real exchange fail, naming the operation and the field.
func TestContractNamesARenamedField(t *testing.T) {
	text, err := os.ReadFile(openAPIPath)
	require.NoError(t, err)
	// Execution.max_attempts renamed maxAttempts, in a copy: what a camelCase document said.
	const field = "        max_attempts:\n          format: int32\n"
	require.Contains(t, string(text), field)
	renamed := strings.Replace(string(text), field, "        maxAttempts:\n          format: int32\n", 1)
	renamed = strings.Replace(renamed, "        - max_attempts\n", "        - maxAttempts\n", 1)
	c, err := newContract([]byte(renamed))
	require.NoError(t, err)

	s := newStack(t)
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "gateway")
	var problems []string
	var mu sync.Mutex
	base := s.http.Transport.(*contractTransport).base // the stack's own (TLS, when it serves TLS)
	s.http = &http.Client{Transport: c.transport(base, func(p string) {
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, p)
	})}
	code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "payload": {"n": 1}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, problems, 1, "one mismatch for the one exchange")
	t.Logf("the validator's report:\n%s", problems[0])
	require.Contains(t, problems[0], "invokeCapability")
	// The answer's field the document does not declare, and the one it declares that is missing.
	require.Contains(t, problems[0], `field execution: property "max_attempts" is unsupported`)
	require.Contains(t, problems[0], `field execution.maxAttempts: property "maxAttempts" is missing`)
}

// TestContractHoldsReasonsToTheEnum is the ErrorInfo check's own: a reason the document's
// ErrorReason does not declare fails, one it declares passes.
func TestContractHoldsReasonsToTheEnum(t *testing.T) {
	c := suiteContract(t)
	refusal := func(reason string) []byte {
		return []byte(`{"code": 9, "message": "no", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
			"reason": "` + reason + `", "domain": "integrations", "metadata": {"status": "EXECUTION_STATUS_SUCCEEDED"}}]}`)
	}
	require.NoError(t, c.checkErrorInfo(refusal("ALREADY_SETTLED")))
	err := c.checkErrorInfo(refusal("ALREADY_DONE"))
	require.Error(t, err)
	t.Logf("the check's report: %s", describe(err))
	require.NoError(t, c.checkErrorInfo([]byte(`{"execution": {}}`)), "an answer that is no refusal")
}
