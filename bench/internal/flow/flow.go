// Package flow is the end-to-end workload of issue 6 (items 2 and 3): an async invoke of
// dummy.echo through the gateway, answered pending, then the wait for the application's signed
// webhook announcing the execution's completion — accept → dispatch → adapter → settle → event
// delivered. The call's latency is accept → webhook received.
package flow

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/e2e/stack"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// Timeout bounds the wait for one execution's webhook.
const Timeout = 10 * time.Minute

// Tracker matches the receiver's deliveries to the executions waiting for them, by execution id.
type Tracker struct {
	done *load.Completions[string]
}

// NewTracker starts tracking the receiver's deliveries; Stop ends it.
func NewTracker(r *stack.Receiver) *Tracker {
	t := &Tracker{done: load.NewCompletions[string]()}
	r.OnEvent(t.onEvent)
	return t
}

func (t *Tracker) onEvent(ev stack.Event) {
	var body struct {
		Data struct {
			ExecutionID string `json:"execution_id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Body, &body); err != nil || body.Data.ExecutionID == "" {
		return
	}
	var err error
	if ev.VerifyErr != nil {
		err = fmt.Errorf("webhook of %s did not verify: %w", body.Data.ExecutionID, ev.VerifyErr)
	}
	t.done.Done(body.Data.ExecutionID, ev.At, err)
}

// Await waits for the delivery of execution id's completion event and returns when it arrived.
func (t *Tracker) Await(ctx context.Context, id string) (time.Time, error) {
	at, err := t.done.Await(ctx, id, Timeout)
	if err != nil && ctx.Err() == nil {
		return at, fmt.Errorf("webhook of execution %w", err)
	}
	return at, err
}

// Stop stops tracking.
func (t *Tracker) Stop(r *stack.Receiver) { r.OnEvent(nil) }

// PrepareSubmit returns the end-to-end call split in two: the invoke, answered when the gateway
// accepted the execution, and the wait for its webhook.
func PrepareSubmit(st *stack.Stack) (load.Submit, func(), error) {
	return PrepareSubmitPayload(st, map[string]any{"bench": "end-to-end"})
}

// PrepareSubmitPayload is PrepareSubmit invoking with payload (e.g. a dummy adapter script).
func PrepareSubmitPayload(st *stack.Stack, payload map[string]any) (load.Submit, func(), error) {
	conn, err := st.Dial("gateway", "")
	if err != nil {
		return nil, nil, err
	}
	client := gatewayv1.NewGatewayServiceClient(conn)
	p, err := structpb.NewStruct(payload)
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	tracker := NewTracker(st.Receiver)
	req := &gatewayv1.InvokeCapabilityRequest{Capability: stack.Capability, Mode: executionv1.Mode_MODE_ASYNC, Payload: p}
	submit := func(ctx context.Context, _ int, _ int64) (func() error, error) {
		resp, err := client.InvokeCapability(grpcx.WithBearer(ctx, st.APIKey), req)
		if err != nil {
			return nil, fmt.Errorf("invoke: %w", err)
		}
		id := resp.GetExecution().GetId()
		return func() error { _, err := tracker.Await(ctx, id); return err }, nil
	}
	release := func() {
		tracker.Stop(st.Receiver)
		_ = conn.Close()
	}
	return submit, release, nil
}
