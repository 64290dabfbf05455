package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/accept"
	"github.com/integrations-platform/integrations/bench/internal/cost"
	"github.com/integrations-platform/integrations/bench/internal/flow"
	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/bench/internal/riverpeer"
	"github.com/integrations-platform/integrations/bench/internal/riversw"
	"github.com/integrations-platform/integrations/e2e/stack"
)

// FlowRow is one end-to-end or open-loop measurement: of the platform, or of a peer.
type FlowRow struct {
	Scenario string `json:"scenario"` // "e2e", "serial", "latency"
	System   string `json:"system"`   // "integrations", "river", "temporal"
	What     string `json:"what"`
	// Callers is the closed loop's concurrency (each caller one execution in flight); Offered the
	// open loop's arrival rate per second.
	Callers   int      `json:"callers,omitempty"`
	Offered   float64  `json:"offered_per_s,omitempty"`
	N         int      `json:"n"`
	Completed int      `json:"completed"`
	Errors    int      `json:"errors"`
	FirstErr  string   `json:"first_error,omitempty"`
	Seconds   float64  `json:"seconds"`
	PerSecond float64  `json:"completed_per_s"`
	P50ms     float64  `json:"p50_ms"`
	P99ms     float64  `json:"p99_ms"`
	Maxms     float64  `json:"max_ms"`
	Targets   []Target `json:"targets,omitempty"`
}

// Cost is what the end-to-end run of the platform cost, from the servers' own statistics.
type Cost struct {
	Executions int `json:"executions"`
	// CPUSecondsPer10k is CPU seconds per 10 000 executions, by process ("postgres": all its
	// processes, "beam.smp": RabbitMQ, "bench": the load generator and webhook receiver).
	CPUSecondsPer10k map[string]float64 `json:"cpu_s_per_10k"`
	// PeakRSSMiB is each program's peak resident memory (VmHWM) at the end of the run.
	PeakRSSMiB map[string]float64 `json:"peak_rss_mib"`
	// Postgres, per execution: transactions of the stack's database (commits and rollbacks,
	// read-only ones included), WAL bytes and WAL flushes of the server.
	PGTransactions float64 `json:"pg_transactions_per_execution"`
	PGWALBytes     float64 `json:"pg_wal_bytes_per_execution"`
	PGWALSyncs     float64 `json:"pg_wal_syncs_per_execution"`
	// RabbitMQ, per execution, from the broker's global counters (the whole broker).
	MQ      map[string]float64 `json:"mq_per_execution,omitempty"`
	MQError string             `json:"mq_error,omitempty"`
	// Port is this stack's own message-port counters per execution (stack.PortCounters), summed
	// over the routes by event (published, acknowledged…): no other user of the broker counted.
	// Meaningful for the platform's runs only (a peer's run leaves the stack idle).
	Port map[string]float64 `json:"port_per_execution,omitempty"`
}

// Targets of issue 6 for the flow rows.
const (
	targetVsRiverE2E    = 1.0
	targetVsTemporalE2E = 20.0
	targetP99At200ms    = 100.0
	targetSerialP50ms   = 10.0
)

func rowOf(scenario, system, what string, callers int, offered float64, n int, r load.Result) FlowRow {
	row := FlowRow{Scenario: scenario, System: system, What: what, Callers: callers, Offered: offered, N: n,
		Completed: r.Requests, Errors: r.Errors, Seconds: r.Elapsed.Seconds(), PerSecond: r.Rate(),
		P50ms: ms(r.P50), P99ms: ms(r.P99), Maxms: ms(r.Max)}
	if r.FirstErr != nil {
		row.FirstErr = r.FirstErr.Error()
	}
	return row
}

// runFlow runs the end-to-end scenarios selected: serial (one caller), e2e (the platform and its
// peers, same count and concurrency, with the platform's cost) and latency (open loop).
func runFlow(ctx context.Context, o options, st *stack.Stack, rep *Report) error {
	what := "invoke dummy.echo async over gRPC → dispatch → dummy adapter → settle → signed webhook received"
	if o.peers["riversw"] && (o.scenarios["serial"] || o.scenarios["e2e"] || o.scenarios["latency"]) {
		sw, err := startRiverSW(ctx, o, st)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		} else {
			defer sw.close(ctx, o)
			o.sw = sw
		}
	}
	if o.scenarios["serial"] {
		fmt.Fprintf(os.Stderr, "bench: serial end to end, %d executions one at a time\n", o.serialN)
		r, err := flowRun(ctx, o, st, func(op load.Op) load.Result {
			return load.Run(ctx, load.Params{Callers: 1, N: o.serialN}, o.maxErrors, op)
		})
		if err != nil {
			return err
		}
		row := rowOf("serial", "integrations", what, 1, 0, o.serialN, r)
		row.Targets = []Target{{Name: "p50 ms at most", Want: targetSerialP50ms, Got: row.P50ms, Pass: row.P50ms <= targetSerialP50ms}}
		rep.Flow = append(rep.Flow, row)
		printFlowRow(os.Stderr, row)
		if o.sw != nil {
			r, err := swRun(ctx, o, st, func(s load.Submit) load.Result {
				return load.Run(ctx, load.Params{Callers: 1, N: o.serialN}, o.maxErrors, load.OpOf(s))
			})
			if err != nil {
				return err
			}
			row := rowOf("serial", systemRiverSW, swWhat, 1, 0, o.serialN, r)
			rep.Flow = append(rep.Flow, row)
			printFlowRow(os.Stderr, row)
		}
	}
	if o.scenarios["e2e"] {
		for _, mode := range o.e2eModes {
			if err := runE2E(ctx, o, st, rep, mode, what); err != nil {
				return err
			}
		}
	}
	if o.scenarios["retry"] {
		res, err := runRetry(ctx, o, st, rep.Cost)
		if err != nil {
			return err
		}
		rep.Retry = res
	}
	if o.scenarios["latency"] {
		for _, rate := range o.rates {
			n := int(rate * o.openD.Seconds())
			fmt.Fprintf(os.Stderr, "bench: open loop at %.0f executions/s for %s (%d executions)\n", rate, o.openD, n)
			r, err := flowRun(ctx, o, st, func(op load.Op) load.Result {
				return load.RunOpen(ctx, load.OpenParams{Rate: rate, N: n}, op)
			})
			if err != nil {
				return err
			}
			row := rowOf("latency", "integrations", "open loop: "+what, 0, rate, n, r)
			if rate == 200 {
				row.Targets = []Target{{Name: "p99 ms at most", Want: targetP99At200ms, Got: row.P99ms, Pass: row.P99ms <= targetP99At200ms}}
			}
			rep.Flow = append(rep.Flow, row)
			printFlowRow(os.Stderr, row)
			if o.sw != nil && slices.Contains(o.swRates, rate) {
				r, err := swRun(ctx, o, st, func(s load.Submit) load.Result {
					return load.RunOpen(ctx, load.OpenParams{Rate: rate, N: n}, load.OpOf(s))
				})
				if err != nil {
					return err
				}
				row := rowOf("latency", systemRiverSW, "open loop: "+swWhat, 0, rate, n, r)
				rep.Flow = append(rep.Flow, row)
				printFlowRow(os.Stderr, row)
			}
		}
	}
	return nil
}

// The e2e modes.
const (
	// pipelined: the callers invoke without waiting for completions (load.RunPipelined) — the
	// completion throughput with as much in flight as they can put there; the reference
	// figures for the peers are of this kind.
	modePipelined = "pipelined"
	// closed: each caller has one execution in flight and invokes again when its webhook arrived.
	modeClosed = "closed"
)

// runE2E runs the platform and its peers end to end in one mode, same count and concurrency; the
// platform's pipelined run is the one whose cost is read.
func runE2E(ctx context.Context, o options, st *stack.Stack, rep *Report, mode, what string) error {
	fmt.Fprintf(os.Stderr, "bench: end to end (%s), %d executions by %d callers\n", mode, o.e2eN, o.e2eC)
	var c *Cost
	r, err := flowRunSubmit(ctx, o, st, func(submit load.Submit) load.Result {
		drive := func() load.Result {
			if mode == modePipelined {
				return load.RunPipelined(ctx, load.Params{Callers: o.e2eC, N: o.e2eN}, o.maxErrors, submit)
			}
			return load.Run(ctx, load.Params{Callers: o.e2eC, N: o.e2eN}, o.maxErrors, load.OpOf(submit))
		}
		if mode != modePipelined {
			return drive()
		}
		var res load.Result
		c, res = measureCost(ctx, st, nil, func() load.Result {
			profiled := profileServices(ctx, o, st)
			defer profiled()
			return drive()
		})
		return res
	})
	if err != nil {
		return err
	}
	if c != nil {
		rep.Cost = c
	}
	scenario := "e2e/" + mode
	ours := rowOf(scenario, "integrations", what, o.e2eC, 0, o.e2eN, r)
	printFlowRow(os.Stderr, ours)
	peers := runPeers(ctx, o, st, mode)
	if o.sw != nil {
		var swCost *Cost
		r, err := swRun(ctx, o, st, func(s load.Submit) load.Result {
			drive := func() load.Result {
				if mode == modePipelined {
					return load.RunPipelined(ctx, load.Params{Callers: o.e2eC, N: o.e2eN}, o.maxErrors, s)
				}
				return load.Run(ctx, load.Params{Callers: o.e2eC, N: o.e2eN}, o.maxErrors, load.OpOf(s))
			}
			if mode != modePipelined {
				return drive()
			}
			var res load.Result
			swCost, res = measureCost(ctx, st, o.sw.pids(), drive)
			return res
		})
		if err != nil {
			return err
		}
		if swCost != nil {
			rep.RiverSWCost = swCost
		}
		peers = append([]FlowRow{rowOf(scenario, systemRiverSW, swWhat+" ("+riversw.Description()+")", o.e2eC, 0, o.e2eN, r)}, peers...)
	}
	for _, p := range peers {
		printFlowRow(os.Stderr, p)
		switch {
		case p.Errors > p.N/100 || p.PerSecond == 0:
		case p.System == systemRiverSW:
			ours.Targets = append(ours.Targets, Target{Name: "× river same work", Want: targetVsRiverSWE2E, Got: ours.PerSecond / p.PerSecond, Pass: ours.PerSecond >= targetVsRiverSWE2E*p.PerSecond})
		case p.System == "river" && strings.Contains(p.What, "best"):
			ours.Targets = append(ours.Targets, Target{Name: "× river (best)", Want: targetVsRiverE2E, Got: ours.PerSecond / p.PerSecond, Pass: ours.PerSecond >= targetVsRiverE2E*p.PerSecond})
		case p.System == "temporal":
			ours.Targets = append(ours.Targets, Target{Name: "× temporal", Want: targetVsTemporalE2E, Got: ours.PerSecond / p.PerSecond, Pass: ours.PerSecond >= targetVsTemporalE2E*p.PerSecond})
		}
	}
	rep.Flow = append(rep.Flow, ours)
	rep.Flow = append(rep.Flow, peers...)
	return nil
}

// flowRun is flowRunSubmit for a run that needs the whole call.
func flowRun(ctx context.Context, o options, st *stack.Stack, run func(load.Op) load.Result) (load.Result, error) {
	return flowRunSubmit(ctx, o, st, func(s load.Submit) load.Result { return run(load.OpOf(s)) })
}

// flowRunSubmit drains the stack, runs a warm-up and then the measured run of the end-to-end call.
func flowRunSubmit(ctx context.Context, o options, st *stack.Stack, run func(load.Submit) load.Result) (load.Result, error) {
	if _, err := st.Drain(ctx, o.drainTimeout); err != nil {
		return load.Result{}, err
	}
	submit, release, err := flow.PrepareSubmit(st)
	if err != nil {
		return load.Result{}, err
	}
	defer release()
	if o.warmup > 0 {
		load.Run(ctx, load.Params{Callers: 16, Duration: o.warmup}, o.maxErrors, load.OpOf(submit))
		if _, err := st.Drain(ctx, o.drainTimeout); err != nil {
			return load.Result{}, err
		}
	}
	r := run(submit)
	if err := st.Check(); err != nil {
		return r, err
	}
	return r, nil
}

// profileServices starts CPU profiles of every service over -profile-d, if -profile is set, and
// returns a function that waits for them to be written.
func profileServices(ctx context.Context, o options, st *stack.Stack) func() {
	if o.profileAll == "" {
		return func() {}
	}
	if err := os.MkdirAll(o.profileAll, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench: profiles:", err)
		return func() {}
	}
	var wg sync.WaitGroup
	for name := range st.PIDs() {
		base := st.PprofURLOf(name)
		if base == "" {
			continue
		}
		path := filepath.Join(o.profileAll, name+".pprof")
		wg.Go(func() {
			if err := fetchProfile(ctx, base, o.profileLength, path); err != nil {
				fmt.Fprintf(os.Stderr, "bench: profile of %s: %v\n", name, err)
			}
		})
	}
	return func() {
		wg.Wait()
		fmt.Fprintln(os.Stderr, "bench: CPU profiles in", o.profileAll)
	}
}

// measureCost runs f and reads what it cost: CPU per process, Postgres and RabbitMQ counters, and
// the programs' peak memory.
func measureCost(ctx context.Context, st *stack.Stack, extra map[string]int, f func() load.Result) (*Cost, load.Result) {
	// The stack is drained; once every backend has published its counts, they hold everything
	// before the run.
	select {
	case <-ctx.Done():
	case <-time.After(cost.StatsFlush):
	}
	pgBefore, pgErr := cost.ReadPG(ctx, st.DB)
	mqBefore, mqErr := cost.ReadMQ(ctx)
	portBefore, portErr := st.PortCounters(ctx)
	cpuBefore := cpuSnapshot(st, extra)
	r := f()
	// Everything accepted has been delivered when f returns (each call awaited its webhook); the
	// stack's background passes go on and are counted until the counters settle.
	cpu := cpuDelta(cpuBefore, cpuSnapshot(st, extra))
	// Wait until every backend has published its counts. The stack's own background passes
	// (the dispatcher's and relay's timers, the sweeper) are counted too: a few transactions a
	// second, a few hundredths of a transaction per execution in a run of thousands.
	select {
	case <-ctx.Done():
	case <-time.After(cost.StatsFlush):
	}
	pgAfter, err := cost.ReadPG(ctx, st.DB)
	pgErr = errors.Join(pgErr, err)
	mqAfter, err := cost.ReadMQ(ctx)
	mqErr = errors.Join(mqErr, err)
	var portAfter map[string]float64
	if portErr == nil {
		portAfter, portErr = st.PortCounters(ctx)
	}
	n := float64(r.Requests)
	c := &Cost{Executions: r.Requests, CPUSecondsPer10k: map[string]float64{}, PeakRSSMiB: map[string]float64{}}
	if n == 0 {
		return c, r
	}
	for k, v := range cpu {
		c.CPUSecondsPer10k[k] = round2(v / n * 10000)
	}
	pids := st.PIDs()
	maps.Copy(pids, extra)
	for name, pid := range pids {
		if b, err := cost.PeakRSS(pid); err == nil {
			c.PeakRSSMiB[name] = round1(float64(b) / (1 << 20))
		}
	}
	if pgErr == nil {
		c.PGTransactions = round2(float64(pgAfter.Commits+pgAfter.Rollbacks-pgBefore.Commits-pgBefore.Rollbacks) / n)
		c.PGWALBytes = round1(float64(pgAfter.WALBytes-pgBefore.WALBytes) / n)
		c.PGWALSyncs = round2(float64(pgAfter.WALSyncs-pgBefore.WALSyncs) / n)
	} else {
		fmt.Fprintln(os.Stderr, "bench: Postgres statistics:", pgErr)
	}
	if mqErr == nil {
		c.MQ = map[string]float64{
			"published":     round2(float64(mqAfter.Published-mqBefore.Published) / n),
			"routed":        round2(float64(mqAfter.Routed-mqBefore.Routed) / n),
			"delivered":     round2(float64(mqAfter.Delivered-mqBefore.Delivered) / n),
			"acknowledged":  round2(float64(mqAfter.Acked-mqBefore.Acked) / n),
			"dead_lettered": round2(float64(mqAfter.DeadLettered-mqBefore.DeadLettered) / n),
		}
	} else {
		c.MQError = mqErr.Error()
	}
	if portErr == nil {
		c.Port = map[string]float64{}
		for k, v := range portAfter {
			_, event, _ := strings.Cut(k, "/")
			c.Port[event] += v - portBefore[k]
		}
		for k, v := range c.Port {
			c.Port[k] = round2(v / n)
		}
	} else {
		fmt.Fprintln(os.Stderr, "bench: port counters:", portErr)
	}
	return c, r
}

// runPeers measures River and Temporal doing the same count at the same concurrency.
func runPeers(ctx context.Context, o options, st *stack.Stack, mode string) []FlowRow {
	var rows []FlowRow
	if o.peers["river"] {
		schema := st.Schema + "_river_e2e"
		if err := accept.MigrateRiver(ctx, o.dbURL, schema); err != nil {
			fmt.Fprintln(os.Stderr, "bench: River:", err)
		} else {
			defer dropSchema(ctx, o.dbURL, schema)
			best := riverpeer.BestConfig()
			for _, c := range []struct {
				label string
				cfg   riverpeer.Config
			}{
				{"best", best},
				{"defaults", riverpeer.Config{}},
			} {
				cfg := c.cfg
				cfg.DatabaseURL, cfg.Schema, cfg.N, cfg.Concurrency = o.dbURL, schema, o.e2eN, o.e2eC
				run := riverpeer.Run
				if mode == modePipelined {
					run = riverpeer.RunPipelined
				}
				res, err := run(ctx, cfg)
				if err != nil {
					fmt.Fprintf(os.Stderr, "bench: River (%s): %v\n", c.label, err)
					continue
				}
				r := load.Result{Requests: res.Completed, Errors: res.Errors, FirstErr: res.FirstErr, Elapsed: res.Elapsed,
					P50: res.P50, P99: res.P99, Max: res.Max}
				rows = append(rows, rowOf("e2e/"+mode, "river",
					fmt.Sprintf("River %s (%s): Insert → worker returns nil → completed event observed", c.label, res.Config),
					o.e2eC, 0, o.e2eN, r))
			}
		}
	}
	if o.peers["temporal"] && (mode == modePipelined || o.temporalClosed) {
		row, err := runTemporal(ctx, o, mode)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: Temporal:", err)
		} else {
			rows = append(rows, row)
		}
	}
	return rows
}

// runTemporal runs bench/temporal (a module of its own, built with the newer Go toolchain the
// Temporal server needs) and reads its JSON result.
func runTemporal(ctx context.Context, o options, mode string) (FlowRow, error) {
	dir := filepath.Join(o.root, "bench", "temporal")
	out, err := os.CreateTemp("", "bench-temporal-*.json")
	if err != nil {
		return FlowRow{}, err
	}
	_ = out.Close()
	defer func() { _ = os.Remove(out.Name()) }()
	cmd := exec.CommandContext(ctx, "go", "run", ".", "-n", fmt.Sprint(o.e2eN), "-c", fmt.Sprint(o.e2eC), "-json", out.Name(),
		"-pipelined="+fmt.Sprint(mode == modePipelined))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN="+temporalToolchain)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "bench: Temporal (%s, GOTOOLCHAIN=%s), %d calls by %d callers\n", dir, temporalToolchain, o.e2eN, o.e2eC)
	if err := cmd.Run(); err != nil {
		return FlowRow{}, fmt.Errorf("bench/temporal: %w", err)
	}
	raw, err := os.ReadFile(out.Name())
	if err != nil {
		return FlowRow{}, err
	}
	var t struct {
		What       string  `json:"what"`
		Config     string  `json:"config"`
		N          int     `json:"n"`
		C          int     `json:"concurrency"`
		Completed  int     `json:"completed"`
		Errors     int     `json:"errors"`
		FirstError string  `json:"first_error"`
		Seconds    float64 `json:"seconds"`
		PerSecond  float64 `json:"per_second"`
		P50        float64 `json:"p50_ms"`
		P99        float64 `json:"p99_ms"`
		Max        float64 `json:"max_ms"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return FlowRow{}, fmt.Errorf("bench/temporal result: %w", err)
	}
	return FlowRow{Scenario: "e2e/" + mode, System: "temporal", What: t.What + " (" + t.Config + ")", Callers: t.C, N: t.N,
		Completed: t.Completed, Errors: t.Errors, FirstErr: t.FirstError, Seconds: t.Seconds, PerSecond: t.PerSecond,
		P50ms: t.P50, P99ms: t.P99, Maxms: t.Max}, nil
}

// temporalToolchain is the Go the Temporal server module needs (go.temporal.io/server v1.32.2
// requires Go ≥ 1.26.10); the go command fetches it from the module proxy.
const temporalToolchain = "go1.27.3"

func dropSchema(ctx context.Context, dbURL, schema string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	pool, err := accept.Pool(cctx, dbURL, 1)
	if err != nil {
		return
	}
	defer pool.Close()
	if _, err := pool.Exec(cctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: drop schema:", err)
	}
}

func printFlowRow(w io.Writer, r FlowRow) {
	load := fmt.Sprintf("c=%d", r.Callers)
	if r.Offered > 0 {
		load = fmt.Sprintf("%.0f/s offered", r.Offered)
	}
	fmt.Fprintf(w, "  %-8s %-12s %-14s %6d done %5d errors %7.1fs %8.1f/s  p50 %7.2fms  p99 %8.2fms  max %8.2fms\n",
		r.Scenario, r.System, load, r.Completed, r.Errors, r.Seconds, r.PerSecond, r.P50ms, r.P99ms, r.Maxms)
}

func printFlowTable(w io.Writer, rep *Report) {
	if len(rep.Flow) == 0 {
		return
	}
	fmt.Fprintln(w, "\nEnd to end (accept → webhook received) and latency under offered load")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tsystem\tload\tcompleted\terrors\tseconds\tper s\tp50\tp99\tmax\ttarget\tverdict\t")
	for _, r := range rep.Flow {
		l := fmt.Sprintf("%d callers", r.Callers)
		if r.Offered > 0 {
			l = fmt.Sprintf("%.0f/s offered", r.Offered)
		}
		var ts, vs []string
		for _, t := range r.Targets {
			if strings.HasPrefix(t.Name, "×") {
				ts = append(ts, fmt.Sprintf("≥%.0f%s (%.2f)", t.Want, t.Name, t.Got))
			} else {
				ts = append(ts, fmt.Sprintf("%s %.0f", t.Name, t.Want))
			}
			vs = append(vs, passFail(t.Pass))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.1f\t%.1f\t%.2fms\t%.2fms\t%.2fms\t%s\t%s\t\n", r.Scenario, r.System, l,
			r.Completed, r.Errors, r.Seconds, r.PerSecond, r.P50ms, r.P99ms, r.Maxms, strings.Join(ts, ", "), strings.Join(vs, ", "))
	}
	tw.Flush() //nolint:errcheck // stdout
	seen := map[string]bool{}
	for _, r := range rep.Flow {
		if line := r.System + ": " + r.What; r.System != "integrations" && !seen[line] {
			seen[line] = true
			fmt.Fprintln(w, line)
		}
	}
	printCost(w, "Cost of the platform's end-to-end run", rep.Cost)
	printCost(w, "Cost of River doing the same work (its pipelined end-to-end run; Postgres and riversw are its own, the rest idle)", rep.RiverSWCost)
}

func printCost(w io.Writer, title string, c *Cost) {
	if c == nil {
		return
	}
	fmt.Fprintf(w, "\n%s (%d executions)\n", title, c.Executions)
	fmt.Fprintf(w, "CPU seconds per 10k executions: %s\n", kvText(c.CPUSecondsPer10k, "%.2f"))
	fmt.Fprintf(w, "peak RSS (MiB):                 %s\n", kvText(c.PeakRSSMiB, "%.1f"))
	fmt.Fprintf(w, "Postgres per execution:         %.2f transactions, %.0f WAL bytes, %.2f WAL flushes\n", c.PGTransactions, c.PGWALBytes, c.PGWALSyncs)
	if c.MQError != "" {
		fmt.Fprintf(w, "RabbitMQ per execution:         unavailable (%s)\n", c.MQError)
	} else {
		fmt.Fprintf(w, "RabbitMQ per execution:         %s (published and delivered: the broker messages)\n", kvText(c.MQ, "%.2f"))
	}
}

func kvText(m map[string]float64, format string) string {
	var parts []string
	for _, k := range keys(m) {
		parts = append(parts, k+" "+fmt.Sprintf(format, m[k]))
	}
	return strings.Join(parts, ", ")
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
