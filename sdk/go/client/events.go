package client

import (
	"context"
	"iter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

// ListEvents iterates over the application's events that filter selects (nil: all), newest
// first, without their delivery attempts (GetEvent has them), page after page as List does.
func (c *Client) ListEvents(ctx context.Context, filter *ListEventsRequest) iter.Seq2[*Event, error] {
	return func(yield func(*Event, error) bool) {
		req := &ListEventsRequest{}
		if filter != nil {
			req = proto.Clone(filter).(*ListEventsRequest)
		}
		walk(yield, req.GetPageToken(), func(token string) ([]*Event, string, error) {
			req.PageToken = token
			resp, err := c.rpc.ListEvents(c.auth(ctx), req)
			if err != nil {
				return nil, "", wrap(ctx, "list events", err)
			}
			return resp.GetEvents(), resp.GetNextPageToken(), nil
		})
	}
}

// GetEvent reads an event with every delivery attempt, oldest first.
func (c *Client) GetEvent(ctx context.Context, id string) (*Event, error) {
	resp, err := c.rpc.GetEvent(c.auth(ctx), &gatewayv1.GetEventRequest{Id: id})
	if err != nil {
		return nil, wrap(ctx, "get event "+id, err)
	}
	return resp.GetEvent(), nil
}

// RedeliverEvent delivers an event again, whatever its state, with a fresh budget of attempts and
// the same id (receivers deduplicate), and answers it.
func (c *Client) RedeliverEvent(ctx context.Context, id string) (*Event, error) {
	resp, err := c.rpc.RedeliverEvent(c.auth(ctx), &gatewayv1.RedeliverEventRequest{Id: id})
	if err != nil {
		return nil, wrap(ctx, "redeliver event "+id, err)
	}
	return resp.GetEvent(), nil
}

// RedriveEvents redelivers every dead event of the application that req selects (nil: all; since:
// those created since; validate_only: count them and redeliver nothing) and answers how many.
func (c *Client) RedriveEvents(ctx context.Context, req *RedriveEventsRequest) (int64, error) {
	if req == nil {
		req = &RedriveEventsRequest{}
	}
	resp, err := c.rpc.RedriveEvents(c.auth(ctx), req)
	if err != nil {
		return 0, wrap(ctx, "redrive events", err)
	}
	return resp.GetCount(), nil
}

// RegisterWebhook makes url (https://; http:// only where the deployment allows it) the
// application's consumer: its events are POSTed there, signed per Standard Webhooks. It answers
// the registration with the signing secret to verify them with (sdk/go/webhooks), the same
// across re-registrations until rotated.
func (c *Client) RegisterWebhook(ctx context.Context, url string) (*Consumer, error) {
	return c.setConsumer(ctx, &gatewayv1.SetConsumerRequest{
		Consumer: &gatewayv1.SetConsumerRequest_Webhook{Webhook: &gatewayv1.WebhookConsumer{Url: url}}})
}

// GRPCConsumer is an integrations.events.v1.EventConsumerService the application serves.
type GRPCConsumer struct {
	// Target is its address, host:port.
	Target string
	// CAPEM holds PEM CA certificates its certificate is verified against, instead of the system
	// roots (at most 64 KiB).
	CAPEM string
	// Plaintext calls it without TLS: only where the deployment allows http:// webhooks, and not
	// with CAPEM.
	Plaintext bool
}

// RegisterGRPC makes a gRPC EventConsumerService the application's consumer: its events are
// delivered by Deliver calls signed in their metadata as webhooks are (verify them with
// sdk/go/webhooks' VerifyDelivery or UnaryServerInterceptor). It answers the registration with the
// signing secret.
func (c *Client) RegisterGRPC(ctx context.Context, consumer GRPCConsumer) (*Consumer, error) {
	g := &gatewayv1.GrpcConsumer{Target: consumer.Target}
	if consumer.CAPEM != "" {
		g.CaPem = proto.String(consumer.CAPEM)
	}
	if consumer.Plaintext {
		g.Plaintext = proto.Bool(true)
	}
	return c.setConsumer(ctx, &gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Grpc{Grpc: g}})
}

func (c *Client) setConsumer(ctx context.Context, req *gatewayv1.SetConsumerRequest) (*Consumer, error) {
	resp, err := c.rpc.SetConsumer(c.auth(ctx), req)
	if err != nil {
		return nil, wrap(ctx, "register consumer", err)
	}
	return resp, nil
}

// RotateSecret makes a new signing secret and answers it; until previous_secret_expire_time
// deliveries carry a signature with each secret, so a receiver can switch without losing one.
func (c *Client) RotateSecret(ctx context.Context) (*SecretRotation, error) {
	resp, err := c.rpc.RotateSigningSecret(c.auth(ctx), &gatewayv1.RotateSigningSecretRequest{})
	if err != nil {
		return nil, wrap(ctx, "rotate signing secret", err)
	}
	return resp, nil
}

// CompletedData is an execution.completed event's data, typed: the event's execution_completed,
// or, from a gateway that sends only the untyped data (v0.1), data read into the same message.
// nil for an event of another type, or whose data does not read as one.
func CompletedData(e *Event) *ExecutionCompletedData {
	if d := e.GetExecutionCompleted(); d != nil {
		return d
	}
	d, _ := untypedData(e).(*ExecutionCompletedData)
	return d
}

// ProgressData is an execution.progress event's data, typed, as CompletedData reads a
// completion's.
func ProgressData(e *Event) *ExecutionProgressData {
	if d := e.GetExecutionProgress(); d != nil {
		return d
	}
	d, _ := untypedData(e).(*ExecutionProgressData)
	return d
}

// untypedData is e's data (the Struct) read into the message of its type, or nil.
func untypedData(e *Event) proto.Message {
	if e.GetData() == nil {
		return nil
	}
	raw, err := protojson.Marshal(e.GetData())
	if err != nil {
		return nil
	}
	m, err := webhooks.TypedData(e.GetType(), raw)
	if err != nil {
		return nil
	}
	return m
}
