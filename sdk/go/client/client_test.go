package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/sdk/go/client"
	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const key = "app-key"

// gateway is a GatewayService that answers from scripts and records what it was asked.
type gateway struct {
	gatewayv1.UnimplementedGatewayServiceServer
	mu       sync.Mutex
	invokes  []*gatewayv1.InvokeCapabilityRequest
	lists    []*gatewayv1.ListExecutionsRequest
	consumer *gatewayv1.SetConsumerRequest
	// gets are the answers of GetExecution, in turn; the last repeats.
	gets []func() (*gatewayv1.GetExecutionResponse, error)
	nGet int
	// executions are what ListExecutions pages through, page_size at a time.
	executions []*executionv1.Execution
	failPage   int // ListExecutions refuses the request for this page number (1-based; 0: none)
	// syncErr, when set, is InvokeCapability's answer to a sync invocation.
	syncErr func() error
}

// authorized refuses a call without the application's key, as the gateway does.
func authorized(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) != 1 || v[0] != "Bearer "+key {
		return status.Error(codes.Unauthenticated, "missing or invalid API key")
	}
	return nil
}

func (g *gateway) InvokeCapability(ctx context.Context, req *gatewayv1.InvokeCapabilityRequest) (*gatewayv1.InvokeCapabilityResponse, error) {
	if err := authorized(ctx); err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.invokes = append(g.invokes, req)
	syncErr := g.syncErr
	g.mu.Unlock()
	if syncErr != nil && req.GetMode() == executionv1.Mode_MODE_SYNC {
		return nil, syncErr()
	}
	e := &executionv1.Execution{Id: "ex-1", Capability: req.GetCapability(), Mode: req.GetMode(),
		Status: executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING, Payload: req.GetPayload()}
	if req.GetMode() == executionv1.Mode_MODE_SYNC {
		e.Status = executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED
	}
	return &gatewayv1.InvokeCapabilityResponse{Execution: e}, nil
}

func (g *gateway) GetExecution(ctx context.Context, req *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	if err := authorized(ctx); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	i := min(g.nGet, len(g.gets)-1)
	g.nGet++
	return g.gets[i]()
}

func (g *gateway) ListExecutions(ctx context.Context, req *gatewayv1.ListExecutionsRequest) (*gatewayv1.ListExecutionsResponse, error) {
	if err := authorized(ctx); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lists = append(g.lists, proto.Clone(req).(*gatewayv1.ListExecutionsRequest))
	from := 0
	if req.GetPageToken() != "" {
		from, _ = strconv.Atoi(req.GetPageToken())
	}
	if g.failPage > 0 && from/int(req.GetPageSize())+1 == g.failPage {
		return nil, status.Error(codes.Unavailable, "a dependency is unavailable, retry")
	}
	to := min(from+int(req.GetPageSize()), len(g.executions))
	resp := &gatewayv1.ListExecutionsResponse{Executions: g.executions[from:to]}
	if to < len(g.executions) {
		resp.NextPageToken = strconv.Itoa(to)
	}
	return resp, nil
}

func (g *gateway) CancelExecution(ctx context.Context, req *gatewayv1.CancelExecutionRequest) (*gatewayv1.CancelExecutionResponse, error) {
	st, err := status.New(codes.FailedPrecondition, "execution already settled succeeded").WithDetails(
		&errdetails.ErrorInfo{Reason: "ALREADY_SETTLED", Domain: "integrations", Metadata: map[string]string{"status": "succeeded"}})
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

func (g *gateway) SetConsumer(ctx context.Context, req *gatewayv1.SetConsumerRequest) (*gatewayv1.SetConsumerResponse, error) {
	g.mu.Lock()
	g.consumer = req
	g.mu.Unlock()
	resp := &gatewayv1.SetConsumerResponse{SigningSecret: "whsec_c2VjcmV0"}
	switch c := req.GetConsumer().(type) {
	case *gatewayv1.SetConsumerRequest_Webhook:
		resp.Consumer = &gatewayv1.SetConsumerResponse_Webhook{Webhook: c.Webhook}
	case *gatewayv1.SetConsumerRequest_Grpc:
		resp.Consumer = &gatewayv1.SetConsumerResponse_Grpc{Grpc: c.Grpc}
	}
	return resp, nil
}

func (g *gateway) ListEvents(ctx context.Context, req *gatewayv1.ListEventsRequest) (*gatewayv1.ListEventsResponse, error) {
	if req.GetPageToken() == "" {
		return &gatewayv1.ListEventsResponse{Events: []*eventsv1.Event{{Id: "ev-2"}, {Id: "ev-1"}}, NextPageToken: "next"}, nil
	}
	return &gatewayv1.ListEventsResponse{Events: []*eventsv1.Event{{Id: "ev-0"}}}, nil
}

func (g *gateway) RedriveEvents(ctx context.Context, req *gatewayv1.RedriveEventsRequest) (*gatewayv1.RedriveEventsResponse, error) {
	if req.GetValidateOnly() {
		return &gatewayv1.RedriveEventsResponse{Count: 3}, nil
	}
	return &gatewayv1.RedriveEventsResponse{Count: 0}, nil
}

// setup serves g in process and answers a client of it with the application's key.
func setup(t *testing.T, g *gateway, opts ...client.Option) (*client.Client, *grpc.ClientConn) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	gatewayv1.RegisterGatewayServiceServer(srv, g)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c, err := client.NewWithConn(conn, key, opts...)
	require.NoError(t, err)
	return c, conn
}

func TestInvoke(t *testing.T) {
	t.Parallel()
	g := &gateway{}
	c, _ := setup(t, g)
	ctx := context.Background()

	type order struct {
		ID    string   `json:"id"`
		Total int      `json:"total"`
		Tags  []string `json:"tags,omitempty"`
	}
	e, err := c.Invoke(ctx, "dummy.echo", order{ID: "42", Total: 100, Tags: []string{"a"}}, client.IdempotencyKey("order-42"))
	require.NoError(t, err)
	require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING, e.GetStatus())
	require.False(t, client.IsFinal(e.GetStatus()))
	var back order
	require.NoError(t, client.Unmarshal(e.GetPayload(), &back), "a struct payload reads back")
	require.Equal(t, order{ID: "42", Total: 100, Tags: []string{"a"}}, back)

	e, err = c.Invoke(ctx, "dummy.echo", map[string]any{"hello": "world"}, client.Sync())
	require.NoError(t, err)
	require.True(t, client.IsFinal(e.GetStatus()))
	_, err = c.Invoke(ctx, "dummy.echo", json.RawMessage(`{"raw": true}`))
	require.NoError(t, err)
	_, err = c.Invoke(ctx, "dummy.echo", nil)
	require.NoError(t, err)
	p, err := structpb.NewStruct(map[string]any{"as": "struct"})
	require.NoError(t, err)
	_, err = c.Invoke(ctx, "dummy.echo", p)
	require.NoError(t, err)

	_, err = c.Invoke(ctx, "dummy.echo", []string{"not", "an", "object"})
	require.ErrorContains(t, err, "JSON object")

	g.mu.Lock()
	defer g.mu.Unlock()
	require.Len(t, g.invokes, 5, "the refused payload was not sent")
	first := g.invokes[0]
	require.Equal(t, executionv1.Mode_MODE_ASYNC, first.GetMode(), "async unless Sync")
	require.Equal(t, "order-42", first.GetIdempotencyKey())
	require.Equal(t, map[string]any{"id": "42", "total": float64(100), "tags": []any{"a"}}, first.GetPayload().AsMap())
	require.Equal(t, executionv1.Mode_MODE_SYNC, g.invokes[1].GetMode())
	require.Empty(t, g.invokes[1].GetIdempotencyKey())
	require.Equal(t, map[string]any{"raw": true}, g.invokes[2].GetPayload().AsMap())
	require.Nil(t, g.invokes[3].GetPayload())
	require.True(t, proto.Equal(p, g.invokes[4].GetPayload()))
}

func TestWaitForSettlement(t *testing.T) {
	t.Parallel()
	execution := func(s executionv1.ExecutionStatus) func() (*gatewayv1.GetExecutionResponse, error) {
		return func() (*gatewayv1.GetExecutionResponse, error) {
			return &gatewayv1.GetExecutionResponse{Execution: &executionv1.Execution{Id: "ex-1", Status: s}}, nil
		}
	}
	unavailable := func() (*gatewayv1.GetExecutionResponse, error) {
		st, _ := status.New(codes.Unavailable, "retry").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(5 * time.Millisecond)})
		return nil, st.Err()
	}

	t.Run("through pending, an outage and running, to settled", func(t *testing.T) {
		t.Parallel()
		g := &gateway{gets: []func() (*gatewayv1.GetExecutionResponse, error){
			execution(executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING), unavailable,
			execution(executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING),
			execution(executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED)}}
		c, _ := setup(t, g, client.WithPolling(time.Millisecond, 5*time.Millisecond))
		e, err := c.InvokeAndWait(context.Background(), "dummy.echo", nil)
		require.NoError(t, err)
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, e.GetStatus())
		require.Equal(t, 4, g.nGet)
	})

	t.Run("a sync invocation answers settled: no wait", func(t *testing.T) {
		t.Parallel()
		g := &gateway{}
		c, _ := setup(t, g)
		e, err := c.InvokeAndWait(context.Background(), "dummy.echo", nil, client.Sync())
		require.NoError(t, err)
		require.True(t, client.IsFinal(e.GetStatus()))
		require.Zero(t, g.nGet)
	})

	t.Run("the context ends first", func(t *testing.T) {
		t.Parallel()
		// The caller's deadline passes as the second read arrives: after a first read was
		// answered, however long a loaded machine takes over it (a 50 ms timeout could end
		// before the first answer, leaving nothing read).
		ctx := newExpiring()
		running := execution(executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING)
		g := &gateway{gets: []func() (*gatewayv1.GetExecutionResponse, error){running,
			func() (*gatewayv1.GetExecutionResponse, error) { ctx.expire(); return running() }}}
		c, _ := setup(t, g, client.WithPolling(time.Millisecond, 2*time.Millisecond))
		e, err := c.WaitForSettlement(ctx, "ex-1")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.False(t, client.IsRetryable(err), "the caller's deadline is the caller's choice")
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING, e.GetStatus(), "the execution as last read")
	})

	t.Run("a broken stream (INTERNAL, UNKNOWN) is read again", func(t *testing.T) {
		t.Parallel()
		broken := func(code codes.Code) func() (*gatewayv1.GetExecutionResponse, error) {
			return func() (*gatewayv1.GetExecutionResponse, error) {
				return nil, status.Error(code, "stream terminated by RST_STREAM with error code: INTERNAL_ERROR")
			}
		}
		g := &gateway{gets: []func() (*gatewayv1.GetExecutionResponse, error){
			broken(codes.Internal), broken(codes.Unknown), execution(executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED)}}
		c, _ := setup(t, g, client.WithPolling(time.Millisecond, 5*time.Millisecond))
		e, err := c.WaitForSettlement(context.Background(), "ex-1")
		require.NoError(t, err)
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, e.GetStatus())
		require.Equal(t, 3, g.nGet)
		require.False(t, client.IsRetryable(status.Error(codes.Internal, "bug")), "only a read is repeated on INTERNAL")
	})

	t.Run("polling delays under the minimum are raised to it", func(t *testing.T) {
		t.Parallel()
		for _, d := range []time.Duration{0, -time.Second, time.Nanosecond} {
			g := &gateway{gets: []func() (*gatewayv1.GetExecutionResponse, error){execution(executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING)}}
			c, _ := setup(t, g, client.WithPolling(d, d))
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_, err := c.WaitForSettlement(ctx, "ex-1")
			cancel()
			require.Error(t, err, "never settled")
			g.mu.Lock()
			n := g.nGet
			g.mu.Unlock()
			// 100 ms at MinPollInterval (10 ms, jittered by a tenth) is about ten reads; a tight
			// loop makes hundreds.
			require.LessOrEqual(t, n, 2*int(100*time.Millisecond/client.MinPollInterval), "WithPolling(%s, %s): %d reads", d, d, n)
		}
	})

	t.Run("a sync invocation whose outcome is pending is waited for, not invoked again", func(t *testing.T) {
		t.Parallel()
		g := &gateway{
			syncErr: func() error {
				return withDetails(t, status.New(codes.Unavailable, "the attempt ended but its outcome is not recorded yet"),
					&errdetails.ErrorInfo{Reason: "OUTCOME_PENDING", Domain: "integrations", Metadata: map[string]string{"execution_id": "ex-9"}},
					&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)}).Err()
			},
			gets: []func() (*gatewayv1.GetExecutionResponse, error){
				execution(executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING),
				execution(executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED)},
		}
		c, _ := setup(t, g, client.WithPolling(time.Millisecond, 5*time.Millisecond))

		_, err := c.Invoke(context.Background(), "dummy.echo", nil, client.Sync())
		var cerr *client.Error
		require.ErrorAs(t, err, &cerr)
		require.Equal(t, client.ReasonOutcomePending, cerr.Reason)
		require.Equal(t, "ex-9", cerr.ExecutionID())
		require.Equal(t, time.Second, cerr.RetryDelay)
		require.False(t, cerr.Retryable(), "the work ran: invoking again would run it again")
		require.False(t, client.IsRetryable(err))
		require.False(t, client.IsRetryable(cerr.GRPCStatus().Err()), "nor as a bare status")

		e, err := c.InvokeAndWait(context.Background(), "dummy.echo", nil, client.Sync())
		require.NoError(t, err)
		require.Equal(t, executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED, e.GetStatus())
		g.mu.Lock()
		defer g.mu.Unlock()
		require.Len(t, g.invokes, 2, "one invocation each: InvokeAndWait invoked once")
		require.Equal(t, 2, g.nGet, "then read the execution OUTCOME_PENDING named until settled")
	})

	t.Run("a refusal that is not retryable ends the wait", func(t *testing.T) {
		t.Parallel()
		g := &gateway{gets: []func() (*gatewayv1.GetExecutionResponse, error){func() (*gatewayv1.GetExecutionResponse, error) {
			return nil, status.Error(codes.NotFound, "execution ex-1 not found")
		}}}
		c, _ := setup(t, g)
		_, err := c.WaitForSettlement(context.Background(), "ex-1")
		require.Equal(t, codes.NotFound, status.Code(err))
		require.Equal(t, 1, g.nGet)
	})
}

func TestList(t *testing.T) {
	t.Parallel()
	g := &gateway{}
	for i := range 7 {
		g.executions = append(g.executions, &executionv1.Execution{Id: fmt.Sprintf("ex-%d", 7-i)})
	}
	c, _ := setup(t, g)
	filter := &client.ListExecutionsRequest{PageSize: 3, Capability: "dummy.echo"}
	var ids []string
	for e, err := range c.List(context.Background(), filter) {
		require.NoError(t, err)
		ids = append(ids, e.GetId())
	}
	require.Equal(t, []string{"ex-7", "ex-6", "ex-5", "ex-4", "ex-3", "ex-2", "ex-1"}, ids, "every page, in order")
	require.Len(t, g.lists, 3)
	for i, req := range g.lists {
		require.Equal(t, "dummy.echo", req.GetCapability(), "page %d keeps the filter", i+1)
	}
	require.Equal(t, []string{"", "3", "6"}, []string{g.lists[0].GetPageToken(), g.lists[1].GetPageToken(), g.lists[2].GetPageToken()})
	require.Empty(t, filter.GetPageToken(), "the caller's filter is not changed")

	// Breaking off reads no further page.
	g.lists = nil
	for _, err := range c.List(context.Background(), filter) {
		require.NoError(t, err)
		break
	}
	require.Len(t, g.lists, 1)

	// A refusal comes as the last pair.
	g.failPage = 2
	var n int
	var last error
	for e, err := range c.List(context.Background(), filter) {
		if err != nil {
			last = err
			require.Nil(t, e)
			continue
		}
		n++
	}
	require.Equal(t, 3, n)
	require.True(t, client.IsRetryable(last))

	var events []string
	for ev, err := range c.ListEvents(context.Background(), nil) {
		require.NoError(t, err)
		events = append(events, ev.GetId())
	}
	require.Equal(t, []string{"ev-2", "ev-1", "ev-0"}, events)
}

func TestErrors(t *testing.T) {
	t.Parallel()
	g := &gateway{}
	c, conn := setup(t, g)
	ctx := context.Background()

	_, err := c.Cancel(ctx, "ex-1")
	var cerr *client.Error
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, codes.FailedPrecondition, cerr.Code)
	require.Equal(t, "ALREADY_SETTLED", cerr.Reason)
	require.Equal(t, "succeeded", cerr.Metadata["status"])
	require.False(t, cerr.Retryable())
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "status.Code reads it")
	require.Equal(t, "ALREADY_SETTLED", rpcstatus.Reason(err), "rpcstatus reads it")
	require.Contains(t, err.Error(), "cancel execution ex-1")

	other, err := client.NewWithConn(conn, "wrong-key")
	require.NoError(t, err)
	_, err = other.Get(ctx, "ex-1")
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.False(t, client.IsRetryable(err))

	for _, tc := range []struct {
		st        *status.Status
		retryable bool
		delay     time.Duration
		field     string
	}{
		{status.New(codes.Unavailable, "retry"), true, 0, ""},
		{status.New(codes.ResourceExhausted, "rate limited"), true, 0, ""},
		{status.New(codes.Aborted, "busy"), true, 0, ""},
		{status.New(codes.Internal, "bug"), false, 0, ""},
		{status.New(codes.NotFound, "no"), false, 0, ""},
		{withDetails(t, status.New(codes.Unavailable, "retry"), &errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)}), true, 2 * time.Second, ""},
		{withDetails(t, status.New(codes.InvalidArgument, "idempotency_key: bad"), &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "idempotency_key", Description: "bad"}}}), false, 0, "idempotency_key"},
	} {
		t.Run(tc.st.Code().String(), func(t *testing.T) {
			require.Equal(t, tc.retryable, client.IsRetryable(tc.st.Err()), "a bare status")
			require.Equal(t, tc.delay, client.RetryDelay(tc.st.Err()))
			g := &gateway{gets: []func() (*gatewayv1.GetExecutionResponse, error){func() (*gatewayv1.GetExecutionResponse, error) { return nil, tc.st.Err() }}}
			c, _ := setup(t, g)
			_, err := c.Get(ctx, "ex-1")
			var cerr *client.Error
			require.ErrorAs(t, err, &cerr)
			require.Equal(t, tc.retryable, client.IsRetryable(err))
			require.Equal(t, tc.delay, cerr.RetryDelay)
			require.Equal(t, tc.field, cerr.Field())
		})
	}
	require.False(t, client.IsRetryable(errors.New("not a status")))
	require.False(t, client.IsRetryable(nil))

	// A DEADLINE_EXCEEDED that comes back once the call's deadline has passed but before its
	// context says so (the server's copy of the deadline ran out first) is the caller's deadline.
	_, err = c.Get(lateContext{ctx}, "ex-1")
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, client.IsRetryable(err))
}

// lateContext is a context whose deadline has passed while it is not done yet: the moment between
// a deadline and its context's timer.
type lateContext struct{ context.Context }

func (lateContext) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// expiring is a context whose deadline passes when expire is called: a caller's deadline reached
// at a point of the test's choosing, not after an interval a loaded machine can overrun.
type expiring struct {
	context.Context
	once sync.Once
	done chan struct{}
}

func newExpiring() *expiring {
	return &expiring{Context: context.Background(), done: make(chan struct{})}
}

func (c *expiring) expire() { c.once.Do(func() { close(c.done) }) }

func (c *expiring) Done() <-chan struct{} { return c.done }

func (c *expiring) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func withDetails(t *testing.T, st *status.Status, details ...protoadapt.MessageV1) *status.Status {
	t.Helper()
	for _, d := range details {
		var err error
		st, err = st.WithDetails(d)
		require.NoError(t, err)
	}
	return st
}

func TestConsumers(t *testing.T) {
	t.Parallel()
	g := &gateway{}
	c, _ := setup(t, g)
	ctx := context.Background()

	reg, err := c.RegisterWebhook(ctx, "https://example.com/hook")
	require.NoError(t, err)
	require.Equal(t, "whsec_c2VjcmV0", reg.GetSigningSecret())
	require.Equal(t, "https://example.com/hook", g.consumer.GetWebhook().GetUrl())

	_, err = c.RegisterGRPC(ctx, client.GRPCConsumer{Target: "consumer.example.com:443"})
	require.NoError(t, err)
	require.Equal(t, "consumer.example.com:443", g.consumer.GetGrpc().GetTarget())
	require.Nil(t, g.consumer.GetGrpc().CaPem, "left out when not given")
	require.Nil(t, g.consumer.GetGrpc().Plaintext)

	_, err = c.RegisterGRPC(ctx, client.GRPCConsumer{Target: "127.0.0.1:9999", CAPEM: "PEM", Plaintext: true})
	require.NoError(t, err)
	require.Equal(t, "PEM", g.consumer.GetGrpc().GetCaPem())
	require.True(t, g.consumer.GetGrpc().GetPlaintext())

	n, err := c.RedriveEvents(ctx, &client.RedriveEventsRequest{ValidateOnly: true})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	n, err = c.RedriveEvents(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestNew(t *testing.T) {
	t.Parallel()
	_, err := client.New("127.0.0.1:1", "")
	require.Error(t, err, "an API key is required")
	c, err := client.New("127.0.0.1:1", key, client.WithInsecure())
	require.NoError(t, err, "dialling is lazy")
	require.NoError(t, c.Close())

	_, conn := setup(t, &gateway{})
	c, err = client.NewWithConn(conn, key)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NotEqual(t, "SHUTDOWN", conn.GetState().String(), "the caller's connection stays open")

	_, err = client.NewWithConn(conn, "")
	require.ErrorContains(t, err, "an API key is required", "as New")
	_, err = client.NewWithConn(nil, key)
	require.ErrorContains(t, err, "a connection is required")
}
