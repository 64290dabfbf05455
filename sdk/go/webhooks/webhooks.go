// Package webhooks implements the Standard Webhooks signature scheme
// (https://www.standardwebhooks.com) as the integrations platform uses it: the platform signs
// every event delivery with it, and a Go receiver verifies with it — an HTTP webhook (headers and
// raw body) or a gRPC EventConsumerService delivery (metadata and DeliverRequest).
//
// A delivery carries three headers (HTTP headers, or the gRPC call's metadata): webhook-id (the
// event id, the receiver's dedup key), webhook-timestamp (Unix seconds of the attempt) and
// webhook-signature: "v1,<base64 HMAC-SHA256 of id.timestamp.body>", keyed with the bytes of the
// application's signing secret (the base64 after "whsec_"); while a secret rotates, one signature
// per secret, space-separated. For a gRPC delivery the body is DeliverRequest.body, the exact JSON
// body a webhook gets, so any Standard Webhooks library verifies either kind.
//
// A webhook receiver:
//
//	verifier := webhooks.Verifier{Secrets: []string{secret}} // the new and the old one while rotating
//	http.HandleFunc("/webhook", func(w http.ResponseWriter, r *http.Request) {
//		event, err := verifier.VerifyRequest(r)
//		if err != nil {
//			http.Error(w, "not signed", http.StatusUnauthorized) // retried by the platform
//			return
//		}
//		w.WriteHeader(http.StatusNoContent)
//		// At least once: deduplicate by event.ID.
//		log.Printf("%s %s: %s", event.Type, event.Data.ExecutionID, event.Data.Status)
//	})
//
// A gRPC consumer:
//
//	srv := grpc.NewServer(grpc.Creds(creds), grpc.ChainUnaryInterceptor(webhooks.UnaryServerInterceptor(secret)))
//	eventsv1.RegisterEventConsumerServiceServer(srv, consumer)
//
// It depends on the standard library, gRPC and the generated events types only.
package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
)

// The Standard Webhooks headers, lower case: HTTP header names (matched without regard to case)
// and gRPC metadata keys alike.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every signing secret the platform hands out; the base64 after it is the key.
const SecretPrefix = "whsec_"

// DefaultTolerance is how far webhook-timestamp may be from the receiver's clock: the Standard
// Webhooks libraries' five minutes, the bound on how long a captured delivery can be replayed.
const DefaultTolerance = 5 * time.Minute

// MaxBodyBytes is the default of Verifier.MaxBodyBytes, the most VerifyRequest reads of a body:
// 16 MiB. A delivery's body is an event: the platform's result and progress objects, each bounded
// by the deployment's payload limit, and a few hundred bytes more; 16 MiB leaves room for any
// limit a deployment sets, and VerifyRequest reads nothing before the headers say the request is a
// delivery (see VerifyRequest). A receiver that knows its deployment's limit sets a smaller one.
const MaxBodyBytes = 16 << 20

// The event types a delivery's body carries in "type".
const (
	TypeExecutionCompleted = "execution.completed"
	TypeExecutionProgress  = "execution.progress"
)

// ErrUnverified matches, with errors.Is, every refusal of a Verify method: the delivery was not
// signed by the platform with one of the secrets, or not recently.
var ErrUnverified = errors.New("webhook not verified")

// ErrSecret is the error of a secret that is not "whsec_" (optional) followed by base64.
var ErrSecret = errors.New("signing secret must be whsec_ followed by base64")

// NewSecret returns a fresh signing secret: "whsec_" and 32 random bytes in base64.
func NewSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate signing secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// key is the HMAC key of a secret: the bytes its base64 encodes, with or without "whsec_".
func key(secret string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil || len(k) == 0 {
		return nil, ErrSecret
	}
	return k, nil
}

// Timestamp is the webhook-timestamp value for ts: Unix seconds.
func Timestamp(ts time.Time) string { return strconv.FormatInt(ts.Unix(), 10) }

// Sign returns the signature of a message under one secret: "v1,<base64 HMAC-SHA256 of
// id.timestamp.body>".
func Sign(secret, id string, ts time.Time, body []byte) (string, error) {
	k, err := key(secret)
	if err != nil {
		return "", err
	}
	return "v1," + base64.StdEncoding.EncodeToString(mac(k, id, Timestamp(ts), body)), nil
}

// SignAll returns the webhook-signature value for a message signed with every secret, in order,
// space-separated, as Standard Webhooks prescribes for a rotation: a receiver that knows either
// the current or the previous secret finds a signature it can verify. At least one secret is
// required.
func SignAll(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	if len(secrets) == 0 {
		return "", errors.New("no signing secret")
	}
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		sig, err := Sign(s, id, ts, body)
		if err != nil {
			return "", err
		}
		sigs[i] = sig
	}
	return strings.Join(sigs, " "), nil
}

// SetHeaders signs body with every secret (see SignAll) and sets the three headers on h.
func SetHeaders(h http.Header, secrets []string, id string, ts time.Time, body []byte) error {
	sigs, err := SignAll(secrets, id, ts, body)
	if err != nil {
		return err
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, Timestamp(ts))
	h.Set(HeaderSignature, sigs)
	return nil
}

// mac is the HMAC-SHA256 of "id.timestamp.body" under k.
func mac(k []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return m.Sum(nil)
}

// Verifier verifies deliveries. The zero value has no secret and verifies nothing.
type Verifier struct {
	// Secrets are the application's signing secrets ("whsec_" and base64), as SetConsumer and
	// RotateSigningSecret answer them; a delivery is accepted if one of its signatures verifies
	// with any of them (so a receiver can hold the old and the new one while it switches).
	Secrets []string
	// Tolerance bounds the distance of webhook-timestamp from now (0: DefaultTolerance).
	Tolerance time.Duration
	// Now is the receiver's clock (nil: time.Now).
	Now func() time.Time
	// MaxBodyBytes bounds the body VerifyRequest reads (0 or less: MaxBodyBytes, 16 MiB): a
	// larger one is refused.
	MaxBodyBytes int64
}

// Verify verifies an HTTP webhook with secrets and DefaultTolerance (see Verifier.Verify).
func Verify(h http.Header, body []byte, secrets ...string) error {
	return Verifier{Secrets: secrets}.Verify(h, body)
}

// Verify checks a received webhook: h its headers, body its raw body exactly as received (never
// JSON decoded and encoded again). webhook-id and webhook-timestamp must be given once, the
// timestamp within the tolerance of now, and one v1 signature among webhook-signature's values
// the HMAC of "id.timestamp.body" under one of the secrets, compared in constant time. Its
// errors wrap ErrUnverified (or ErrSecret, for a malformed secret) and never repeat a secret.
func (v Verifier) Verify(h http.Header, body []byte) error {
	_, err := v.verify(h.Values(HeaderID), h.Values(HeaderTimestamp), h.Values(HeaderSignature), body)
	return err
}

// VerifyRequest verifies r (see Verify) and decodes its body. Before it reads any of the body it
// checks the headers: webhook-id and webhook-timestamp given once, the timestamp within the
// tolerance, a webhook-signature present, and a secret to verify with; so a request that is no
// delivery costs no read. It then reads the body, at most MaxBodyBytes (the Verifier's field), and
// checks the signature. The body is left readable again in r.Body.
func (v Verifier) VerifyRequest(r *http.Request) (*Event, error) {
	signatures := r.Header.Values(HeaderSignature)
	keys, id, rawTS, err := v.checkHeaders(r.Header.Values(HeaderID), r.Header.Values(HeaderTimestamp), signatures)
	if err != nil {
		return nil, err
	}
	if r.Body == nil {
		return nil, fmt.Errorf("%w: no body", ErrUnverified)
	}
	limit := v.MaxBodyBytes
	if limit <= 0 {
		limit = MaxBodyBytes
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read webhook body: %w", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("%w: body larger than %d bytes", ErrUnverified, limit)
	}
	if err := signed(keys, id, rawTS, signatures, body); err != nil {
		return nil, err
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("decode webhook body: %w", err)
	}
	if ev.ID != id {
		return nil, fmt.Errorf("%w: the body's id is not %s", ErrUnverified, HeaderID)
	}
	return &ev, nil
}

// VerifyDelivery verifies a gRPC delivery with secrets and DefaultTolerance (see
// Verifier.VerifyDelivery).
func VerifyDelivery(md metadata.MD, req *eventsv1.DeliverRequest, secrets ...string) error {
	return Verifier{Secrets: secrets}.VerifyDelivery(md, req)
}

// VerifyDelivery checks an EventConsumerService Deliver call: md its incoming metadata, signed as
// a webhook is over req.body (see Verify), webhook-id equal to req.id, and req's typed fields
// (type, time, sequence, data, and execution_completed or execution_progress when set) equal to
// its body's, so that after it every field of the request is as the platform sent it. Its errors wrap ErrUnverified (or ErrSecret).
func (v Verifier) VerifyDelivery(md metadata.MD, req *eventsv1.DeliverRequest) error {
	id, err := v.verify(md.Get(HeaderID), md.Get(HeaderTimestamp), md.Get(HeaderSignature), req.GetBody())
	if err != nil {
		return err
	}
	if req.GetId() != id {
		return fmt.Errorf("%w: id is not %s", ErrUnverified, HeaderID)
	}
	return fieldsOfBody(req)
}

// verify is Verify of the three headers' values and body; it answers the verified webhook-id.
func (v Verifier) verify(ids, timestamps, signatures []string, body []byte) (string, error) {
	keys, id, rawTS, err := v.checkHeaders(ids, timestamps, signatures)
	if err != nil {
		return "", err
	}
	if err := signed(keys, id, rawTS, signatures, body); err != nil {
		return "", err
	}
	return id, nil
}

// signed checks that one v1 signature among signatures is the HMAC of "id.rawTS.body" under one
// of keys, compared in constant time.
func signed(keys [][]byte, id, rawTS string, signatures []string, body []byte) error {
	wants := make([][]byte, len(keys))
	for i, k := range keys {
		wants[i] = mac(k, id, rawTS, body)
	}
	for _, value := range signatures {
		for _, sig := range strings.Fields(value) {
			version, b64, ok := strings.Cut(sig, ",")
			if !ok || version != "v1" {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				continue
			}
			for _, want := range wants {
				if hmac.Equal(got, want) {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("%w: no %s matches", ErrUnverified, HeaderSignature)
}

// checkHeaders is every check that needs no body: the secrets' keys, webhook-id and
// webhook-timestamp given once, the timestamp within the tolerance of now, and at least one
// webhook-signature. It answers the keys, the id and the timestamp as given.
func (v Verifier) checkHeaders(ids, timestamps, signatures []string) (keys [][]byte, id, rawTS string, err error) {
	if len(v.Secrets) == 0 {
		return nil, "", "", fmt.Errorf("%w: no secret to verify with", ErrUnverified)
	}
	keys = make([][]byte, 0, len(v.Secrets))
	for i, s := range v.Secrets {
		k, err := key(s)
		if err != nil {
			return nil, "", "", fmt.Errorf("%w: secret %d: %w", ErrUnverified, i+1, err)
		}
		keys = append(keys, k)
	}
	if id, err = one(HeaderID, ids); err != nil {
		return nil, "", "", err
	}
	if rawTS, err = one(HeaderTimestamp, timestamps); err != nil {
		return nil, "", "", err
	}
	ts, err := strconv.ParseInt(rawTS, 10, 64)
	if err != nil {
		return nil, "", "", fmt.Errorf("%w: %s is not a Unix time", ErrUnverified, HeaderTimestamp)
	}
	now, tolerance := time.Now(), v.Tolerance
	if v.Now != nil {
		now = v.Now()
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return nil, "", "", fmt.Errorf("%w: %s is %s away from now", ErrUnverified, HeaderTimestamp, d.Round(time.Second))
	}
	if strings.TrimSpace(strings.Join(signatures, "")) == "" {
		// The words of a signature that does not match: with none, none matches.
		return nil, "", "", fmt.Errorf("%w: no %s matches", ErrUnverified, HeaderSignature)
	}
	return keys, id, rawTS, nil
}

// one is the single value of a header.
func one(name string, values []string) (string, error) {
	switch {
	case len(values) == 0 || values[0] == "":
		return "", fmt.Errorf("%w: no %s", ErrUnverified, name)
	case len(values) > 1:
		return "", fmt.Errorf("%w: %s given %d times", ErrUnverified, name, len(values))
	}
	return values[0], nil
}

// fieldsOfBody checks that req's typed fields are its body's: the signature covers the body only,
// and a receiver reading the typed fields must read what was signed.
func fieldsOfBody(req *eventsv1.DeliverRequest) error {
	var body struct {
		Type      string          `json:"type"`
		Timestamp *time.Time      `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(req.GetBody(), &body); err != nil {
		return fmt.Errorf("%w: body is not a JSON event", ErrUnverified)
	}
	var data map[string]any
	if len(body.Data) > 0 && !bytes.Equal(body.Data, []byte("null")) {
		if err := json.Unmarshal(body.Data, &data); err != nil {
			return fmt.Errorf("%w: body's data is not an object", ErrUnverified)
		}
	}
	var seq struct {
		Sequence int32 `json:"sequence"`
	}
	if data != nil {
		_ = json.Unmarshal(body.Data, &seq) // a sequence that is not an int32 reads as 0
	}
	differs := func(field string) error {
		return fmt.Errorf("%w: %s differs from the signed body", ErrUnverified, field)
	}
	if body.Type != "" && req.GetType() != body.Type {
		return differs("type")
	}
	if body.Timestamp != nil && !req.GetTime().AsTime().Equal(*body.Timestamp) {
		return differs("time")
	}
	if req.GetSequence() != seq.Sequence {
		return differs("sequence")
	}
	want, err := structpb.NewStruct(data)
	if err != nil {
		return differs("data")
	}
	if !proto.Equal(req.GetData(), want) && !(len(data) == 0 && len(req.GetData().GetFields()) == 0) {
		return differs("data")
	}
	if !typedDataOfBody(req, req.GetType(), body.Data) {
		return differs("typed data")
	}
	return nil
}

// UnaryServerInterceptor verifies every EventConsumerService.Deliver call with secrets (see
// VerifyDelivery) before its handler runs, and answers one that does not verify UNAUTHENTICATED:
// the platform records that as a failed attempt and tries again on its schedule, so a receiver
// missing a rotated secret loses no event while it catches up. Other methods pass through.
func UnaryServerInterceptor(secrets ...string) grpc.UnaryServerInterceptor {
	return Verifier{Secrets: secrets}.UnaryServerInterceptor()
}

// UnaryServerInterceptor is the package's UnaryServerInterceptor with v's settings.
func (v Verifier) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != eventsv1.EventConsumerService_Deliver_FullMethodName {
			return handler(ctx, req)
		}
		dr, ok := req.(*eventsv1.DeliverRequest)
		if !ok {
			return nil, status.Error(codes.Internal, "webhooks: not a DeliverRequest")
		}
		md, _ := metadata.FromIncomingContext(ctx)
		if err := v.VerifyDelivery(md, dr); err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		return handler(ctx, req)
	}
}

// Event is the JSON body of a delivery, an execution.completed or execution.progress event. Its
// enums are spelled in lower case ("succeeded", "async"), not as the API's.
type Event struct {
	// ID is the event id, also webhook-id: the same on every attempt and redelivery, the
	// receiver's dedup key.
	ID string `json:"id"`
	// Type is TypeExecutionCompleted or TypeExecutionProgress.
	Type string `json:"type"`
	// Timestamp is when the execution settled, or the progress was reported.
	Timestamp time.Time `json:"timestamp"`
	// Data is what the event says about the execution.
	Data EventData `json:"data"`
}

// EventData is an event's "data". Apply an execution's events in the order of Sequence, ignoring
// one lower than the last applied: a retry or a redelivery can bring an older one again.
type EventData struct {
	// ExecutionID is the execution the event is about.
	ExecutionID string `json:"execution_id"`
	// Capability is the capability invoked.
	Capability string `json:"capability"`
	// Mode is "async" or "sync" (completion events).
	Mode string `json:"mode,omitempty"`
	// Status is "succeeded", "failed" or "cancelled" (completion events).
	Status string `json:"status,omitempty"`
	// Attempt is the number of attempts started (completion), or the attempt that reported (progress).
	Attempt int32 `json:"attempt"`
	// Sequence is the event's place among its execution's events (1, 2, ...); the completion
	// event has the highest.
	Sequence int32 `json:"sequence"`
	// IdempotencyKey is the invocation's idempotency key, when it had one.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Result is the adapter's response, when succeeded (a JSON object).
	Result json.RawMessage `json:"result,omitempty"`
	// Failure says why the execution failed or was cancelled.
	Failure *Failure `json:"failure,omitempty"`
	// Progress is the progress the adapter reported (progress events; a JSON object).
	Progress json.RawMessage `json:"progress,omitempty"`
}

// Failure is why an execution failed: class and reason are data, not prose.
type Failure struct {
	// Class is the adapter's error class: transient, permanent, timeout, unavailable, ...
	Class string `json:"class,omitempty"`
	// Reason is why the execution settled failed: adapter.permanent, retry_exhausted.attempt_limit,
	// retry_exhausted.budget, lease_expired, cancelled.
	Reason string `json:"reason,omitempty"`
	// Code is the adapter's own error code, if it gave one.
	Code string `json:"code,omitempty"`
	// Message is human-readable; never the request payload.
	Message string `json:"message,omitempty"`
}
