package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// InvokeOption changes an invocation.
type InvokeOption func(*gatewayv1.InvokeCapabilityRequest)

// Sync runs the invocation in sync mode: the gateway runs one attempt inline and answers the
// settled execution (never retried by the platform). Without it an invocation is async: accepted
// durably, answered pending, attempted and retried through the queue.
func Sync() InvokeOption {
	return func(r *gatewayv1.InvokeCapabilityRequest) { r.Mode = executionv1.Mode_MODE_SYNC }
}

// IdempotencyKey makes the invocation safe to send again: the same key with the same request
// answers the execution the first call made (with another request: ALREADY_EXISTS, reason
// IDEMPOTENCY_KEY_REUSED). At most 255 printable ASCII characters without spaces.
func IdempotencyKey(key string) InvokeOption {
	return func(r *gatewayv1.InvokeCapabilityRequest) { r.IdempotencyKey = key }
}

// Invoke invokes a capability with payload: a map, a struct (encoded as encoding/json does, so
// its json tags apply), json.RawMessage, a *structpb.Struct, or nil; it must encode as a JSON
// object. It answers the execution: pending (async) or settled (Sync).
func (c *Client) Invoke(ctx context.Context, capability string, payload any, opts ...InvokeOption) (*Execution, error) {
	p, err := toStruct(payload)
	if err != nil {
		return nil, err
	}
	req := &gatewayv1.InvokeCapabilityRequest{Capability: capability, Mode: executionv1.Mode_MODE_ASYNC, Payload: p}
	for _, opt := range opts {
		opt(req)
	}
	resp, err := c.rpc.InvokeCapability(c.auth(ctx), req)
	if err != nil {
		return nil, wrap(ctx, "invoke "+capability, err)
	}
	return resp.GetExecution(), nil
}

// InvokeAndWait invokes (see Invoke) and waits for the execution to settle (see
// WaitForSettlement). A sync invocation answered ReasonOutcomePending (the attempt ran, its outcome
// is not recorded yet) is not invoked again: InvokeAndWait waits for the execution it names. With
// an IdempotencyKey, a call that failed retryably (IsRetryable) may be made again as it is: it
// finds the execution the first one made; without one, a repeat may start another execution.
func (c *Client) InvokeAndWait(ctx context.Context, capability string, payload any, opts ...InvokeOption) (*Execution, error) {
	e, err := c.Invoke(ctx, capability, payload, opts...)
	var cerr *Error
	if errors.As(err, &cerr) && cerr.Reason == ReasonOutcomePending && cerr.ExecutionID() != "" {
		return c.WaitForSettlement(ctx, cerr.ExecutionID())
	}
	if err != nil || IsFinal(e.GetStatus()) {
		return e, err
	}
	return c.WaitForSettlement(ctx, e.GetId())
}

// IsFinal reports whether status is a settled one: SUCCEEDED, FAILED or CANCELLED. A settled
// execution never changes again.
func IsFinal(status ExecutionStatus) bool {
	switch status {
	case executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED,
		executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED,
		executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED:
		return true
	}
	return false
}

// WaitForSettlement reads the execution until it has settled (IsFinal) and answers it. Reads back
// off as WithPolling says. Reading is safe to repeat, so a refusal that says to retry
// (IsRetryable, its RetryDelay honoured) and INTERNAL or UNKNOWN (what a connection or stream
// broken under the call looks like) are waited out; any other refusal ends the wait. The wait is
// bounded only by ctx: give it a deadline. When ctx ends first it answers the execution as last
// read (nil if never) and an error wrapping ctx's.
func (c *Client) WaitForSettlement(ctx context.Context, id string) (*Execution, error) {
	b := &backoff.ExponentialBackOff{InitialInterval: c.poll.initial, RandomizationFactor: 0.1,
		Multiplier: 1.5, MaxInterval: c.poll.max}
	b.Reset()
	var last *Execution
	for {
		e, err := c.Get(ctx, id)
		pause := b.NextBackOff()
		switch {
		case err == nil:
			last = e
			if IsFinal(e.GetStatus()) {
				return e, nil
			}
		case ctx.Err() != nil:
			return last, err
		case !IsRetryable(err) && !transient(err):
			return last, err
		default:
			if d := RetryDelay(err); d > 0 {
				pause = d
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return last, fmt.Errorf("wait for execution %s to settle (last status %s): %w", id, last.GetStatus(), ctx.Err())
		case <-t.C:
		}
	}
}

// transient reports whether err is INTERNAL or UNKNOWN: a read may meet them when the connection
// or the stream breaks under it (an HTTP/2 RST_STREAM), and repeating a read does no harm.
func transient(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Code == codes.Internal || e.Code == codes.Unknown)
}

// Get reads an execution with its attempts, payload, result and progress.
func (c *Client) Get(ctx context.Context, id string) (*Execution, error) {
	resp, err := c.rpc.GetExecution(c.auth(ctx), &gatewayv1.GetExecutionRequest{Id: id})
	if err != nil {
		return nil, wrap(ctx, "get execution "+id, err)
	}
	return resp.GetExecution(), nil
}

// List iterates over the application's executions that filter selects (nil: all), newest first,
// without payload, result or progress (Get has them), reading page after page by next_page_token
// (filter's page_size items each; page_token starts further on). A refusal is yielded as the
// error of a last pair. filter is not changed.
//
//	for e, err := range c.List(ctx, &client.ListExecutionsRequest{Capability: "dummy.echo"}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(e.GetId(), e.GetStatus())
//	}
func (c *Client) List(ctx context.Context, filter *ListExecutionsRequest) iter.Seq2[*Execution, error] {
	return func(yield func(*Execution, error) bool) {
		req := &ListExecutionsRequest{}
		if filter != nil {
			req = proto.Clone(filter).(*ListExecutionsRequest)
		}
		walk(yield, req.GetPageToken(), func(token string) ([]*Execution, string, error) {
			req.PageToken = token
			resp, err := c.rpc.ListExecutions(c.auth(ctx), req)
			if err != nil {
				return nil, "", wrap(ctx, "list executions", err)
			}
			return resp.GetExecutions(), resp.GetNextPageToken(), nil
		})
	}
}

// Cancel settles a pending or running execution CANCELLED and answers it; its completion event is
// still delivered. An execution already settled is refused FAILED_PRECONDITION, reason
// ALREADY_SETTLED.
func (c *Client) Cancel(ctx context.Context, id string) (*Execution, error) {
	resp, err := c.rpc.CancelExecution(c.auth(ctx), &gatewayv1.CancelExecutionRequest{Id: id})
	if err != nil {
		return nil, wrap(ctx, "cancel execution "+id, err)
	}
	return resp.GetExecution(), nil
}

// Timeline reads what happened to an execution, oldest first: accept, attempts, lease renewals,
// progress, late outcomes, settlement, events and each delivery attempt.
func (c *Client) Timeline(ctx context.Context, id string) (*Timeline, error) {
	resp, err := c.rpc.GetExecutionTimeline(c.auth(ctx), &gatewayv1.GetExecutionTimelineRequest{Id: id})
	if err != nil {
		return nil, wrap(ctx, "timeline of execution "+id, err)
	}
	return resp, nil
}

// Unmarshal decodes s (an execution's result, payload or progress, an event's data) into v as
// encoding/json would decode the same JSON: the counterpart of a struct payload.
func Unmarshal(s *structpb.Struct, v any) error {
	raw, err := protojson.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode struct: %w", err)
	}
	return json.Unmarshal(raw, v)
}

// toStruct is a payload as the request carries it.
func toStruct(payload any) (*structpb.Struct, error) {
	switch p := payload.(type) {
	case nil:
		return nil, nil
	case *structpb.Struct:
		return p, nil
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("encode payload: %w", err)
	}
	if string(raw) == "null" { // a nil map or pointer: no payload
		return nil, nil
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(raw, s); err != nil {
		return nil, fmt.Errorf("payload must encode as a JSON object: %w", err)
	}
	return s, nil
}

// walk yields the items of page after page, from the page token on, until a page has no
// next_page_token; a refusal is yielded as the error of a last pair.
func walk[T any](yield func(T, error) bool, token string, page func(token string) ([]T, string, error)) {
	for {
		items, next, err := page(token)
		if err != nil {
			var zero T
			yield(zero, err)
			return
		}
		for _, item := range items {
			if !yield(item, nil) {
				return
			}
		}
		if next == "" {
			return
		}
		token = next
	}
}
