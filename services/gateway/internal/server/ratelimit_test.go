package server_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// limitedCatalog is the test catalog's application with limits of its own, and a second
// application left at the defaults.
const limitedCatalog = `
applications:
  - id: app
    api_key: test-api-key-0123456789
    rate_limits: {invokes_per_second: 1, invoke_burst: 1, reads_per_second: 40, read_burst: 10}
  - id: other
    api_key: other-api-key-0123456789
adapters:
  - id: adp
    endpoint: 127.0.0.1:50070
    credential: test-credential-0123456789
capabilities:
  - name: test.echo
    adapter: adp
    modes: [async]
`

// slowCatalog is limitedCatalog with an invoke rate of one per 100 s: a refused call's next token
// is so far away that no hold in these tests, however late a loaded machine runs it, reaches it.
var slowCatalog = strings.Replace(limitedCatalog, "invokes_per_second: 1,", "invokes_per_second: 0.01,", 1)

const otherKey = "other-api-key-0123456789"

// gateway is one in-process gateway replica: its gRPC server wired as main.go wires it (auth,
// then rate limits), with its own heartbeat on the shared schema.
type gateway struct {
	client   gatewayv1.GatewayServiceClient
	replicas *ratelimit.Replicas
}

func startGateway(t *testing.T, s *dbtest.Schema, heartbeat, hold time.Duration) *gateway {
	t.Helper()
	return startGatewayHolding(t, s, heartbeat, hold, server.MaxHeldPerApplication)
}

// startGatewayHolding is startGateway holding at most maxHeld calls per application.
func startGatewayHolding(t *testing.T, s *dbtest.Schema, heartbeat, hold time.Duration, maxHeld int) *gateway {
	t.Helper()
	log := zaptest.NewLogger(t)
	st := store.New(s.Pool).WithCache(time.Minute)
	replicas := ratelimit.NewReplicas(s.Pool, heartbeat, log)
	require.NoError(t, replicas.Beat(context.Background()))
	limiter := ratelimit.New(ratelimit.NewSource(s.Pool, ratelimit.Limits{
		Invoke: ratelimit.Limit{PerSecond: 1000, Burst: 1000}, Read: ratelimit.Limit{PerSecond: 1000, Burst: 1000},
	}, time.Minute).Limits, replicas.Count)
	srv := grpcx.NewServer(grpcx.ServerConfig{Logger: log, Interceptors: []grpc.UnaryServerInterceptor{
		server.AuthInterceptor(st, nil, ""), server.NewRateGate(limiter, hold, maxHeld).Interceptor()}})
	adapters := adaptercall.NewPool()
	t.Cleanup(func() { _ = adapters.Close() })
	box, err := secret.NewBox("INTEGRATIONS_SECRET_KEY", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	require.NoError(t, err)
	gatewayv1.RegisterGatewayServiceServer(srv, server.New(st, adapters, nil, nil, box,
		server.Options{MaxPayloadBytes: 1 << 20, Scale: func(d time.Duration) time.Duration { return d }}, log))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpcx.Dial(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &gateway{client: gatewayv1.NewGatewayServiceClient(conn), replicas: replicas}
}

func authed(key string) context.Context { return grpcx.WithBearer(context.Background(), key) }

// read is a cheap read: an execution that does not exist (NOT_FOUND once admitted).
func read(g *gateway, key string) error {
	_, err := g.client.GetExecution(authed(key), &gatewayv1.GetExecutionRequest{Id: uuid.NewString()})
	return err
}

func TestRateLimitRefusalCarriesRetryInfoAndNamesTheLimit(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, limitedCatalog)
	g := startGateway(t, s, time.Minute, 0)

	// The burst (10) is admitted at once, and tokens come back every 25ms: the first refusal
	// comes after at least 10 calls, however slow the machine.
	admitted := 0
	var err error
	for range 1000 {
		if err = read(g, dbtest.TestAPIKey); status.Code(err) != codes.NotFound {
			break
		}
		admitted++
	}
	require.GreaterOrEqual(t, admitted, 10, "the burst is admitted")
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, "read rate limit of 40/s for this application exceeded, retry later", st.Message())
	var retry *errdetails.RetryInfo
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.ErrorInfo:
			info = d
		}
	}
	require.NotNil(t, retry, "a refusal says when to retry")
	delay := retry.GetRetryDelay().AsDuration()
	require.Greater(t, delay, time.Duration(0))
	require.LessOrEqual(t, delay, 25*time.Millisecond, "at 40/s the next token is at most 25ms away")
	require.NotNil(t, info)
	require.Equal(t, errorsv1.ErrorReason_RATE_LIMITED.String(), info.GetReason())
	require.Equal(t, "read", info.GetMetadata()["limit"])

	// Invokes have their own bucket (1/s, burst 1): the first invoke is admitted (and refused
	// by validation), the second is over the limit.
	invoke := func() error {
		_, err := g.client.InvokeCapability(authed(dbtest.TestAPIKey), &gatewayv1.InvokeCapabilityRequest{})
		return err
	}
	require.Equal(t, codes.InvalidArgument, status.Code(invoke()), "reads spent leave invokes alone")
	err = invoke()
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "invoke rate limit of 1/s")
	require.Greater(t, rpcstatus.RetryDelay(err), 900*time.Millisecond, "at 1/s the next token is about a second away")

	// The other application has its own buckets, at the defaults.
	require.Equal(t, codes.NotFound, status.Code(read(g, otherKey)))
	require.Equal(t, codes.InvalidArgument, status.Code(func() error {
		_, err := g.client.InvokeCapability(authed(otherKey), &gatewayv1.InvokeCapabilityRequest{})
		return err
	}()))
}

func TestRateLimitHeldAcrossTwoReplicas(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, limitedCatalog)
	// A heartbeat of 5 s (a beat bounded by it, stale after three): a loaded machine's slow beat
	// within the flood cannot change the count (at 200 ms, a beat outrun or late made the count err
	// high and the fleet admit under 75% of the limit). a beats once more, now that b has, to count
	// it at once rather than an interval later.
	a := startGateway(t, s, 5*time.Second, 0)
	b := startGateway(t, s, 5*time.Second, 0)
	require.NoError(t, a.replicas.Beat(context.Background()))
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, g := range []*gateway{a, b} {
		wg.Go(func() { g.replicas.Run(ctx) })
	}
	t.Cleanup(func() { stop(); wg.Wait() })
	require.Eventually(t, func() bool { return a.replicas.Count() == 2 && b.replicas.Count() == 2 },
		15*time.Second, 10*time.Millisecond, "each replica counts the other")

	// Both replicas flooded alike, as a load balancer spreads calls, for a while.
	const window = 2 * time.Second
	var admitted, refused, other atomic.Int64
	start := time.Now()
	var callers sync.WaitGroup
	for i := range 8 {
		g := []*gateway{a, b}[i%2]
		callers.Go(func() {
			for time.Since(start) < window {
				switch status.Code(read(g, dbtest.TestAPIKey)) {
				case codes.NotFound:
					admitted.Add(1)
				case codes.ResourceExhausted:
					refused.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	callers.Wait()
	elapsed := time.Since(start).Seconds()

	// The application's limit: 40/s plus a burst of 10, across the fleet. Two replicas each
	// holding the whole limit would admit about twice it.
	limit := 40*elapsed + 10
	t.Logf("admitted %d, refused %d in %.2fs (limit %.0f)", admitted.Load(), refused.Load(), elapsed, limit)
	require.Zero(t, other.Load())
	require.Positive(t, refused.Load(), "the flood went past the limit")
	require.LessOrEqual(t, float64(admitted.Load()), 1.15*limit, "two replicas together admit about the limit, not twice it")
	require.GreaterOrEqual(t, float64(admitted.Load()), 0.75*limit, "nor much less, when the load is spread")
}

// A call over the limit is held before it is refused, and the hold never takes more than half
// the call's deadline.
func TestRateLimitHoldsARefusal(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, slowCatalog) // invokes: 1 per 100 s, burst 1
	// The hold is seconds long and the token 100 s away, so that neither a late start nor a slow
	// answer on a loaded machine can bring the token within the hold or past the deadline below.
	const hold, period = 3 * time.Second, 100 * time.Second
	g := startGateway(t, s, time.Minute, hold)

	require.Equal(t, codes.InvalidArgument, status.Code(invoke(authed(dbtest.TestAPIKey), g)), "the burst")
	start := time.Now()
	err := invoke(authed(dbtest.TestAPIKey), g)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "a token 100 s away does not come within the hold")
	require.GreaterOrEqual(t, time.Since(start), hold, "the refusal came after the hold")
	require.Greater(t, rpcstatus.RetryDelay(err), period/2, "and advises the delay left after it")
	require.LessOrEqual(t, rpcstatus.RetryDelay(err), period-hold+50*time.Millisecond, "not counting the hold")

	// A deadline of 4 s is held half of it, 2 s, then answered: 2 s before the deadline, a margin
	// scheduling noise does not eat; run out instead, it would end DeadlineExceeded.
	start = time.Now() // before the deadline is set: the hold is half of what is left of it
	ctx, cancel := context.WithTimeout(authed(dbtest.TestAPIKey), 4*time.Second)
	defer cancel()
	err = invoke(ctx, g)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "a short deadline is answered, not run out: held half of it")
	require.GreaterOrEqual(t, time.Since(start), 2*time.Second, "held half the deadline")
}

// A call whose token comes within the hold waits exactly until it and is admitted: the token a
// second away would be refused without the hold, and the call does not wait the whole hold.
func TestRateLimitWaitsForATokenWithinTheHold(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, limitedCatalog) // invokes: 1/s, burst 1
	// A hold of 30 s against a token a second away: "only for it, not the whole hold" is told
	// apart by 20 s, not by the half second a loaded machine can add.
	const hold = 30 * time.Second
	g := startGateway(t, s, time.Minute, hold)

	// Times are measured from before the burst took its token: the later tokens are due a
	// second, then two, after it, however late a loaded machine sends the next calls.
	burst := time.Now()
	require.Equal(t, codes.InvalidArgument, status.Code(invoke(authed(dbtest.TestAPIKey), g)), "the burst")
	start := time.Now()
	require.Equal(t, codes.InvalidArgument, status.Code(invoke(authed(dbtest.TestAPIKey), g)),
		"the next token is about a second away, within the hold: admitted")
	require.GreaterOrEqual(t, time.Since(burst), 800*time.Millisecond, "after waiting for its token")
	require.Less(t, time.Since(start), hold-20*time.Second, "and only for it, not the whole hold")

	// The token reserved was spent: the next call's is a second further on, within the hold
	// again, so it waits its turn too.
	ctx, cancel := context.WithTimeout(authed(dbtest.TestAPIKey), 10*time.Second)
	defer cancel()
	require.Equal(t, codes.InvalidArgument, status.Code(invoke(ctx, g)))
	require.GreaterOrEqual(t, time.Since(burst), 1800*time.Millisecond, "one token after the one reserved")
}

// At most maxHeld calls of an application are held at once: past them a call over the limit is
// refused at once, so that a flood on one connection cannot pile up held calls.
func TestRateLimitHoldsAtMostMaxHeld(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, slowCatalog) // invokes: 1 per 100 s, burst 1
	// A hold of 4 s: "at once" (under 2 s) and "held" (4 s) stay apart by seconds on a loaded
	// machine, and the token, 100 s away, never comes within the hold.
	const hold = 4 * time.Second
	g := startGatewayHolding(t, s, time.Minute, hold, 2)

	require.Equal(t, codes.InvalidArgument, status.Code(invoke(authed(dbtest.TestAPIKey), g)), "the burst")
	took := make([]time.Duration, 3)
	var wg sync.WaitGroup
	for i := range took {
		wg.Go(func() {
			start := time.Now()
			err := invoke(authed(dbtest.TestAPIKey), g)
			took[i] = time.Since(start)
			assert.Equal(t, codes.ResourceExhausted, status.Code(err), "a token 100 s away is beyond the hold")
		})
	}
	wg.Wait()
	slices.Sort(took)
	require.Less(t, took[0], hold/2, "the third call at once is refused at once")
	require.GreaterOrEqual(t, took[1], hold, "the two others were held")
}

func invoke(ctx context.Context, g *gateway) error {
	_, err := g.client.InvokeCapability(ctx, &gatewayv1.InvokeCapabilityRequest{})
	return err
}
