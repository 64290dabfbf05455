// Package grpcx builds gRPC servers and clients the same way in every service: recovery,
// logging and error-mapping interceptors, the standard health service, reflection, and bearer
// credentials.
package grpcx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/metrics"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/telemetry"
)

// Server is a gRPC server with its health service.
type Server struct {
	*grpc.Server
	Health *health.Server
	log    *zap.Logger
	unary  []grpc.UnaryServerInterceptor
}

// ServerConfig configures NewServer.
type ServerConfig struct {
	Logger *zap.Logger
	// MaxRecvMsgSize bounds a request; 0 keeps gRPC's default of 4 MiB.
	MaxRecvMsgSize int
	// Interceptors run after recovery and logging and before the handler, e.g. authentication.
	Interceptors []grpc.UnaryServerInterceptor
	// Reflection registers the gRPC reflection service (INTEGRATIONS_GRPC_REFLECTION): off by
	// default, since it hands anyone who can reach the port the whole API's schema.
	Reflection bool
	// Internal, if not nil, serves mTLS with the service's identity and enforces Policy on
	// every call (see Policy). Nil is plaintext, with no Policy: loopback development only.
	Internal *Internal
	Policy   Policy
	// Public, if set and Internal is nil, serves TLS with server authentication only: a
	// client-facing port (see PublicCredentials).
	Public credentials.TransportCredentials
	// MaxConnectionAge bounds an internal server's connections (0: DefaultMaxConnectionAge): a
	// caller's certificate is verified once per connection, so a connection is closed — gently,
	// after its calls finish or MaxConnectionAgeGrace — and re-handshaken against the CA and
	// certificate on disk now. Not applied to a public server.
	MaxConnectionAge time.Duration
	// MaxConcurrentStreams bounds the calls one connection has in flight (0: gRPC's default, no
	// bound): past it a client's new calls wait on the client until one ends. A public server sets
	// it, so that one connection firing calls without waiting cannot pile up calls held or
	// running on the server.
	MaxConcurrentStreams uint32
}

// DefaultMaxConnectionAge bounds how long an internal connection outlives a change of the CA
// (gRPC jitters it by ±10%, so that a server's connections do not all reconnect at once), and
// maxConnectionAgeGrace how long its last calls may take after the server asked it to go.
const (
	DefaultMaxConnectionAge = 10 * time.Minute
	maxConnectionAgeGrace   = 30 * time.Second
)

// logMessageMax bounds a status message or error text in a log line: refusals quote the caller's
// input, and an error from a dependency may too.
const logMessageMax = 512

// NewServer returns a server whose calls are traced (pkg/telemetry: a span per call when tracing is
// on, the caller's trace context passed on either way) and whose unary calls pass through, in
// order: the per-RPC metrics
// (pkg/metrics), panic recovery, logging,
// the refusal of a request that could not be decoded (decode.go), error mapping (ToStatus), the
// caller's identity (Policy, on an internal port), then cfg.Interceptors.
func NewServer(cfg ServerConfig) *Server {
	log := cmp.Or(cfg.Logger, zap.NewNop())
	// A request that could not be decoded is refused before anything else reads it; the
	// caller's identity (Policy) is checked next, before the service's own interceptors.
	chain := []grpc.UnaryServerInterceptor{recoveryInterceptor(log), loggingInterceptor(log), decodeInterceptor, errorInterceptor(log)}
	streams := []grpc.StreamServerInterceptor{decodeStreamInterceptor}
	// Calls run on a pool of goroutines (a new one only when all are busy): a goroutine per call
	// grew its stack afresh on every call, a tenth of the gateway's CPU under a flood of refused
	// calls. (Marked experimental in grpc-go, and there since 1.30.)
	// Tracing on, a stats handler: its span is in the context of every interceptor, so the
	// handler's writes are in the trace. Off, no option (see the outermost interceptor below).
	opts := []grpc.ServerOption{telemetry.ServerOption(), grpc.ForceServerCodecV2(newDecodeCodec()), grpc.NumStreamWorkers(streamWorkers)}
	switch {
	case cfg.Internal != nil:
		chain = append(chain, policyUnary(cfg.Policy))
		streams = append(streams, policyStream(cfg.Policy))
		age := cfg.MaxConnectionAge
		if age <= 0 {
			age = DefaultMaxConnectionAge
		}
		opts = append(opts, grpc.Creds(cfg.Internal.serverCredentials()),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: age, MaxConnectionAgeGrace: maxConnectionAgeGrace}))
	case cfg.Public != nil:
		opts = append(opts, grpc.Creds(cfg.Public))
	}
	chain = append(chain, cfg.Interceptors...)
	// Per-RPC metrics (grpc_server_*), outermost: they see the status the caller gets (a panic,
	// a refusal and a handler's error all mapped within) and the whole call's time.
	// It also carries the caller's trace context in (telemetry.WrapServer), for a server that
	// records no span of its own: wrapped, not a level of the chain, which would allocate per call.
	chain = append([]grpc.UnaryServerInterceptor{telemetry.WrapServer(metrics.GRPCServer().UnaryServerInterceptor())}, chain...)
	streams = append([]grpc.StreamServerInterceptor{metrics.GRPCServer().StreamServerInterceptor()}, streams...)
	opts = append(opts, grpc.ChainUnaryInterceptor(chain...), grpc.ChainStreamInterceptor(streams...))
	if cfg.MaxConcurrentStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams))
	}
	if cfg.MaxRecvMsgSize > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize))
	}
	srv := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	if cfg.Reflection {
		reflection.Register(srv)
	}
	return &Server{Server: srv, Health: hs, log: log, unary: chain}
}

// Unary is the server's chain of unary interceptors as one, for a call served in process (the
// REST face calling the service directly): the same recovery, logging, error mapping and service
// interceptors as a call over the network, and the same tracing (telemetry.InProcessServer). A
// call served this way has no peer and no decode note of the server's codec.
func (s *Server) Unary() grpc.UnaryServerInterceptor {
	chain := s.unary
	if telemetry.Enabled() {
		// A span of its own, as the stats handler records over the network; off, the chain's
		// outermost interceptor passes the caller's trace context on (telemetry.WrapServer).
		chain = append([]grpc.UnaryServerInterceptor{telemetry.InProcessServer()}, chain...)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return callChain(ctx, chain, req, info, handler)
	}
}

// callChain runs chain[0], which calls the rest of the chain and finally handler.
func callChain(ctx context.Context, chain []grpc.UnaryServerInterceptor, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if len(chain) == 0 {
		return handler(ctx, req)
	}
	return chain[0](ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return callChain(ctx, chain[1:], req, info, handler)
	})
}

// Run serves on addr under app: it starts serving at once. On shutdown it reports NOT_SERVING
// at the signal and goes on serving through the drain window (clients and Kubernetes see the
// status and go elsewhere), then stops gracefully — no new calls, in-flight ones finish — and
// stops hard (in-flight calls cancelled) when ctx ends, at the soft timeout.
func (s *Server) Run(app *lifecycle.App, name, addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s for %s: %w", addr, name, err)
	}
	s.log.Info("grpc server listening", zap.String("server", name), zap.String("addr", lis.Addr().String()))
	app.OnDrain(name+" health", s.Health.Shutdown)
	app.Serve(name,
		func() error {
			if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("serve %s: %w", name, err)
			}
			return nil
		},
		func(ctx context.Context) error {
			s.Health.Shutdown() // already done at the signal; again in case the drain hooks were skipped
			done := make(chan struct{})
			go func() { s.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				s.log.Warn("grpc calls still in flight at the soft timeout; stopping hard", zap.String("server", name))
				s.Stop()
				<-done
			}
			return nil
		})
	return nil
}

func recoveryInterceptor(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("handler panicked", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
				err = ToStatus(errors.New("handler panicked")).Err()
			}
		}()
		return handler(ctx, req)
	}
}

// streamWorkers is the size of each server's pool of call goroutines: enough for the calls in
// flight at once on a busy replica; past it calls get goroutines of their own.
const streamWorkers = 64

// Refusal lines are sampled: per second, the first refusalSampleFirst of them are written, then one
// in refusalSampleThereafter. A client sending made-up keys is refused thousands of times a second
// without any credential, and a line each would let it fill the disk (a probe wrote ~1 MB/s). The
// sampler is on the refusal lines only: failures and panics are always written.
const (
	refusalSampleTick       = time.Second
	refusalSampleFirst      = 10
	refusalSampleThereafter = 100
)

// The sampled refusals' messages.
const (
	unauthenticatedMessage = "grpc call refused: unauthenticated"
	rateLimitedMessage     = "grpc call refused: rate limited"
)

func loggingInterceptor(log *zap.Logger) grpc.UnaryServerInterceptor {
	// dropped counts the refusal lines the sampler left out since the last one written; each
	// written line carries the count, so a flood shows in the log as its size, not its lines.
	// The sampler keys on level and message: each sampled kind of refusal has a message of its
	// own (and a counter of its own), so a flood of one never thins the lines of another.
	var droppedAuth, droppedLimit atomic.Int64
	refusals := log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, refusalSampleTick, refusalSampleFirst, refusalSampleThereafter,
			zapcore.SamplerHook(func(e zapcore.Entry, dec zapcore.SamplingDecision) {
				if dec&zapcore.LogDropped == 0 {
					return
				}
				if e.Message == unauthenticatedMessage {
					droppedAuth.Add(1)
				} else {
					droppedLimit.Add(1)
				}
			}))
	}))
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		code := status.Code(err)
		fields := []zap.Field{zap.String("method", info.FullMethod), zap.String("code", code.String()), zap.Duration("duration", time.Since(start))}
		switch code {
		case codes.Internal, codes.Unknown, codes.DataLoss:
			log.Error("grpc call failed", fields...)
		case codes.OK:
			log.Debug("grpc call", fields...)
		case codes.ResourceExhausted:
			// A client flooding past its rate limit is refused thousands of times a second: a log
			// line each would make the refusals cost more than the calls they keep out.
			// Checked first: building the fields (the status cloned for its message) is most of
			// the line's cost, for a line that is usually off.
			if ce := refusals.Check(zap.DebugLevel, rateLimitedMessage); ce != nil {
				ce.Write(append(fields, zap.String("message", safetext.Truncate(status.Convert(err).Message(), logMessageMax)), zap.Int64("refusals_dropped", droppedLimit.Swap(0)))...)
			}
		case codes.Unauthenticated:
			// Anyone can send calls with made-up keys, thousands a second, without a key of their
			// own: sampled, so that they cannot fill the disk.
			if ce := refusals.Check(zap.InfoLevel, unauthenticatedMessage); ce != nil {
				ce.Write(append(fields, zap.String("message", safetext.Truncate(status.Convert(err).Message(), logMessageMax)), zap.Int64("refusals_dropped", droppedAuth.Swap(0)))...)
			}
		default:
			// Every other refusal (a deadline passed, a bad argument, a wrong identity) is written:
			// those are not sent by the thousand without a credential.
			log.Info("grpc call refused", append(fields, zap.String("message", safetext.Truncate(status.Convert(err).Message(), logMessageMax)))...)
		}
		return resp, err
	}
}

// errorInterceptor turns handler errors into statuses. An INTERNAL answer is a bug: it is logged
// with its cause (error texts only; payloads are never part of one). An UNAVAILABLE one is a
// dependency's outage, logged with its cause at warning level.
func errorInterceptor(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err == nil {
			return resp, nil
		}
		st := ToStatus(err)
		switch st.Code() {
		case codes.Internal:
			log.Error("internal error", zap.String("method", info.FullMethod), zap.String("error", safetext.Error(err, logMessageMax)))
		case codes.Unavailable:
			log.Warn("dependency unavailable", zap.String("method", info.FullMethod), zap.String("error", safetext.Error(err, logMessageMax)))
		}
		return nil, st.Err()
	}
}

// BearerToken returns the token of the call's `authorization: Bearer <token>` metadata.
func BearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", apperr.Unauthenticated("missing authorization: expected 'Bearer <key>'")
	}
	if len(vals) > 1 {
		// Which credential counts would be chance: refused, as a REST request giving the
		// header twice is.
		return "", apperr.Unauthenticated("authorization given %d times: give one 'Bearer <key>'", len(vals))
	}
	return ParseBearer(vals[0])
}

// ParseBearer returns the token of an authorization value "Bearer <token>" (the scheme in any
// case).
func ParseBearer(value string) (string, error) {
	scheme, token, ok := strings.Cut(value, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return "", apperr.Unauthenticated("malformed authorization: expected 'Bearer <key>'")
	}
	return strings.TrimSpace(token), nil
}

// Dial returns a client connection to target (host:port). Connections are lazy: a service that
// starts before its peers does not fail; calls fail with UNAVAILABLE until the peer is up.
// Reconnection backs off from 100 ms to at most 5 s (gRPC's default grows to 2 minutes, which
// would keep a peer that restarted unreachable long after it is back).
func Dial(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, append(ClientOptions(), opts...)...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", target, err)
	}
	return conn, nil
}

// ClientOptions are the dial options of the platform's clients beyond transport and reconnection:
// a client span per call when tracing is on, the caller's trace context passed on either way
// (telemetry.WrapClient around the outermost interceptor when off), and per-RPC client metrics
// (grpc_client_*). Dial adds them; a client dialled elsewhere (the adapter SDK's callback client
// in the dummy adapter) takes them as its own options.
func ClientOptions() []grpc.DialOption {
	return []grpc.DialOption{
		telemetry.DialOption(),
		grpc.WithChainUnaryInterceptor(telemetry.WrapClient(metrics.GRPCClient().UnaryClientInterceptor())),
		grpc.WithChainStreamInterceptor(metrics.GRPCClient().StreamClientInterceptor()),
	}
}

// WithBearer returns ctx carrying `authorization: Bearer <token>` for an outgoing call.
func WithBearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}
