package adaptercall_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/platformtoken"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/adaptercall"
	"github.com/integrations-platform/integrations/pkg/execution"
	"github.com/integrations-platform/integrations/pkg/freeport"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
)

// hangingAdapter receives every call and never answers until the test ends it.
type hangingAdapter struct {
	adapterv1.UnimplementedAdapterServiceServer
	received chan struct{}
}

func (h *hangingAdapter) Execute(ctx context.Context, _ *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	h.received <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	// Outside the ephemeral range (pkg/freeport): a closed port from that range can be taken as
	// the source port of the call to it, which then connects to itself — the first call to an
	// adapter that is down was "sent" in a fresh-machine run under load (issue 22).
	addr, err := freeport.Addr()
	require.NoError(t, err)
	return addr
}

// An adapter nobody listens for: the call never leaves the process, within the connect wait.
func TestExecuteUnreachableIsNotSent(t *testing.T) {
	t.Parallel()
	p := adaptercall.NewPool()
	p.SetConnectWait(200 * time.Millisecond)
	t.Cleanup(func() { _ = p.Close() })

	// The call's own deadline is a minute away, the connect wait 200 ms: ending within 20 s can
	// only be the connect wait, and a loaded machine's scheduling delays cannot reach 20 s.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	out := p.Execute(ctx, adaptercall.Adapter{Endpoint: freeAddr(t)}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})

	require.Equal(t, execution.OutcomeFailed, out.Kind)
	require.True(t, out.NotSent)
	require.True(t, out.Retryable)
	require.Less(t, time.Since(start), 20*time.Second, "bounded by the connect wait, not the call's deadline")
}

// The attempt's own deadline bounds the wait for a ready connection too.
func TestExecuteWaitsNoLongerThanTheAttemptsDeadline(t *testing.T) {
	t.Parallel()
	p := adaptercall.NewPool()
	// The connect wait is a minute away, the deadline 100 ms: ending within 20 s can only be the
	// deadline, whatever the machine's load.
	p.SetConnectWait(time.Minute)
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()

	start := time.Now()
	out := p.Execute(ctx, adaptercall.Adapter{Endpoint: freeAddr(t)}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})

	require.True(t, out.NotSent)
	require.Less(t, time.Since(start), 20*time.Second, "bounded by the attempt's deadline, not the connect wait")
}

// A request that reached the adapter, which then died, is sent: the attempt is spent.
func TestExecuteCutAfterItWasSentIsSent(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := &hangingAdapter{received: make(chan struct{}, 1)}
	srv := grpc.NewServer()
	adapterv1.RegisterAdapterServiceServer(srv, a)
	go func() { _ = srv.Serve(lis) }()
	p := adaptercall.NewPool()
	t.Cleanup(func() { _ = p.Close() })

	done := make(chan execution.Outcome, 1)
	go func() {
		done <- p.Execute(context.Background(), adaptercall.Adapter{Endpoint: lis.Addr().String()}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
	}()
	<-a.received
	srv.Stop() // the adapter dies with the request in hand

	out := <-done
	require.Equal(t, execution.OutcomeFailed, out.Kind)
	require.False(t, out.NotSent)
	require.True(t, out.Retryable)
}

// An adapter that comes up while Execute waits is called: no fail-fast while the connection is
// between two attempts.
func TestExecuteWaitsForAnAdapterComingUp(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	p := adaptercall.NewPool()
	t.Cleanup(func() { _ = p.Close() })
	a := &hangingAdapter{received: make(chan struct{}, 1)}

	done := make(chan execution.Outcome, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- p.Execute(ctx, adaptercall.Adapter{Endpoint: addr}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
	}()
	time.Sleep(300 * time.Millisecond) // the adapter is down for a while: the scenario, not a sync
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := grpc.NewServer()
	adapterv1.RegisterAdapterServiceServer(srv, a)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	select {
	case <-a.received:
	case out := <-done:
		t.Fatalf("Execute ended without reaching the adapter that came up: %+v", out)
	}
	cancel()
	<-done
}

// While the adapter is known to be down — the connection in TRANSIENT_FAILURE after a failed
// connection attempt — a burst of calls answers NotSent at once instead of each waiting out the
// connect wait (and holding a consumer slot for it).
func TestExecuteFailsFastWhileTheAdapterIsDown(t *testing.T) {
	t.Parallel()
	p := adaptercall.NewPool()
	// A connect wait of a minute: a burst that ends within 20 s did not wait it, however loaded
	// the machine (scheduling delays are hundreds of milliseconds, not tens of seconds).
	p.SetConnectWait(time.Minute)
	t.Cleanup(func() { _ = p.Close() })
	addr := freeAddr(t)

	// The first call waits (its own deadline, 2 s, ends it) and meanwhile sees connection
	// attempts fail.
	firstCtx, cancelFirst := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelFirst()
	first := p.Execute(firstCtx, adaptercall.Adapter{Endpoint: addr}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
	require.True(t, first.NotSent)

	start := time.Now()
	const burst = 16
	outs := make(chan execution.Outcome, burst)
	for range burst {
		go func() {
			outs <- p.Execute(context.Background(), adaptercall.Adapter{Endpoint: addr}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
		}()
	}
	for range burst {
		out := <-outs
		require.True(t, out.NotSent)
		require.True(t, out.Retryable)
	}
	require.Less(t, time.Since(start), 20*time.Second, "the burst did not wait the connect wait")
}

// limitedAdapter takes one call at a time (the server's stream limit): the first hangs, so a
// second call finds the connection ready but cannot open its stream — none of it goes out.
type limitedAdapter struct{ hangingAdapter }

// A call that passed the ready check but whose request cannot go out (here the adapter's stream
// limit is taken; as when the adapter died just after the check) is cut at the connect wait, as
// NotSent, instead of waiting for readiness until its deadline.
func TestExecuteNotSentWithinTheConnectWaitIsCut(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := &limitedAdapter{hangingAdapter{received: make(chan struct{}, 2)}}
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(1))
	adapterv1.RegisterAdapterServiceServer(srv, a)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	p := adaptercall.NewPool()
	p.SetConnectWait(300 * time.Millisecond)
	t.Cleanup(func() { _ = p.Close() })

	// The call's deadline is two minutes away, the connect wait 300 ms: ending within 20 s can
	// only be the connect wait, however loaded the machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	firstDone := make(chan execution.Outcome, 1)
	go func() {
		firstDone <- p.Execute(ctx, adaptercall.Adapter{Endpoint: lis.Addr().String()}, &adapterv1.ExecuteRequest{ExecutionId: "e1", Attempt: 1})
	}()
	<-a.received

	start := time.Now()
	out := p.Execute(ctx, adaptercall.Adapter{Endpoint: lis.Addr().String()}, &adapterv1.ExecuteRequest{ExecutionId: "e2", Attempt: 1})
	require.Equal(t, execution.OutcomeFailed, out.Kind)
	require.True(t, out.NotSent, "%+v", out)
	require.Less(t, time.Since(start), 20*time.Second, "cut at the connect wait, not the call's deadline")
	select {
	case <-firstDone:
		t.Fatal("the first call, sent, must not be cut")
	default:
	}
	cancel()
	require.False(t, (<-firstDone).NotSent, "the first call was sent")
}

// acknowledgingAdapter answers its first call at once, and every later one as told: with the
// receipt header (as the adapter SDK does before its handler runs) or without, then hangs.
type acknowledgingAdapter struct {
	adapterv1.UnimplementedAdapterServiceServer
	acknowledge bool
	calls       atomic.Int32
	received    chan struct{}
	written     *atomic.Int64 // bytes the server wrote to its connections
}

// countingListener counts the bytes written to the connections it accepts.
type countingListener struct {
	net.Listener
	written *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.written}, nil
}

type countingConn struct {
	net.Conn
	written *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

func (a *acknowledgingAdapter) Execute(ctx context.Context, _ *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	first := a.calls.Add(1) == 1
	if first || a.acknowledge {
		before := a.written.Load()
		if err := grpc.SendHeader(ctx, metadata.Pairs(platformtoken.ReceivedHeader, "1")); err != nil {
			return nil, err
		}
		// SendHeader only queues the header: wait until it is on the socket, so that the
		// connection's break below comes after it.
		for a.written.Load() == before {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
	}
	if first {
		return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Completed{Completed: &adapterv1.Completed{}}}, nil
	}
	a.received <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

// An adapter known to acknowledge receipt whose connection breaks after the request was handed
// to the transport but before the acknowledgement: the handler never ran (a kill -9 just before
// the request arrived looks like this), so the call is NotSent; with the acknowledgement it is
// sent. The server stands in for the race by withholding the header.
func TestExecuteWithoutTheAdaptersReceiptIsNotSent(t *testing.T) {
	t.Parallel()
	for _, acknowledge := range []bool{false, true} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		a := &acknowledgingAdapter{acknowledge: acknowledge, received: make(chan struct{}, 1), written: new(atomic.Int64)}
		srv := grpc.NewServer()
		adapterv1.RegisterAdapterServiceServer(srv, a)
		go func() { _ = srv.Serve(countingListener{lis, a.written}) }()
		p := adaptercall.NewPool()
		t.Cleanup(func() { _ = p.Close() })

		first := p.Execute(context.Background(), adaptercall.Adapter{Endpoint: lis.Addr().String()}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})
		require.Equal(t, execution.OutcomeCompleted, first.Kind)

		done := make(chan execution.Outcome, 1)
		go func() {
			done <- p.Execute(context.Background(), adaptercall.Adapter{Endpoint: lis.Addr().String()}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 2})
		}()
		<-a.received
		srv.Stop() // the connection breaks

		out := <-done
		require.Equal(t, execution.OutcomeFailed, out.Kind)
		require.True(t, out.Retryable)
		require.Equal(t, !acknowledge, out.NotSent, "acknowledged %v", acknowledge)
	}
}

// deepAdapter answers a result nested past protobuf's decoding limit: protobuf marshals it, the
// platform cannot decode it.
type deepAdapter struct {
	adapterv1.UnimplementedAdapterServiceServer
	calls atomic.Int32
}

func (d *deepAdapter) Execute(context.Context, *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	d.calls.Add(1)
	v := structpb.NewNullValue()
	for range 20000 {
		v = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"a": v}})
	}
	return &adapterv1.ExecuteResponse{Outcome: &adapterv1.ExecuteResponse_Completed{
		Completed: &adapterv1.Completed{Result: v.GetStructValue()}}}, nil
}

// An adapter's response the platform cannot decode is the adapter's permanent protocol failure
// (adapter.invalid_result), not the retryable transport failure grpc-go's INTERNAL looks like:
// retried, the provider work would run again, and fail the same way.
func TestExecuteUndecodableResponseIsInvalidResult(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := &deepAdapter{}
	srv := grpc.NewServer()
	adapterv1.RegisterAdapterServiceServer(srv, a)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	p := adaptercall.NewPool()
	t.Cleanup(func() { _ = p.Close() })

	out := p.Execute(context.Background(), adaptercall.Adapter{Endpoint: lis.Addr().String()}, &adapterv1.ExecuteRequest{ExecutionId: "e", Attempt: 1})

	require.Equal(t, int32(1), a.calls.Load())
	require.Equal(t, execution.OutcomeFailed, out.Kind)
	require.False(t, out.Retryable)
	require.False(t, out.NotSent)
	require.Equal(t, execution.ClassProtocol, out.Failure.Class)
	require.Equal(t, adaptercall.InvalidResultCode, out.Failure.Code)
	require.Error(t, out.Cause, "grpc-go's own error kept for the logs")
}
