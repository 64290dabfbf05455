package deliver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// grpcClients holds one client connection per gRPC consumer endpoint (host:port), made on first
// use and kept: a connection multiplexes every delivery to its endpoint and reconnects by itself.
//
// The connections are plaintext for now; TLS to consumers (system roots, optionally a pinned CA
// per application) is a follow-up.
type grpcClients struct {
	allowPrivate bool
	mu           sync.Mutex
	conns        map[string]*grpc.ClientConn
}

func newGRPCClients(allowPrivate bool) *grpcClients {
	return &grpcClients{allowPrivate: allowPrivate, conns: map[string]*grpc.ClientConn{}}
}

// conn returns the cached connection to target, making it if need be. grpc.NewClient does not
// dial: connecting happens on the first call, through dial below.
func (c *grpcClients) conn(target string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[target]; ok {
		return cc, nil
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	if !c.allowPrivate {
		dialer.Control = refusePrivate // on the resolved address, as for webhooks
	}
	cc, err := grpc.NewClient("passthrough:///"+target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		return nil, fmt.Errorf("gRPC consumer client: %w", err)
	}
	c.conns[target] = cc
	return cc, nil
}

// deliver calls EventConsumerService.Deliver on target once. OK is delivered; any other status is
// a failed attempt, recorded by its code (a gRPC consumer has no HTTP status).
func (c *grpcClients) deliver(ctx context.Context, target string, ev *store.Delivery) result {
	req, err := deliverRequest(ev)
	if err != nil {
		return result{err: err}
	}
	cc, err := c.conn(target)
	if err != nil {
		return result{err: err}
	}
	// WaitForReady(false), the default: an unreachable consumer fails the attempt at once rather
	// than holding the worker until the timeout.
	// WaitForReady: a connection still backing off from an earlier outage would otherwise fail
	// the attempt at once after the consumer recovered; the attempt's deadline bounds the wait.
	if _, err := eventsv1.NewEventConsumerServiceClient(cc).Deliver(ctx, req, grpc.WaitForReady(true)); err != nil {
		st := status.Convert(err)
		return result{err: fmt.Errorf("gRPC consumer answered %s: %s", st.Code(), st.Message())}
	}
	return result{}
}

// deliverRequest is the event as Deliver carries it: the webhook body's id, type, timestamp and
// data, and the body itself, byte for byte.
func deliverRequest(ev *store.Delivery) (*eventsv1.DeliverRequest, error) {
	var body struct {
		Type      string         `json:"type"`
		Timestamp *time.Time     `json:"timestamp"`
		Data      map[string]any `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &body); err != nil {
		return nil, fmt.Errorf("decode event body: %w", err)
	}
	data, err := structpb.NewStruct(body.Data)
	if err != nil {
		return nil, fmt.Errorf("event data: %w", err)
	}
	req := &eventsv1.DeliverRequest{Id: ev.EventID, Type: ev.Type, Time: timestamppb.New(ev.CreatedAt), Data: data, Body: ev.Payload}
	if body.Type != "" {
		req.Type = body.Type
	}
	if body.Timestamp != nil {
		req.Time = timestamppb.New(*body.Timestamp)
	}
	return req, nil
}

// close closes every cached connection.
func (c *grpcClients) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for target, cc := range c.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close gRPC consumer connection %s: %w", target, err))
		}
		delete(c.conns, target)
	}
	return errors.Join(errs...)
}
