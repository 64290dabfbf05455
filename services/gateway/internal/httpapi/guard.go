package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
)

// guardedHeaders are the request headers that carry a credential or a deduplication key. gRPC
// metadata takes only printable ASCII, and grpc-gateway silently drops a header it cannot
// forward: a dropped Idempotency-Key made the same request twice create two executions, a
// dropped Authorization answers "missing authorization" for a header the client did send. So any
// other byte is refused here, naming the header.
var guardedHeaders = []string{"Idempotency-Key", "Authorization"}

// metadataPrefix is grpc-gateway's prefix for a header forwarded as gRPC metadata of the rest of
// its name. The gateway forwards none of them (headerMatcher): the API reads no metadata but its
// two guarded headers. Those two under the prefix are refused by name rather than dropped, so that
// a client that meant `Grpc-Metadata-Idempotency-Key` as its key learns it was not taken.
const metadataPrefix = "Grpc-Metadata-"

// timeoutHeader is gRPC's deadline header. grpc-gateway turns it into the call's deadline; the
// REST API has no timeout parameter, and a client's deadline that passed was answered 503 with
// Retry-After as if the gateway were down. So it is removed before grpc-gateway sees it: the
// request runs under the gateway's own deadlines.
const timeoutHeader = "Grpc-Timeout"

// guard refuses, before grpc-gateway sees the request, what it would drop or turn into a 500:
// guarded headers that are not printable ASCII (or given twice), and a path or query that is not
// valid UTF-8 or holds a NUL (protobuf refuses to encode such a string: the proxy's call then
// failed as INTERNAL). Each refusal is a 400 INVALID_ARGUMENT naming the header, "path" or the
// query parameter, in grpc-gateway's error body.
func guard(mux *runtime.ServeMux, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(timeoutHeader)
		if err := checkRequest(r); err != nil {
			_, m := runtime.MarshalerForRequest(mux, r)
			errorHandler(r.Context(), mux, m, w, r, grpcx.ToStatus(err).Err())
			return
		}
		next.ServeHTTP(w, r)
	})
}

func checkRequest(r *http.Request) error {
	for _, name := range guardedHeaders {
		if len(r.Header.Values(metadataPrefix+name)) > 0 {
			return apperr.Invalid(metadataPrefix+name, "not forwarded: give it as %s", name)
		}
		vals := r.Header.Values(name)
		if len(vals) > 1 {
			return apperr.Invalid(name, "header given %d times; give it once", len(vals))
		}
		if len(vals) == 1 && strings.ContainsFunc(vals[0], func(c rune) bool { return c < 0x20 || c > 0x7e }) {
			return apperr.Invalid(name, "header must be printable ASCII")
		}
	}
	if err := checkIdempotencyKey(r.Header.Values("Idempotency-Key")); err != nil {
		return err
	}
	if p := jsonbound.Problem(r.URL.Path); p != "" {
		return apperr.Invalid("path", "%s", p)
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return apperr.Invalid("query", "not a valid query string")
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range q {
			if !yield(k) {
				return
			}
		}
	}) {
		if p := jsonbound.Problem(k); p != "" {
			return apperr.Invalid("query", "a parameter name %s", p)
		}
		for _, v := range q[k] {
			if p := jsonbound.Problem(v); p != "" {
				return apperr.Invalid(boundedName(k), "%s", p)
			}
		}
	}
	return nil
}

// checkIdempotencyKey refuses an Idempotency-Key header that is empty or all spaces (net/http
// trims the spaces; grpc-gateway then forwarded no key, and the request ran as one without a key:
// a retry would run it again), and one the gateway would refuse — checked here so that the
// refusal names the header, as the guard's other refusals of it do, not the body's
// idempotency_key field. vals has at most one value (checkRequest refused more).
func checkIdempotencyKey(vals []string) error {
	if len(vals) == 0 {
		return nil
	}
	if strings.TrimSpace(vals[0]) == "" {
		return apperr.Invalid("Idempotency-Key", "header is empty; give a key or leave the header out")
	}
	if !server.ValidIdempotencyKey(vals[0]) {
		return apperr.Invalid("Idempotency-Key", "must be at most %d printable ASCII characters without spaces", server.IdempotencyKeyMax)
	}
	return nil
}

// boundedName is a query parameter's name as a field name: input, so bounded, and cut on a rune
// boundary — a name cut inside a rune is not valid UTF-8, which grpc-gateway cannot marshal into
// the refusal (it answered 500). k has passed jsonbound.Problem: valid UTF-8, no NUL.
func boundedName(k string) string {
	if len(k) <= jsonbound.QuoteMax {
		return k
	}
	cut := jsonbound.QuoteMax
	for cut > 0 && !utf8.RuneStart(k[cut]) {
		cut--
	}
	return k[:cut] + "..."
}

// probeKey marks a request routingErrorHandler sends through the mux to learn which methods a
// path allows: probeMiddleware records the match instead of calling the handler.
type probeKey struct{}

type probe struct{ matched bool }

// probeMiddleware answers a probe: the route exists for the probe's method. Nothing is called.
func probeMiddleware(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if p, ok := r.Context().Value(probeKey{}).(*probe); ok {
			p.matched = true
			return
		}
		next(w, r, params)
	}
}

// probeMethods are the methods a route of the API may have.
var probeMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// routingErrorHandler answers a path served for other methods 405 with Allow listing them (grpc-
// gateway's default is 501 UNIMPLEMENTED, which says the server cannot do it at all), and the
// other routing errors as grpc-gateway does.
func routingErrorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	if _, ok := ctx.Value(probeKey{}).(*probe); ok {
		return // a probe that matched no route: nothing to record
	}
	if httpStatus != http.StatusMethodNotAllowed {
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, httpStatus)
		return
	}
	var allow []string
	for _, method := range probeMethods {
		if method == r.Method {
			continue
		}
		p := &probe{}
		pr := r.Clone(context.WithValue(ctx, probeKey{}, p))
		pr.Method = method
		pr.Body = http.NoBody
		mux.ServeHTTP(discard{}, pr)
		if p.matched {
			allow = append(allow, method)
		}
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	// The body is the INVALID_ARGUMENT naming "method"; HTTPStatusError makes the status 405.
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, &runtime.HTTPStatusError{
		HTTPStatus: http.StatusMethodNotAllowed,
		Err: grpcx.ToStatus(apperr.Invalid("method", "%s is not allowed on this path; allowed: %s",
			jsonbound.Quote(r.Method), strings.Join(allow, ", "))).Err(),
	})
}

// discard is the ResponseWriter of a probe: nothing a probe does reaches the client.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}
