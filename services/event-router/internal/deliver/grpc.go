package deliver

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// grpcTarget is where a gRPC consumer is and how it is reached, as registered.
type grpcTarget struct {
	// addr is host:port.
	addr string
	// plaintext: without TLS (the gateway allowed it at registration, for development).
	plaintext bool
	// caPEM is the CA bundle the consumer's certificate must chain to; empty: the system roots.
	caPEM string
}

// grpcTargetOf is ev's consumer as a grpcTarget.
func grpcTargetOf(ev *store.Delivery) grpcTarget {
	t := grpcTarget{addr: *ev.Endpoint, plaintext: ev.GRPCPlaintext}
	if ev.GRPCCA != nil {
		t.caPEM = *ev.GRPCCA
	}
	return t
}

// connKey names one connection: a target with its transport, so that two applications serving
// one address with different CAs, or an application re-registering with another CA, never share
// a connection verified for the other.
type connKey struct {
	addr      string
	plaintext bool
	ca        [sha256.Size]byte // of caPEM; zero: the system roots
}

func (t grpcTarget) key() connKey {
	k := connKey{addr: t.addr, plaintext: t.plaintext}
	if t.caPEM != "" {
		k.ca = sha256.Sum256([]byte(t.caPEM))
	}
	return k
}

// grpcClients holds one client connection per gRPC consumer endpoint and transport, made on
// first use and kept: a connection multiplexes every delivery to its endpoint and reconnects by
// itself.
//
// Connections are TLS (1.2 at least), the consumer's certificate verified against the system
// roots or the CA bundle registered with it, for the target's host — unless the consumer was
// registered plaintext, which the gateway allows only where http webhooks are allowed.
type grpcClients struct {
	policy   webhook.Policy
	resolver *net.Resolver
	mu       sync.Mutex
	conns    map[connKey]*grpc.ClientConn
	// connErrs holds each connection's last failure to connect — the dial's or the TLS
	// handshake's — and nil once a connection is made (the handshake succeeded): a call that
	// never reached the consumer fails with the channel's own status, and the category of the
	// attempt comes from why the connection could not be made (connection_refused, dns,
	// refused_address, tls).
	//
	// It is per connection, not per call, and that is a limit: gRPC dials from the channel's own
	// context, not the call's (no context value of the call reaches the dialer), and one dial
	// serves every call waiting on the channel. So the cause given is the channel's latest
	// failure, which may come from a dial made before this call began (the channel backing off
	// from it), and concurrent attempts to one target all see the same one. That is what the
	// attempt failed on, so the category is right; only which dial is not tracked.
	connErrs map[connKey]error
}

func newGRPCClients(policy webhook.Policy, resolver *net.Resolver) *grpcClients {
	return &grpcClients{policy: policy, resolver: resolver, conns: map[connKey]*grpc.ClientConn{}, connErrs: map[connKey]error{}}
}

func (c *grpcClients) setConnErr(k connKey, err error) {
	c.mu.Lock()
	c.connErrs[k] = err
	c.mu.Unlock()
}

// conn returns the cached connection to t, making it if need be. grpc.NewClient does not
// dial: connecting happens on the first call, through the dialer below, whose Control checks
// the policy on the address actually connected, after resolution, as for webhooks. The
// passthrough resolver hands the target to that dialer as is: no gRPC name resolution (DNS SRV,
// service config, balancer lists) picks addresses the check would not see. The dialer resolves
// the host rooted (webhook.RootedDial), never under the router's search domains; the
// :authority and the TLS server name still come from the target as registered.
func (c *grpcClients) conn(t grpcTarget, host string) (*grpc.ClientConn, error) {
	k := t.key()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[k]; ok {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if !t.plaintext {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
		if t.caPEM != "" {
			// The stored bundle was checked at registration; one written around it is refused here.
			pool, err := webhook.ParseCAPEM(t.caPEM)
			if err != nil {
				return nil, fmt.Errorf("gRPC consumer CA bundle: %w", err)
			}
			cfg.RootCAs = pool
		}
		creds = credentials.NewTLS(cfg)
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, Resolver: c.resolver, Control: c.policy.Control}
	dial := webhook.RootedDial(dialer.DialContext)
	cc, err := grpc.NewClient("passthrough:///"+t.addr,
		grpc.WithTransportCredentials(recordingCreds{TransportCredentials: creds, record: func(err error) { c.setConnErr(k, err) }}),
		// The consumer gets the delivery's trace context (its "deliver" span is the client span).
		telemetry.PropagateDialOption(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := dial(ctx, "tcp", addr)
			if err != nil {
				c.setConnErr(k, err)
			}
			return conn, err
		}))
	if err != nil {
		return nil, fmt.Errorf("gRPC consumer client: %w", err)
	}
	c.conns[k] = cc
	return cc, nil
}

// recordingCreds are transport credentials that record the outcome of every client handshake:
// a TLS failure (an unknown authority, a name mismatch, a plaintext server) is kept as the
// connection's failure, and a success clears the one before. The plaintext handshake always
// succeeds, so it only clears.
type recordingCreds struct {
	credentials.TransportCredentials
	record func(error)
}

func (r recordingCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := r.TransportCredentials.ClientHandshake(ctx, authority, conn)
	r.record(err)
	return out, info, err
}

func (r recordingCreds) Clone() credentials.TransportCredentials {
	return recordingCreds{TransportCredentials: r.TransportCredentials.Clone(), record: r.record}
}

func (c *grpcClients) connErr(k connKey) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connErrs[k]
}

// deliver calls EventConsumerService.Deliver on t once, signed with secrets (the application's
// current secret, then the previous one during a rotation's overlap) per the Standard Webhooks
// convention: webhook-id, webhook-timestamp and webhook-signature in the call's metadata, the
// signature over the request's body — the webhook body, byte for byte. OK is delivered; any
// other status the consumer answered is a failed attempt recorded by its code (grpc_status); a
// call that never reached the consumer is recorded by why (refused_address, connection_refused,
// dns, tls, timeout).
func (c *grpcClients) deliver(ctx context.Context, t grpcTarget, secrets []string, ev *store.Delivery) result {
	// The stored target may not have come through registration: check it before dialling.
	host, err := c.policy.CheckTarget(t.addr)
	if err != nil {
		return result{err: fmt.Errorf("gRPC consumer target: %w", err), category: webhook.CategoryRefusedAddress}
	}
	req, err := deliverRequest(ev)
	if err != nil {
		return result{err: err, category: webhook.CategoryOther}
	}
	now := time.Now()
	sigs, err := webhooks.SignAll(secrets, req.GetId(), now, req.GetBody())
	if err != nil {
		return result{err: err, category: webhook.CategoryOther}
	}
	cc, err := c.conn(t, host)
	if err != nil {
		return result{err: err, category: webhook.CategoryTLS}
	}
	ctx = metadata.AppendToOutgoingContext(ctx,
		webhooks.HeaderID, req.GetId(), webhooks.HeaderTimestamp, webhooks.Timestamp(now), webhooks.HeaderSignature, sigs)
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
		cause := c.connErr(t.key())
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
// data (as a Struct, and typed by the event's type) and data.sequence, and the body itself, byte
// for byte.
func deliverRequest(ev *store.Delivery) (*eventsv1.DeliverRequest, error) {
	var body struct {
		Type      string          `json:"type"`
		Timestamp *time.Time      `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &body); err != nil {
		return nil, fmt.Errorf("decode event body: %w", err)
	}
	var fields map[string]any
	// data.sequence again, as a number of its own: in data it is a Struct's float.
	var seq struct {
		Sequence int32 `json:"sequence"`
	}
	if len(body.Data) > 0 {
		if err := json.Unmarshal(body.Data, &fields); err != nil {
			return nil, fmt.Errorf("decode event data: %w", err)
		}
		if err := json.Unmarshal(body.Data, &seq); err != nil {
			return nil, fmt.Errorf("decode event sequence: %w", err)
		}
	}
	data, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, fmt.Errorf("event data: %w", err)
	}
	req := &eventsv1.DeliverRequest{Id: ev.EventID, Type: ev.Type, Time: timestamppb.New(ev.CreatedAt), Data: data, Body: ev.Payload,
		Sequence: seq.Sequence}
	if body.Type != "" {
		req.Type = body.Type
	}
	if body.Timestamp != nil {
		req.Time = timestamppb.New(*body.Timestamp)
	}
	// The same data typed, as webhooks.VerifyDelivery holds it to the body.
	typed, err := webhooks.TypedData(req.GetType(), body.Data)
	if err != nil {
		return nil, err
	}
	switch m := typed.(type) {
	case *eventsv1.ExecutionCompletedData:
		req.TypedData = &eventsv1.DeliverRequest_ExecutionCompleted{ExecutionCompleted: m}
	case *eventsv1.ExecutionProgressData:
		req.TypedData = &eventsv1.DeliverRequest_ExecutionProgress{ExecutionProgress: m}
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
			errs = append(errs, fmt.Errorf("close gRPC consumer connection %s: %w", target.addr, err))
		}
		delete(c.conns, target)
		delete(c.connErrs, target)
	}
	return errors.Join(errs...)
}
