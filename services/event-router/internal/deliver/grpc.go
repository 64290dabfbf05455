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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// grpcClients holds one client connection per gRPC consumer endpoint (host:port), made on first
// use and kept: a connection multiplexes every delivery to its endpoint and reconnects by itself.
//
// The connections are plaintext for now; TLS to consumers (system roots, optionally a pinned CA
// per application) is a follow-up.
type grpcClients struct {
	policy   webhook.Policy
	resolver *net.Resolver
	mu       sync.Mutex
	conns    map[string]*grpc.ClientConn
	// dialErrs holds each target's last connection error (nil after a connection is made): a
	// call that never reached the consumer fails with the channel's own status, and the
	// category of the attempt comes from why the connection could not be made.
	//
	// It is per target, not per call, and that is a limit: gRPC dials from the channel's own
	// context, not the call's (no context value of the call reaches the dialer), and one dial
	// serves every call waiting on the channel. So the cause given is the channel's latest
	// failure, which may come from a dial made before this call began (the channel backing off
	// from it), and concurrent attempts to one target all see the same one. That is what the
	// attempt failed on, so the category is right; only which dial is not tracked.
	dialErrs map[string]error
}

func newGRPCClients(policy webhook.Policy, resolver *net.Resolver) *grpcClients {
	return &grpcClients{policy: policy, resolver: resolver, conns: map[string]*grpc.ClientConn{}, dialErrs: map[string]error{}}
}

// conn returns the cached connection to target, making it if need be. grpc.NewClient does not
// dial: connecting happens on the first call, through the dialer below, whose Control checks
// the policy on the address actually connected, after resolution, as for webhooks. The
// passthrough resolver hands the target to that dialer as is: no gRPC name resolution (DNS SRV,
// service config, balancer lists) picks addresses the check would not see. The dialer resolves
// the host rooted (webhook.RootedDial), never under the router's search domains; the
// :authority still comes from the target as registered.
func (c *grpcClients) conn(target string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[target]; ok {
		return cc, nil
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, Resolver: c.resolver, Control: c.policy.Control}
	dial := webhook.RootedDial(dialer.DialContext)
	cc, err := grpc.NewClient("passthrough:///"+target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The consumer gets the delivery's trace context (its "deliver" span is the client span).
		telemetry.PropagateDialOption(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := dial(ctx, "tcp", addr)
			c.mu.Lock()
			c.dialErrs[target] = err
			c.mu.Unlock()
			return conn, err
		}))
	if err != nil {
		return nil, fmt.Errorf("gRPC consumer client: %w", err)
	}
	c.conns[target] = cc
	return cc, nil
}

func (c *grpcClients) dialErr(target string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dialErrs[target]
}

// deliver calls EventConsumerService.Deliver on target once. OK is delivered; any other status
// the consumer answered is a failed attempt recorded by its code (grpc_status); a call that never
// reached the consumer is recorded by why (refused_address, connection_refused, dns, timeout).
func (c *grpcClients) deliver(ctx context.Context, target string, ev *store.Delivery) result {
	// The stored target may not have come through registration: check it before dialling.
	if _, err := c.policy.CheckTarget(target); err != nil {
		return result{err: fmt.Errorf("gRPC consumer target: %w", err), category: webhook.CategoryRefusedAddress}
	}
	req, err := deliverRequest(ev)
	if err != nil {
		return result{err: err, category: webhook.CategoryOther}
	}
	cc, err := c.conn(target)
	if err != nil {
		return result{err: err, category: webhook.CategoryOther}
	}
	// WaitForReady: a connection still backing off from an earlier outage would otherwise fail
	// the attempt at once after the consumer recovered; the attempt's deadline bounds the wait.
	var p peer.Peer
	_, err = eventsv1.NewEventConsumerServiceClient(cc).Deliver(ctx, req, grpc.WaitForReady(true), grpc.Peer(&p))
	if err == nil {
		return result{}
	}
	st := status.Convert(err)
	if p.Addr == nil {
		// No stream was opened: the consumer was never reached.
		cause := c.dialErr(target)
		switch {
		case cause != nil:
			return result{err: fmt.Errorf("gRPC consumer not reached (%s): %w", st.Code(), cause), category: category(cause)}
		case st.Code() == codes.DeadlineExceeded:
			return result{err: fmt.Errorf("gRPC consumer not reached in time: %s", st.Message()), category: webhook.CategoryTimeout}
		default:
			return result{err: fmt.Errorf("gRPC consumer not reached: %s: %s", st.Code(), st.Message()), category: webhook.CategoryOther}
		}
	}
	if st.Code() == codes.DeadlineExceeded {
		return result{err: fmt.Errorf("gRPC consumer did not answer in time: %s", st.Message()), category: webhook.CategoryTimeout}
	}
	return result{statusCode: int(st.Code()), category: webhook.CategoryGRPCStatus,
		err: fmt.Errorf("gRPC consumer answered %s: %s", st.Code(), st.Message())}
}

// deliverRequest is the event as Deliver carries it: the webhook body's id, type, timestamp,
// data and data.sequence, and the body itself, byte for byte.
func deliverRequest(ev *store.Delivery) (*eventsv1.DeliverRequest, error) {
	var body struct {
		Type      string         `json:"type"`
		Timestamp *time.Time     `json:"timestamp"`
		Data      map[string]any `json:"data"`
	}
	var seq struct {
		Data struct {
			Sequence int32 `json:"sequence"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &body); err != nil {
		return nil, fmt.Errorf("decode event body: %w", err)
	}
	// data.sequence again, as a number of its own: in data it is a Struct's float.
	if err := json.Unmarshal(ev.Payload, &seq); err != nil {
		return nil, fmt.Errorf("decode event sequence: %w", err)
	}
	data, err := structpb.NewStruct(body.Data)
	if err != nil {
		return nil, fmt.Errorf("event data: %w", err)
	}
	req := &eventsv1.DeliverRequest{Id: ev.EventID, Type: ev.Type, Time: timestamppb.New(ev.CreatedAt), Data: data, Body: ev.Payload,
		Sequence: seq.Data.Sequence}
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
		delete(c.dialErrs, target)
	}
	return errors.Join(errs...)
}
