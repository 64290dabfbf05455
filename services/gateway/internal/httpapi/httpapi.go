// Package httpapi serves the REST face of GatewayService through grpc-gateway, calling the service
// in process through the gRPC server's own interceptors (InProcess), so that every REST call
// passes the same interceptors (auth, rate limits, errors, logging) as a gRPC call.
package httpapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/integrations-platform/integrations/pkg/apperr"
	gatewayv1gw "github.com/integrations-platform/integrations/pkg/gen/gw/integrations/gateway/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
)

// Config configures the REST server.
type Config struct {
	Addr string
	// MaxBodyBytes bounds a request body; larger bodies are refused before decoding.
	MaxBodyBytes int64
	// Extra routes served beside the API (e.g. system endpoints).
	Extra map[string]http.Handler
	// The HTTP server's timeouts (http.Server's fields of the same names): a client that sends its
	// request or reads its answer slowly, or keeps an idle connection, is cut off — with or
	// without a key. WriteTimeout must exceed the longest sync_timeout in the catalog: a sync
	// call's answer is written when the attempt ends.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// TLS, if set, is the certificate served on Addr.
	TLS *tlsx.Source
	// Precheck, if set, is asked about every API request with a bearer token before it is
	// decoded and served (invoke: the request is an invoke); an error is the request's refusal,
	// answered without decoding the body (server.RateGate.Precheck).
	Precheck func(ctx context.Context, token string, invoke bool) error
}

// Run serves the REST API of api (InProcess) under app.
func Run(ctx context.Context, app *lifecycle.App, log *zap.Logger, api gatewayv1.GatewayServiceServer, cfg Config) error {
	root, err := Handler(ctx, api, cfg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s for REST: %w", cfg.Addr, err)
	}
	if cfg.TLS != nil {
		lis = tls.NewListener(lis, restTLSConfig(cfg.TLS))
	}
	srv := &http.Server{Handler: root, ReadHeaderTimeout: cfg.ReadHeaderTimeout, ReadTimeout: cfg.ReadTimeout,
		WriteTimeout: cfg.WriteTimeout, IdleTimeout: cfg.IdleTimeout}
	log.Info("rest server listening", zap.String("addr", lis.Addr().String()))
	app.HTTP("rest", srv, lis)
	return nil
}

// restTLSConfig is the REST listener's: the public certificate, offering HTTP/2 and HTTP/1.1 by
// ALPN. http.Server speaks HTTP/2 on a *tls.Conn that negotiated "h2" (Serve sets that up when
// the Server has no TLSConfig of its own), but a listener built with tls.NewListener offers only
// what its config's NextProtos name: without them every client falls back to HTTP/1.1.
func restTLSConfig(src *tlsx.Source) *tls.Config {
	cfg := tlsx.ServerConfig(src)
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return cfg
}

// Handler returns the REST API (and cfg.Extra) serving api (InProcess).
func Handler(ctx context.Context, api gatewayv1.GatewayServiceServer, cfg Config) (http.Handler, error) {
	var mux *runtime.ServeMux
	mux = runtime.NewServeMux(
		runtime.WithIncomingHeaderMatcher(headerMatcher),
		runtime.WithOutgoingHeaderMatcher(func(string) (string, bool) { return "", false }),
		runtime.WithForwardResponseOption(setStatus),
		runtime.WithErrorHandler(errorHandler),
		runtime.WithRoutingErrorHandler(routingErrorHandler),
		runtime.WithMiddlewares(probeMiddleware, precheckMiddleware(&mux, cfg.Precheck)),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, restMarshaler()),
	)
	if err := gatewayv1gw.RegisterGatewayServiceHandlerServer(ctx, mux, api); err != nil {
		return nil, fmt.Errorf("register REST handlers: %w", err)
	}
	root := http.NewServeMux()
	root.Handle("/", guard(mux, limitBody(mux, cfg.MaxBodyBytes)))
	for pattern, h := range cfg.Extra {
		root.Handle(pattern, h)
	}
	return withSource(root), nil
}

// withSource gives every request's context its connection's peer (ratelimit.WithSource): the REST
// calls served in process are then limited by their source address as gRPC calls are. The peer is
// the TCP connection's, never X-Forwarded-For: the gateway has no trusted-proxy setting.
func withSource(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(ratelimit.WithSource(r.Context(), r.RemoteAddr)))
	})
}

// precheckMiddleware asks pre (if not nil) about each request carrying one well-formed bearer
// token, and answers its refusal as the gRPC server's would be answered. *mux is read when a
// request comes: the middleware is made before the mux it is part of.
func precheckMiddleware(mux **runtime.ServeMux, pre func(ctx context.Context, token string, invoke bool) error) runtime.Middleware {
	return func(next runtime.HandlerFunc) runtime.HandlerFunc {
		if pre == nil {
			return next
		}
		return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
			if auth := r.Header.Values("Authorization"); len(auth) == 1 {
				if token, err := grpcx.ParseBearer(auth[0]); err == nil {
					p, _ := runtime.HTTPPattern(r.Context())
					if err := pre(r.Context(), token, p.Verb() == "invoke"); err != nil {
						if writeRateLimited(w, err) {
							return
						}
						_, m := runtime.MarshalerForRequest(*mux, r)
						errorHandler(r.Context(), *mux, m, w, r, grpcx.ToStatus(err).Err())
						return
					}
				}
			}
			next(w, r, params)
		}
	}
}

// restMarshaler is the REST API's JSON: proto field names, unknown fields refused, nothing after
// the request's object. Zero values are sent (EmitDefaultValues: `"attempt": 0`, `"count": "0"`,
// `"executions": []`), so that every scalar, enum and list field the OpenAPI document declares is
// present in every answer and can be marked required; a message field that is not set (a
// failure, a timestamp, a payload) is still left out rather than sent as null.
func restMarshaler() runtime.Marshaler {
	return wholeBody{&runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{EmitDefaultValues: true, UseProtoNames: true},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}}
}

// wholeBody is grpc-gateway's JSON marshaler with a decoder that refuses anything after the
// request's JSON object. grpc-gateway decodes one value and ignores the rest: `{…} xyz` was
// accepted, and of two documents the second was silently dropped — a client that concatenated two
// requests, or whose body was corrupted after its object, got a 202 for something it did not send.
type wholeBody struct{ *runtime.JSONPb }

// NewDecoder implements runtime.Marshaler.
func (m wholeBody) NewDecoder(r io.Reader) runtime.Decoder {
	d := json.NewDecoder(r)
	return wholeDecoder{DecoderWrapper: runtime.DecoderWrapper{Decoder: d, UnmarshalOptions: m.UnmarshalOptions}, d: d}
}

// wholeDecoder decodes one value, then requires the body to end (whitespace aside).
type wholeDecoder struct {
	runtime.DecoderWrapper
	d *json.Decoder
}

// errTrailingData is the refusal of a body with more after its JSON object; the gateway's REST
// handlers answer it INVALID_ARGUMENT, and namedBody names "body".
var errTrailingData = errors.New("trailing data after the JSON object")

func (w wholeDecoder) Decode(v any) error {
	if err := w.DecoderWrapper.Decode(v); err != nil {
		return err // io.EOF included: an empty body is an empty request, as grpc-gateway has it
	}
	// Token reads only as far as the next token, not a whole second document.
	_, err := w.d.Token()
	var syntax *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil, errors.As(err, &syntax):
		return errTrailingData
	default:
		return err // a read error: limitBody has recorded it, errorHandler answers it
	}
}

// errorHandler writes a gRPC error as grpc-gateway does (UNAVAILABLE is 503, INTERNAL 500...),
// with two additions. A retryable status (a RetryInfo: UNAVAILABLE, RESOURCE_EXHAUSTED) gets a
// Retry-After header in whole seconds. And a status that is not the gateway's own — the REST
// proxy could not reach the gateway's gRPC port (a transport error naming its address), or
// lost the call — is answered in the gateway's own words: grpcx.ToStatus marks every status it
// makes with an ErrorInfo of grpcx.ErrorDomain. grpc-gateway's own refusals (a malformed body,
// an unknown path) are kept: they say what is wrong with the request.
func errorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	st := status.Convert(err)
	if rpcstatus.ErrorInfo(err).GetDomain() != grpcx.ErrorDomain {
		switch st.Code() {
		case codes.Unavailable, codes.Internal, codes.Unknown, codes.DataLoss, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted:
			st = grpcx.ToStatus(grpcx.Downstream(r.Context(), "gateway", err))
		}
	}
	if rpcstatus.ErrorInfo(st.Err()).GetDomain() != grpcx.ErrorDomain && len(st.Message()) > maxForeignMessage {
		// grpc-gateway's own refusals quote the request (an unknown field's name, a value it
		// could not parse): bounded, as the gateway's own refusals are.
		st = status.New(st.Code(), safetext.Truncate(st.Message(), maxForeignMessage)+"...")
	}
	if over, ok := r.Context().Value(bodyOverKey{}).(*bodyOver); ok && over.Load() != bodyRead {
		// grpc-gateway answers a body's read error 400 with the error's text. A body without
		// Content-Length (chunked) that ran past the limit is the same 413 as a declared length
		// over the limit; one that did not arrive within the read timeout is 408 (the client
		// may send it again); any other read error is 400. None quotes the network error.
		code, refusal := http.StatusBadRequest, apperr.Invalid("body", "could not be read")
		switch over.Load() {
		case bodyTooLarge:
			code, refusal = http.StatusRequestEntityTooLarge, apperr.Invalid("body", "exceeds the limit of %d bytes", over.limit)
		case bodyTimedOut:
			code, refusal = http.StatusRequestTimeout, apperr.Invalid("body", "not received within the read timeout")
		}
		runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, &runtime.HTTPStatusError{HTTPStatus: code, Err: grpcx.ToStatus(refusal).Err()})
		return
	}
	st = namedBody(r, st)
	st = validUTF8(st)
	if d := rpcstatus.RetryDelay(st.Err()); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, st.Err())
}

// namedBody names "body" in grpc-gateway's own refusal of a request body it could not decode
// (a number out of range, a duplicate key, invalid UTF-8, a lone surrogate): its status names no
// field. A request with a body has no query parameters the API reads, so a detail-less
// INVALID_ARGUMENT of grpc-gateway's on one is about the body — except a path parameter's.
func namedBody(r *http.Request, st *status.Status) *status.Status {
	if r.Method == http.MethodGet || st.Code() != codes.InvalidArgument || len(st.Details()) > 0 ||
		rpcstatus.ErrorInfo(st.Err()).GetDomain() == grpcx.ErrorDomain ||
		strings.HasPrefix(st.Message(), "type mismatch") || strings.HasPrefix(st.Message(), "missing parameter") {
		return st
	}
	return grpcx.ToStatus(apperr.Invalid("body", "not a well-formed request: %s", st.Message()))
}

// validUTF8 is st with every text a client reads made valid UTF-8: grpc-gateway cannot marshal a
// status holding invalid UTF-8 and answers 500 instead. The gateway's own refusals are valid
// (caller input is quoted through jsonbound); this is the last resort for one that is not.
func validUTF8(st *status.Status) *status.Status {
	if textsValid(st) {
		return st
	}
	p := st.Proto()
	p.Message = strings.ToValidUTF8(p.GetMessage(), "\ufffd")
	var details []protoadapt.MessageV1
	for _, d := range st.Details() {
		m, ok := d.(proto.Message)
		if !ok {
			continue
		}
		if br, ok := m.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				v.Field = strings.ToValidUTF8(v.GetField(), "\ufffd")
				v.Description = strings.ToValidUTF8(v.GetDescription(), "\ufffd")
			}
		}
		if _, err := protojson.Marshal(m); err == nil {
			details = append(details, protoadapt.MessageV1Of(m))
		}
	}
	clean, err := status.New(st.Code(), p.GetMessage()).WithDetails(details...)
	if err != nil {
		return status.New(st.Code(), p.GetMessage())
	}
	return clean
}

// textsValid reports whether every text of st is valid UTF-8: its message and its details,
// checked field by field for the kinds the gateway writes, by marshalling for any other kind. (A
// marshal of the whole status on every error was a tenth of the gateway's CPU under a flood of
// rate-limited REST calls.)
func textsValid(st *status.Status) bool {
	if !utf8.ValidString(st.Message()) {
		return false
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			if d.GetRetryDelay().CheckValid() != nil { // out of protojson's range
				return false
			}
		case *errdetails.ErrorInfo:
			if !utf8.ValidString(d.GetReason()) || !utf8.ValidString(d.GetDomain()) {
				return false
			}
			for k, v := range d.GetMetadata() {
				if !utf8.ValidString(k) || !utf8.ValidString(v) {
					return false
				}
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				if !utf8.ValidString(v.GetField()) || !utf8.ValidString(v.GetDescription()) || !utf8.ValidString(v.GetReason()) {
					return false
				}
				if v.GetLocalizedMessage() != nil { // not the gateway's: judged by marshalling
					if _, err := protojson.Marshal(v); err != nil {
						return false
					}
				}
			}
		case proto.Message:
			if _, err := protojson.Marshal(d); err != nil {
				return false
			}
		default:
			return false // a detail that could not be decoded
		}
	}
	return true
}

// maxForeignMessage bounds the message of a refusal the gateway did not write.
const maxForeignMessage = 256

// headerMatcher forwards Idempotency-Key and the W3C trace context (traceparent, tracestate: a
// caller's trace continues through the execution; no baggage, which the platform passes on to no
// one) besides grpc-gateway's defaults
// (Authorization among them), except its Grpc-Metadata- prefix: a client's arbitrary gRPC metadata
// is nothing the API reads, and under it the guarded headers got around the guard (see
// metadataPrefix).
func headerMatcher(key string) (string, bool) {
	key = textproto.CanonicalMIMEHeaderKey(key)
	switch key {
	case "Idempotency-Key":
		return server.IdempotencyKeyHeader, true
	case "Traceparent", "Tracestate":
		return strings.ToLower(key), true
	}
	if strings.HasPrefix(key, metadataPrefix) {
		return "", false
	}
	return runtime.DefaultHeaderMatcher(key)
}

// setStatus applies the HTTP status a handler asked for through response metadata, and points
// Location at a newly accepted execution.
func setStatus(ctx context.Context, w http.ResponseWriter, resp proto.Message) error {
	md, ok := runtime.ServerMetadataFromContext(ctx)
	if !ok {
		return nil
	}
	vals := md.HeaderMD.Get(server.HTTPCodeHeader)
	if len(vals) == 0 {
		return nil
	}
	code, err := strconv.Atoi(vals[0])
	if err != nil {
		return nil
	}
	if r, ok := resp.(*gatewayv1.InvokeCapabilityResponse); ok && r.GetUrl() != "" {
		w.Header().Set("Location", r.GetUrl())
	}
	w.WriteHeader(code)
	return nil
}

// limitBody refuses bodies over n bytes with 413 before grpc-gateway reads them. A body of no
// declared length is cut at n bytes; grpc-gateway answers the read's error, which errorHandler
// makes the same 413 (bodyOverKey).
func limitBody(next http.Handler, n int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > n {
			// The error body every other refusal has (google.rpc.Status as the marshaler writes it).
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			fmt.Fprintf(w, `{"code":3,"message":"request body: %d bytes exceeds the limit of %d bytes","details":[]}`+"\n", r.ContentLength, n)
			return
		}
		over := &bodyOver{limit: n}
		r = r.WithContext(context.WithValue(r.Context(), bodyOverKey{}, over))
		r.Body = overBody{ReadCloser: http.MaxBytesReader(w, r.Body, n), over: over}
		next.ServeHTTP(w, r)
	})
}

// bodyOverKey carries a request's *bodyOver.
type bodyOverKey struct{}

// bodyOver records how reading a request's body failed, if it did: grpc-gateway answers any
// read error as a 400 quoting it ("read tcp 10.0.0.1:8080->…: i/o timeout"), which names the
// server's socket and says nothing the client can act on.
type bodyOver struct {
	atomic.Int32 // a bodyFailure
	limit        int64
}

// bodyFailure is how a body read failed.
type bodyFailure = int32

const (
	bodyRead     bodyFailure = iota // no failure
	bodyTooLarge                    // past the limit: 413
	bodyTimedOut                    // not received within the server's read timeout: 408
	bodyBroken                      // any other read error (the client went away, bad chunking): 400
)

// overBody is a request body that records in over how a read failed.
type overBody struct {
	io.ReadCloser
	over *bodyOver
}

func (b overBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.over.CompareAndSwap(bodyRead, readFailure(err))
	}
	return n, err
}

// readFailure classifies a body read error.
func readFailure(err error) bodyFailure {
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooLarge):
		return bodyTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return bodyTimedOut
	default:
		return bodyBroken
	}
}
