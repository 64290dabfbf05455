package webhooks_test

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const body = `{"id":"evt-1","type":"execution.completed","timestamp":"2026-01-02T03:04:05.123456Z",` +
	`"data":{"execution_id":"ex-1","status":"succeeded","result":{"echo":"hé"},"sequence":2}}`

// delivery is what the event router sends for body: the request and its metadata, signed at ts
// with secrets, signed here as Standard Webhooks says, apart from the platform's signer.
func delivery(t *testing.T, ts time.Time, secrets ...string) (metadata.MD, *eventsv1.DeliverRequest) {
	t.Helper()
	sigs, err := signAll(secrets, "evt-1", ts, []byte(body))
	require.NoError(t, err)
	data, err := structpb.NewStruct(map[string]any{"execution_id": "ex-1", "status": "succeeded",
		"result": map[string]any{"echo": "hé"}, "sequence": 2})
	require.NoError(t, err)
	result, err := structpb.NewStruct(map[string]any{"echo": "hé"})
	require.NoError(t, err)
	req := &eventsv1.DeliverRequest{Id: "evt-1", Type: "execution.completed",
		Time: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)), Data: data, Body: []byte(body), Sequence: 2,
		TypedData: &eventsv1.DeliverRequest_ExecutionCompleted{ExecutionCompleted: &eventsv1.ExecutionCompletedData{
			ExecutionId: "ex-1", Status: "succeeded", Result: result, Sequence: 2}}}
	return metadata.Pairs(webhooks.HeaderID, "evt-1", webhooks.HeaderTimestamp, timestamp(ts),
		webhooks.HeaderSignature, sigs), req
}

func secret(t *testing.T) string {
	t.Helper()
	key := make([]byte, 24)
	_, err := rand.Read(key)
	require.NoError(t, err)
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

func TestVerifyDelivery(t *testing.T) {
	t.Parallel()
	current, previous, other := secret(t), secret(t), secret(t)
	now := time.Now()

	md, req := delivery(t, now, current)
	require.NoError(t, webhooks.VerifyDelivery(md, req, current))
	require.NoError(t, webhooks.VerifyDelivery(md, req, other, current), "any of the receiver's secrets")
	require.ErrorIs(t, webhooks.VerifyDelivery(md, req, other), webhooks.ErrUnverified)
	require.ErrorIs(t, webhooks.VerifyDelivery(md, req), webhooks.ErrUnverified, "no secret verifies nothing")
	require.Error(t, webhooks.VerifyDelivery(md, req, "not-a-secret!"))

	// During a rotation's overlap both signatures come: either secret verifies on its own.
	md, req = delivery(t, now, current, previous)
	require.NoError(t, webhooks.VerifyDelivery(md, req, current))
	require.NoError(t, webhooks.VerifyDelivery(md, req, previous))
	require.ErrorIs(t, webhooks.VerifyDelivery(md, req, other), webhooks.ErrUnverified)

	// The timestamp is held to the tolerance.
	md, req = delivery(t, now.Add(-6*time.Minute), current)
	require.ErrorIs(t, webhooks.VerifyDelivery(md, req, current), webhooks.ErrUnverified)
	require.NoError(t, webhooks.Verifier{Secrets: []string{current}, Tolerance: 10 * time.Minute}.VerifyDelivery(md, req))
	require.NoError(t, webhooks.Verifier{Secrets: []string{current}, Now: func() time.Time { return now.Add(-6 * time.Minute) }}.VerifyDelivery(md, req))

	// A router before v0.2 sets no typed data: the request verifies without it.
	md, req = delivery(t, now, current)
	req.TypedData = nil
	require.NoError(t, webhooks.VerifyDelivery(md, req, current))

	// A later router's typed data carries a field this build does not know (kept as an unknown
	// field, as the wire brings it); the body's reading skips it too: the request verifies.
	md, req = delivery(t, now, current)
	completed := req.GetExecutionCompleted()
	require.NotNil(t, completed)
	wire, err := proto.Marshal(completed)
	require.NoError(t, err)
	wire = protowire.AppendString(protowire.AppendTag(wire, 999, protowire.BytesType), "from a later release")
	later := &eventsv1.ExecutionCompletedData{}
	require.NoError(t, proto.Unmarshal(wire, later))
	require.NotEmpty(t, later.ProtoReflect().GetUnknown())
	req.TypedData = &eventsv1.DeliverRequest_ExecutionCompleted{ExecutionCompleted: later}
	require.NoError(t, webhooks.VerifyDelivery(md, req, current))
}

// TestVerifyDeliveryRefusesTampering: the body, the metadata and each typed field are held to what was
// signed.
func TestVerifyDeliveryRefusesTampering(t *testing.T) {
	t.Parallel()
	s := secret(t)
	for _, tc := range []struct {
		name   string
		tamper func(md metadata.MD, req *eventsv1.DeliverRequest)
	}{
		{"body", func(_ metadata.MD, r *eventsv1.DeliverRequest) {
			r.Body = append([]byte(nil), r.Body[:len(r.Body)-1]...)
		}},
		{"id", func(_ metadata.MD, r *eventsv1.DeliverRequest) { r.Id = "evt-2" }},
		{"webhook-id", func(md metadata.MD, _ *eventsv1.DeliverRequest) { md.Set(webhooks.HeaderID, "evt-2") }},
		{"webhook-timestamp", func(md metadata.MD, _ *eventsv1.DeliverRequest) {
			md.Set(webhooks.HeaderTimestamp, timestamp(time.Now().Add(-time.Second)))
		}},
		{"two timestamps", func(md metadata.MD, _ *eventsv1.DeliverRequest) {
			md.Append(webhooks.HeaderTimestamp, timestamp(time.Now()))
		}},
		{"no signature", func(md metadata.MD, _ *eventsv1.DeliverRequest) { md.Delete(webhooks.HeaderSignature) }},
		{"type", func(_ metadata.MD, r *eventsv1.DeliverRequest) { r.Type = "execution.progress" }},
		{"time", func(_ metadata.MD, r *eventsv1.DeliverRequest) {
			r.Time = timestamppb.New(r.Time.AsTime().Add(time.Second))
		}},
		{"sequence", func(_ metadata.MD, r *eventsv1.DeliverRequest) { r.Sequence = 1 }},
		{"data", func(_ metadata.MD, r *eventsv1.DeliverRequest) {
			r.Data.Fields["status"] = structpb.NewStringValue("failed")
		}},
		{"no data", func(_ metadata.MD, r *eventsv1.DeliverRequest) { r.Data = nil }},
		{"typed data", func(_ metadata.MD, r *eventsv1.DeliverRequest) { r.GetExecutionCompleted().Status = "failed" }},
		{"typed data of another type", func(_ metadata.MD, r *eventsv1.DeliverRequest) {
			r.TypedData = &eventsv1.DeliverRequest_ExecutionProgress{ExecutionProgress: &eventsv1.ExecutionProgressData{ExecutionId: "ex-1", Sequence: 2}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			md, req := delivery(t, time.Now(), s)
			require.NoError(t, webhooks.VerifyDelivery(md, proto.Clone(req).(*eventsv1.DeliverRequest), s))
			tc.tamper(md, req)
			require.ErrorIs(t, webhooks.VerifyDelivery(md, req, s), webhooks.ErrUnverified)
		})
	}
}

func TestUnaryServerInterceptor(t *testing.T) {
	t.Parallel()
	s := secret(t)
	intercept := webhooks.UnaryServerInterceptor(s)
	deliver := &grpc.UnaryServerInfo{FullMethod: eventsv1.EventConsumerService_Deliver_FullMethodName}
	called := 0
	handler := func(context.Context, any) (any, error) { called++; return &eventsv1.DeliverResponse{}, nil }

	md, req := delivery(t, time.Now(), s)
	_, err := intercept(metadata.NewIncomingContext(context.Background(), md), req, deliver, handler)
	require.NoError(t, err)
	require.Equal(t, 1, called)

	req.Sequence = 7
	_, err = intercept(metadata.NewIncomingContext(context.Background(), md), req, deliver, handler)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	_, err = intercept(context.Background(), req, deliver, handler)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no metadata at all")
	require.Equal(t, 1, called, "the handler never sees an unverified delivery")

	_, err = intercept(context.Background(), struct{}{}, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}, handler)
	require.NoError(t, err, "other methods pass through")
	require.False(t, errors.Is(err, webhooks.ErrUnverified))
}

// timestamp is a webhook-timestamp value: Unix seconds.
func timestamp(ts time.Time) string { return strconv.FormatInt(ts.Unix(), 10) }

// signAll is the webhook-signature value for secrets: "v1,<base64 HMAC-SHA256 of id.ts.body>" per
// secret, separated by spaces.
func signAll(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil {
			return "", err
		}
		m := hmac.New(sha256.New, key)
		m.Write([]byte(id + "." + timestamp(ts) + "."))
		m.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return strings.Join(sigs, " "), nil
}
