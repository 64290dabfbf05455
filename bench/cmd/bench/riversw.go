package main

import (
	"context"
	"fmt"
	"os"

	"github.com/integrations-platform/integrations/bench/internal/accept"
	"github.com/integrations-platform/integrations/bench/internal/flow"
	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/bench/internal/riversw"
	"github.com/integrations-platform/integrations/e2e/stack"
)

// systemRiverSW names the same-work River peer's rows.
const systemRiverSW = "river-same-work"

// swPeer is the same-work River peer (bench/internal/riversw) running as a child process of the
// bench, delivering to the stack's receiver.
type swPeer struct {
	proc   *riversw.Process
	schema string
}

// startRiverSW migrates River's tables into a schema of their own and starts `bench
// riversw-serve` on them, calling the stack's dummy adapter and delivering to its receiver.
func startRiverSW(ctx context.Context, o options, st *stack.Stack) (*swPeer, error) {
	schema := st.Schema + "_riversw"
	if err := accept.MigrateRiver(ctx, o.dbURL, schema); err != nil {
		return nil, fmt.Errorf("River same work: migrate: %w", err) //nolint:staticcheck // ST1005: River is a name
	}
	exe, err := os.Executable()
	if err != nil {
		dropSchema(ctx, o.dbURL, schema)
		return nil, err
	}
	p, err := riversw.Launch(ctx, exe, riversw.Config{
		DatabaseURL: o.dbURL, Schema: schema, AdapterID: "dummy", AdapterAddr: st.Addrs["dummy-adapter"],
		PlatformKey: st.PlatformKey, ReceiverURL: st.Receiver.URL, SigningSecret: st.SigningSecret, Capability: stack.Capability,
	}, o.gomaxprocs, os.Stderr)
	if err != nil {
		dropSchema(ctx, o.dbURL, schema)
		return nil, err
	}
	return &swPeer{proc: p, schema: schema}, nil
}

func (p *swPeer) close(ctx context.Context, o options) {
	if err := p.proc.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: River same work:", err)
	}
	dropSchema(ctx, o.dbURL, p.schema)
}

// pids names the peer's process for the CPU snapshots.
func (p *swPeer) pids() map[string]int { return map[string]int{"riversw": p.proc.PID()} }

// swRun runs the peer's end-to-end call: a warm-up, then run; each call is POST → webhook
// received by the stack's receiver (the platform is idle meanwhile: the stack is drained first).
func swRun(ctx context.Context, o options, st *stack.Stack, run func(load.Submit) load.Result) (load.Result, error) {
	if _, err := st.Drain(ctx, o.drainTimeout); err != nil {
		return load.Result{}, err
	}
	tracker := flow.NewTracker(st.Receiver)
	defer tracker.Stop(st.Receiver)
	submit, err := riversw.Submit(o.sw.proc.URL, tracker, map[string]any{"bench": "end-to-end"})
	if err != nil {
		return load.Result{}, err
	}
	if o.warmup > 0 {
		load.Run(ctx, load.Params{Callers: 16, Duration: o.warmup}, o.maxErrors, load.OpOf(submit))
	}
	return run(submit), nil
}

const swWhat = "POST → River execute job → dummy adapter over gRPC → JobCompleteTx + webhook job (one transaction) → signed webhook received"
