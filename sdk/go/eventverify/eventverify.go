// Package eventverify is the receiving end of a gRPC event consumer: it checks that an
// integrations.events.v1.EventConsumerService Deliver call was signed by the platform with the
// application's signing secret, as a webhook is, per the Standard Webhooks convention
// (https://www.standardwebhooks.com).
//
// The call's metadata carries the three headers a webhook carries: webhook-id (the event id),
// webhook-timestamp (Unix seconds) and webhook-signature ("v1,<base64 HMAC-SHA256>", one per
// secret, space-separated, during a rotation's overlap), signing "id.timestamp.body", body being
// DeliverRequest.body: the exact JSON body a webhook would get. Any Standard Webhooks library
// verifies the same bytes; this package does it for a Go receiver, and also holds the typed
// fields of the request (id, type, time, data, sequence) to the signed body, so that after
// Verify every field of the request is as the platform sent it.
//
// It depends on the standard library, gRPC and the generated events types only, so that a client
// SDK can carry it as it is.
//
//	srv := grpc.NewServer(grpc.Creds(creds), grpc.ChainUnaryInterceptor(eventverify.UnaryServerInterceptor(secret)))
//	eventsv1.RegisterEventConsumerServiceServer(srv, consumer)
package eventverify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
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

// Metadata keys of a signed delivery: the Standard Webhooks header names.
const (
	KeyID        = "webhook-id"
	KeyTimestamp = "webhook-timestamp"
	KeySignature = "webhook-signature"
)

// DefaultTolerance is how far webhook-timestamp may be from the receiver's clock: the Standard
// Webhooks libraries' five minutes, the bound on how long a captured delivery can be replayed.
const DefaultTolerance = 5 * time.Minute

// ErrUnsigned matches, with errors.Is, every refusal of Verify.
var ErrUnsigned = errors.New("delivery not signed by the platform")

// Verifier verifies deliveries. The zero value has no secret and verifies nothing.
type Verifier struct {
	// Secrets are the application's signing secrets ("whsec_" and base64), as SetConsumer and
	// RotateSigningSecret answer them; a delivery is accepted if one signature verifies with any
	// of them (so a receiver can hold the old and the new one while it switches).
	Secrets []string
	// Tolerance bounds the distance of webhook-timestamp from now (0: DefaultTolerance).
	Tolerance time.Duration
	// Now is the receiver's clock (nil: time.Now).
	Now func() time.Time
}

// Verify verifies a delivery with secrets and DefaultTolerance (see Verifier.Verify).
func Verify(md metadata.MD, req *eventsv1.DeliverRequest, secrets ...string) error {
	return Verifier{Secrets: secrets}.Verify(md, req)
}

// Verify checks md, the Deliver call's incoming metadata, against req: webhook-id is req.id,
// webhook-timestamp is within the tolerance of now, one of the webhook-signature values is the
// HMAC of "id.timestamp.body" under one of the secrets, and req's typed fields are those of its
// body. Its errors wrap ErrUnsigned and never repeat a secret.
func (v Verifier) Verify(md metadata.MD, req *eventsv1.DeliverRequest) error {
	if len(v.Secrets) == 0 {
		return fmt.Errorf("%w: no secret to verify with", ErrUnsigned)
	}
	keys := make([][]byte, 0, len(v.Secrets))
	for i, s := range v.Secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil || len(key) == 0 {
			return fmt.Errorf("%w: secret %d is not whsec_ followed by base64", ErrUnsigned, i+1)
		}
		keys = append(keys, key)
	}
	id, err := one(md, KeyID)
	if err != nil {
		return err
	}
	rawTS, err := one(md, KeyTimestamp)
	if err != nil {
		return err
	}
	ts, err := strconv.ParseInt(rawTS, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s is not a Unix time", ErrUnsigned, KeyTimestamp)
	}
	now, tolerance := time.Now(), v.Tolerance
	if v.Now != nil {
		now = v.Now()
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: %s is %s away from now", ErrUnsigned, KeyTimestamp, d.Round(time.Second))
	}
	if !signed(keys, id, rawTS, req.GetBody(), md.Get(KeySignature)) {
		return fmt.Errorf("%w: no %s matches", ErrUnsigned, KeySignature)
	}
	if req.GetId() != id {
		return fmt.Errorf("%w: id is not %s", ErrUnsigned, KeyID)
	}
	return fieldsOfBody(req)
}

// one is the single value of key in md.
func one(md metadata.MD, key string) (string, error) {
	vs := md.Get(key)
	switch {
	case len(vs) == 0 || vs[0] == "":
		return "", fmt.Errorf("%w: no %s", ErrUnsigned, key)
	case len(vs) > 1:
		return "", fmt.Errorf("%w: %s given %d times", ErrUnsigned, key, len(vs))
	}
	return vs[0], nil
}

// signed reports whether one "v1,<base64>" signature among values (each a space-separated list)
// is the HMAC-SHA256 of id.timestamp.body under one of keys.
func signed(keys [][]byte, id, ts string, body []byte, values []string) bool {
	for _, value := range values {
		for _, sig := range strings.Fields(value) {
			version, b64, ok := strings.Cut(sig, ",")
			if !ok || version != "v1" {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				continue
			}
			for _, key := range keys {
				m := hmac.New(sha256.New, key)
				m.Write([]byte(id + "." + ts + "."))
				m.Write(body)
				if hmac.Equal(got, m.Sum(nil)) {
					return true
				}
			}
		}
	}
	return false
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
		return fmt.Errorf("%w: body is not a JSON event", ErrUnsigned)
	}
	var data map[string]any
	if len(body.Data) > 0 && !bytes.Equal(body.Data, []byte("null")) {
		if err := json.Unmarshal(body.Data, &data); err != nil {
			return fmt.Errorf("%w: body's data is not an object", ErrUnsigned)
		}
	}
	var seq struct {
		Sequence int32 `json:"sequence"`
	}
	if data != nil {
		_ = json.Unmarshal(body.Data, &seq) // a sequence that is not an int32 reads as 0
	}
	differs := func(field string) error { return fmt.Errorf("%w: %s differs from the signed body", ErrUnsigned, field) }
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
	return nil
}

// UnaryServerInterceptor verifies every EventConsumerService.Deliver call with secrets (see
// Verify) before its handler runs, and answers one that does not verify UNAUTHENTICATED: the
// platform records that as a failed attempt and tries again on its schedule, so a receiver
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
			return nil, status.Error(codes.Internal, "eventverify: not a DeliverRequest")
		}
		md, _ := metadata.FromIncomingContext(ctx)
		if err := v.Verify(md, dr); err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		return handler(ctx, req)
	}
}
