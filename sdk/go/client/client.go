package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// The generated types the client takes and answers, by shorter names. They are aliases: a value
// is the generated message itself.
type (
	// Execution is one invocation of a capability, with its status, result or failure.
	Execution = executionv1.Execution
	// ExecutionStatus is an execution's place in its state machine (EXECUTION_STATUS_...).
	ExecutionStatus = executionv1.ExecutionStatus
	// Event is one event of the application (execution.completed, execution.progress) with its
	// delivery state.
	Event = eventsv1.Event
	// ExecutionCompletedData is an execution.completed event's data (CompletedData reads it).
	ExecutionCompletedData = eventsv1.ExecutionCompletedData
	// ExecutionProgressData is an execution.progress event's data (ProgressData reads it).
	ExecutionProgressData = eventsv1.ExecutionProgressData
	// Timeline is what happened to an execution, oldest first.
	Timeline = gatewayv1.GetExecutionTimelineResponse
	// ListExecutionsRequest filters List: status, capability, created_after, created_before,
	// query (an execution id or the start of an idempotency key), page_size, page_token.
	ListExecutionsRequest = gatewayv1.ListExecutionsRequest
	// ListEventsRequest filters ListEvents: status, execution_id, since, until, page_size,
	// page_token.
	ListEventsRequest = gatewayv1.ListEventsRequest
	// RedriveEventsRequest selects the dead events RedriveEvents redelivers (since) and may only
	// count them (validate_only).
	RedriveEventsRequest = gatewayv1.RedriveEventsRequest
	// Consumer is a consumer registration as the gateway took it, with the signing secret.
	Consumer = gatewayv1.SetConsumerResponse
	// SecretRotation is a new signing secret, and until when the previous one signs too.
	SecretRotation = gatewayv1.RotateSigningSecretResponse
)

// Client calls the gateway's GatewayService as one application: every call carries its API key.
// It is safe for concurrent use.
type Client struct {
	rpc    gatewayv1.GatewayServiceClient
	conn   *grpc.ClientConn // dialled by New, closed by Close; nil for NewWithConn
	apiKey string
	poll   pollSettings
}

// pollSettings are WaitForSettlement's delays between reads.
type pollSettings struct{ initial, max time.Duration }

// options are what the Options set.
type options struct {
	creds    credentials.TransportCredentials
	dialOpts []grpc.DialOption
	poll     pollSettings
}

// Option configures New or NewWithConn.
type Option func(*options)

// WithTLS dials with TLS configured by cfg (for instance RootCAs for a private CA). Without
// WithTLS or WithInsecure, New dials with TLS verified against the system roots.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.creds = credentials.NewTLS(cfg) }
}

// WithInsecure dials without TLS: for a gateway on loopback in development (such as the
// repository's `make run` serves on 127.0.0.1:9090). The API key then travels in the clear.
func WithInsecure() Option {
	return func(o *options) { o.creds = insecure.NewCredentials() }
}

// WithDialOptions adds gRPC dial options (interceptors, keepalive, a user agent) to New's dial.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// MinPollInterval is the least delay WithPolling takes between WaitForSettlement's reads: a
// smaller one (zero and negative included) is raised to it, so that no setting polls the gateway
// in a tight loop.
const MinPollInterval = 10 * time.Millisecond

// WithPolling sets WaitForSettlement's delays: from initial, growing by half each read, to at
// most maxDelay (defaults 100 ms and 2 s). Each is at least MinPollInterval, and maxDelay at
// least initial: smaller values are raised to those.
func WithPolling(initial, maxDelay time.Duration) Option {
	initial = durationAtLeast(initial, MinPollInterval)
	maxDelay = durationAtLeast(maxDelay, initial)
	return func(o *options) { o.poll = pollSettings{initial: initial, max: maxDelay} }
}

func durationAtLeast(d, least time.Duration) time.Duration {
	if d < least {
		return least
	}
	return d
}

// errAPIKey is New's and NewWithConn's refusal of an empty API key: every call would be refused
// UNAUTHENTICATED.
var errAPIKey = errors.New("client: an API key is required")

// New dials the gateway's gRPC address target (host:port) and answers a client that calls as
// the application whose API key is apiKey. Close releases the connection.
func New(target, apiKey string, opts ...Option) (*Client, error) {
	if apiKey == "" {
		return nil, errAPIKey
	}
	o := collect(opts)
	creds := o.creds
	if creds == nil {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, o.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", target, err)
	}
	c := newClient(conn, apiKey, o)
	c.conn = conn
	return c, nil
}

// NewWithConn answers a client on a connection the caller made and keeps: Close leaves it open.
// Options that concern dialling (WithTLS, WithInsecure, WithDialOptions) have no effect. As New,
// it refuses an empty API key (and a nil connection).
func NewWithConn(conn grpc.ClientConnInterface, apiKey string, opts ...Option) (*Client, error) {
	if conn == nil {
		return nil, errors.New("client: a connection is required")
	}
	if apiKey == "" {
		return nil, errAPIKey
	}
	return newClient(conn, apiKey, collect(opts)), nil
}

func collect(opts []Option) options {
	o := options{poll: pollSettings{initial: 100 * time.Millisecond, max: 2 * time.Second}}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

func newClient(conn grpc.ClientConnInterface, apiKey string, o options) *Client {
	return &Client{rpc: gatewayv1.NewGatewayServiceClient(conn), apiKey: apiKey, poll: o.poll}
}

// Close closes the connection New dialled; for NewWithConn's client it does nothing.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// auth is ctx with the call's credentials. The key goes in each call's metadata rather than as
// per-RPC credentials of the connection, so that a connection the caller dialled works the same.
func (c *Client) auth(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.apiKey)
}
