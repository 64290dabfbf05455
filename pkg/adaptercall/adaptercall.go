// Package adaptercall calls adapters: one client connection per adapter endpoint, and every
// answer — including a transport failure — normalised into an Outcome that the caller settles or
// retries. Both the gateway (sync attempts) and the execution-consumer (async attempts) use it.
package adaptercall

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/execution"
	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/safetext"
)

// maxMessage bounds an adapter's failure message as stored.
const maxMessage = 1024

// Kind is the shape of an adapter's answer.
type Kind int

// The kinds of outcome.
const (
	Completed Kind = iota + 1
	Failed
	Accepted
)

// Outcome is an adapter's answer to one attempt.
type Outcome struct {
	Kind Kind
	// Result, for Completed.
	Result *structpb.Struct
	// Failure (class, code, message), Retryable and RetryAfter, for Failed.
	Failure    execution.Failure
	Retryable  bool
	RetryAfter time.Duration
	// Lease, for Accepted (0: the capability's default).
	Lease time.Duration
}

// Pool holds one client connection per adapter endpoint.
type Pool struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewPool returns an empty Pool.
func NewPool() *Pool { return &Pool{conns: map[string]*grpc.ClientConn{}} }

func (p *Pool) client(endpoint string) (adapterv1.AdapterServiceClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	conn, ok := p.conns[endpoint]
	if !ok {
		var err error
		if conn, err = grpcx.Dial(endpoint); err != nil {
			return nil, err
		}
		p.conns[endpoint] = conn
	}
	return adapterv1.NewAdapterServiceClient(conn), nil
}

// Close closes every connection.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for ep, c := range p.conns {
		errs = append(errs, c.Close())
		delete(p.conns, ep)
	}
	return errors.Join(errs...)
}

// Execute calls the adapter at endpoint within ctx's deadline and normalises its answer. A
// transport failure or a deadline is a retryable failure of class unavailable or timeout; an
// answer with no outcome is a permanent protocol failure.
func (p *Pool) Execute(ctx context.Context, endpoint string, req *adapterv1.ExecuteRequest) Outcome {
	cli, err := p.client(endpoint)
	if err != nil {
		return transportFailure(err)
	}
	resp, err := cli.Execute(ctx, req)
	if err != nil {
		return transportFailure(err)
	}
	switch o := resp.GetOutcome().(type) {
	case *adapterv1.ExecuteResponse_Completed:
		return Outcome{Kind: Completed, Result: o.Completed.GetResult()}
	case *adapterv1.ExecuteResponse_Failed:
		return FromFailed(o.Failed)
	case *adapterv1.ExecuteResponse_Accepted:
		return Outcome{Kind: Accepted, Lease: o.Accepted.GetLease().AsDuration()}
	}
	return Outcome{Kind: Failed, Failure: execution.Failure{Class: execution.ClassProtocol, Message: "adapter answered no outcome"}}
}

// FromFailed normalises an adapter's Failed message (also used for callbacks).
func FromFailed(f *adapterv1.Failed) Outcome {
	class := f.GetClass()
	if class == "" {
		class = execution.ClassTransient
		if !f.GetRetryable() {
			class = execution.ClassPermanent
		}
	}
	return Outcome{
		Kind:       Failed,
		Failure:    execution.Failure{Class: class, Code: f.GetCode(), Message: safetext.Truncate(f.GetMessage(), maxMessage)},
		Retryable:  f.GetRetryable(),
		RetryAfter: f.GetRetryAfter().AsDuration(),
	}
}

func transportFailure(err error) Outcome {
	class := execution.ClassUnavailable
	if status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
		class = execution.ClassTimeout
	}
	return Outcome{Kind: Failed, Retryable: true, Failure: execution.Failure{
		Class: class, Code: status.Code(err).String(), Message: safetext.Truncate(fmt.Sprintf("calling adapter: %s", status.Convert(err).Message()), maxMessage),
	}}
}

// Cancel asks the adapter at endpoint to stop the work of a cancelled execution's attempt. It is
// best effort: an adapter may not implement it (UNIMPLEMENTED), and the execution is settled
// whatever it answers. It reports whether the adapter found running work to stop.
func (p *Pool) Cancel(ctx context.Context, endpoint, executionID string, attempt int32) (bool, error) {
	cli, err := p.client(endpoint)
	if err != nil {
		return false, err
	}
	resp, err := cli.Cancel(ctx, &adapterv1.CancelRequest{ExecutionId: executionID, Attempt: attempt})
	if err != nil {
		return false, fmt.Errorf("cancel attempt %d of %s at the adapter: %w", attempt, executionID, err)
	}
	return resp.GetStopped(), nil
}
