package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/cost"
	"github.com/integrations-platform/integrations/bench/internal/flow"
	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/e2e/stack"
)

// RetryResult is the retry scenario: executions whose first attempt fails retryably (the dummy
// adapter's script {"dummy": {"fail_transient": 1}}) and whose second succeeds, at the dev
// catalog's schedule (first retry delay 1 m) and the stack's time scale 1 — the real delay, so
// that the delay levels are walked as in production (a scaled delay would land in other levels).
type RetryResult struct {
	Executions int     `json:"executions"`
	Errors     int     `json:"errors"`
	Seconds    float64 `json:"seconds"`
	// PerExecution is the broker's counters' deltas over the run divided by its executions (each
	// one retry), and PerRetry the same less the nothing-fails cost per execution of the e2e run
	// (zero when that was not measured: then PerRetry is PerExecution).
	PerExecution map[string]float64 `json:"mq_per_execution"`
	PerRetry     map[string]float64 `json:"mq_per_retry"`
	// MessagesPerRetry is published + dead-lettered of PerRetry: every message the broker
	// appended to a queue for the retry (a publish, or a dead-lettering from a holding queue into
	// the next) — the "two quorum appends" of a hop in issue 13, so one hop is 2. Delivered (to a
	// consumer) is reported beside it, not added; dead-lettered alone is about the hops walked.
	MessagesPerRetry float64 `json:"messages_per_retry"`
	// AllPerRetry is published + dead-lettered + delivered of PerRetry.
	AllPerRetry float64 `json:"all_messages_per_retry"`
	MQError     string  `json:"mq_error,omitempty"`
	// PortPerRetry is this stack's own message-port counters (stack.PortCounters: the services'
	// integrations_mq_messages_total, route/event) over the run per execution, less the one
	// dispatch an execution that does not fail publishes; PortMessagesPerRetry is what that makes
	// the broker append per retry: each publish into a holding queue (the dispatcher's, or a
	// consumer's deferral) is one append and, when its TTL expires, one dead-lettering back into
	// the work queue. Unlike PerRetry, no other user of the broker is counted.
	PortPerRetry         map[string]float64 `json:"port_per_retry,omitempty"`
	PortMessagesPerRetry float64            `json:"port_messages_per_retry,omitempty"`
	PortError            string             `json:"port_error,omitempty"`
}

// retryCounters are the counters a retry's messages are counted in.
var retryCounters = []string{"published", "dead_lettered"}

// runRetry measures the retry scenario; base is the e2e run's nothing-fails cost (nil: none).
func runRetry(ctx context.Context, o options, st *stack.Stack, base *Cost) (*RetryResult, error) {
	fmt.Fprintf(os.Stderr, "bench: retry, %d executions failing once (transient) then succeeding after the 1 m retry delay\n", o.retryN)
	if _, err := st.Drain(ctx, o.drainTimeout); err != nil {
		return nil, err
	}
	submit, release, err := flow.PrepareSubmitPayload(st, map[string]any{"bench": "retry", "dummy": map[string]any{"fail_transient": 1}})
	if err != nil {
		return nil, err
	}
	defer release()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(cost.StatsFlush):
	}
	before, err := cost.ReadMQ(ctx)
	if err != nil {
		return &RetryResult{MQError: err.Error()}, nil
	}
	portBefore, portErr := st.PortCounters(ctx)
	r := load.RunPipelined(ctx, load.Params{Callers: min(o.e2eC, o.retryN), N: o.retryN}, o.maxErrors, submit)
	after, err := cost.ReadMQ(ctx)
	res := &RetryResult{Executions: r.Requests, Errors: r.Errors, Seconds: r.Elapsed.Seconds()}
	if portErr == nil && r.Requests > 0 {
		var portAfter map[string]float64
		if portAfter, portErr = st.PortCounters(ctx); portErr == nil {
			res.PortPerRetry, res.PortMessagesPerRetry = portPerRetry(portBefore, portAfter, r.Requests)
			fmt.Fprintf(os.Stderr, "  retry: this stack's port per retry: %s → %.2f appended\n", kvText(res.PortPerRetry, "%.2f"), res.PortMessagesPerRetry)
		}
	}
	if portErr != nil {
		res.PortError = portErr.Error()
	}
	if err != nil {
		res.MQError = err.Error()
		return res, nil
	}
	if err := st.Check(); err != nil {
		return res, err
	}
	if r.Requests == 0 {
		res.MQError = fmt.Sprintf("no execution completed (%v)", r.FirstErr)
		return res, nil
	}
	res.PerExecution, res.PerRetry, res.MessagesPerRetry, res.AllPerRetry = perRetry(before, after, r.Requests, base)
	fmt.Fprintf(os.Stderr, "  retry: %d executions (%d errors) in %.1fs; broker per retry: %s → %.2f appended (published + dead-lettered), %.2f with delivered\n",
		res.Executions, res.Errors, res.Seconds, kvText(res.PerRetry, "%.2f"), res.MessagesPerRetry, res.AllPerRetry)
	return res, nil
}

// perRetry is the broker's counters between before and after per execution (each one retry), the
// same less base's nothing-fails cost per execution, and of that the appended messages
// (published + dead-lettered) and all (with delivered).
func perRetry(before, after cost.MQ, executions int, base *Cost) (perExec, perRetry map[string]float64, appended, all float64) {
	n := float64(executions)
	perExec = map[string]float64{
		"published":     round2(float64(after.Published-before.Published) / n),
		"routed":        round2(float64(after.Routed-before.Routed) / n),
		"delivered":     round2(float64(after.Delivered-before.Delivered) / n),
		"acknowledged":  round2(float64(after.Acked-before.Acked) / n),
		"dead_lettered": round2(float64(after.DeadLettered-before.DeadLettered) / n),
	}
	perRetry = map[string]float64{}
	for k, v := range perExec {
		if base != nil && base.MQ != nil {
			v -= base.MQ[k]
		}
		perRetry[k] = round2(v)
	}
	for _, k := range retryCounters {
		appended += perRetry[k]
	}
	return perExec, perRetry, round2(appended), round2(appended + perRetry["delivered"])
}

// portPerRetry is the executions route's port counters between before and after per execution
// (each one retry); and the broker appends that makes per retry: two per message put into a
// holding queue (the append, and its dead-lettering back when its TTL expires).
func portPerRetry(before, after map[string]float64, executions int) (map[string]float64, float64) {
	n := float64(executions)
	out := map[string]float64{}
	for _, ev := range []string{"published", "deferred", "retried", "acknowledged", "dead_lettered"} {
		k := "executions/" + ev
		out[ev] = round2((after[k] - before[k]) / n)
	}
	// The dispatcher's publishes past the first dispatch go to holding queues; so does each copy
	// a consumer's Defer or Fail makes (counted as deferred, retried: the port's publish counter
	// counts only Publish and PublishAfter).
	holding := out["published"] - 1 + out["deferred"] + out["retried"]
	return out, round2(2 * holding)
}
