// Command bench runs the platform's benchmarks against the real stack, started as separate
// processes (e2e/stack), beside the peers and the physical ceilings measured in the same
// run, and prints one table plus a JSON file in bench/results/ (issue 6).
//
// Scenarios (-scenarios):
//
//	accept   async invokes of dummy.echo through the gateway over gRPC and REST, closed loop at
//	         each -callers; beside them the Postgres ceiling (a raw pgx transaction writing the
//	         same two rows) and River's Insert, at the same concurrency.
//	ratelimit  application B's accept latency at a steady -ratelimit-rate: alone, while
//	         application A (added with an invoke limit of -ratelimit-a-limit, 10/s) runs at
//	         exactly its limit, and while A floods at -ratelimit-flood-rate (1000/s) from a
//	         process of its own at the lowest CPU priority; A's refusals and whether they said
//	         when to retry; -ratelimit-r passes (3), B's calls pooled (issue 11). Runs last.
//
//	serial, e2e, latency  end to end (accept → webhook received): one caller; pipelined and
//	         closed at -e2e-c; open loop at -rates — beside River doing the same work
//	         (bench/internal/riversw, a child process `bench riversw-serve`), River's bare
//	         insert → complete and Temporal, with the cost per execution (flow.go).
//	retry    broker messages per retry: executions failing once, retried at the real 1 m delay.
//
// The report ends with issue 13's must-show table, each target PASS/FAIL (issue13.go).
//
// It is a benchmark, not a test: the exit code is 0 whether or not a target is met (non-zero only
// when it could not measure). See docs/benchmarks.md.
//
// Usage: go run ./bench/cmd/bench [-scenarios accept] [-callers 1,16,64] [-d 3s | -n 5000] [-r 3] ...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/accept"
	"github.com/integrations-platform/integrations/bench/internal/autovac"
	"github.com/integrations-platform/integrations/bench/internal/flagx"
	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/bench/internal/procstat"
	"github.com/integrations-platform/integrations/bench/internal/riversw"
	"github.com/integrations-platform/integrations/e2e/stack"
)

type options struct {
	root           string
	dbURL          string
	amqpURL        string
	scenarios      map[string]bool
	callers        []int
	n              int
	duration       time.Duration
	reps           int
	warmup         time.Duration
	drain          bool
	drainTimeout   time.Duration
	out            string
	dbParams       url.Values
	profileDir     string
	pprof          bool
	only           map[string]bool // workloads by scenario/transport key; empty: all
	maxErrors      int
	keepLogs       bool
	without        []string
	peerPool       int
	serialN        int
	e2eN, e2eC     int
	rates          []float64
	openD          time.Duration
	peers          map[string]bool
	mqJSON         string
	e2eModes       []string
	temporalClosed bool
	gomaxprocs     int
	profileAll     string
	profileLength  time.Duration
	rlRate         float64
	rlReps         int
	rlVia          string
	rlD            time.Duration
	rlCallers      int
	rlFloodRate    float64
	rlOff          bool
	rlHold         string
	rlALimit       float64
	swRates        []float64
	retryN         int
	autovacNap     time.Duration
	// sw is the same-work River peer's process while the flow scenarios run (nil: not running).
	sw *swPeer
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "flood" { // the ratelimit scenario's application A
		if err := runFlood(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench flood:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "riversw-serve" { // the same-work River peer's process
		if err := riversw.Serve(); err != nil {
			fmt.Fprintln(os.Stderr, "bench riversw-serve:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags() (options, error) {
	o := options{}
	var scen, callers, params, only string
	flag.StringVar(&o.root, "root", "", "workspace root (default: the directory of go.work at or above the working directory)")
	flag.StringVar(&o.dbURL, "db", defaultDBURL(), "database the stack's schema (and River's) is created in (default $INTEGRATIONS_BENCH_DATABASE_URL, else $INTEGRATIONS_PG_URL/bench)")
	flag.StringVar(&o.amqpURL, "amqp", flagx.EnvOr("INTEGRATIONS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL (default $INTEGRATIONS_AMQP_URL)")
	flag.StringVar(&scen, "scenarios", "accept,serial,e2e,latency,retry,ratelimit", "scenarios to run: accept, serial, e2e, latency, retry, ratelimit")
	flag.IntVar(&o.serialN, "serial-n", 300, "serial: executions, one at a time")
	flag.IntVar(&o.e2eN, "e2e-n", 20000, "e2e: executions (the peers run as many)")
	flag.IntVar(&o.e2eC, "e2e-c", 64, "e2e: concurrent callers, each with one execution in flight (the peers the same)")
	var rates, peers, modes string
	flag.StringVar(&modes, "e2e-modes", "pipelined,closed", "e2e: pipelined (callers invoke without waiting for completions: throughput) and/or closed (each caller one execution in flight)")
	flag.BoolVar(&o.temporalClosed, "temporal-closed", false, "e2e: run Temporal in the closed mode too (by default only pipelined: it takes minutes)")
	flag.StringVar(&rates, "rates", "100,200,500", "latency: offered executions per second (open loop)")
	flag.DurationVar(&o.openD, "open-d", 20*time.Second, "latency: duration of each offered rate")
	flag.StringVar(&peers, "peers", "riversw,river,temporal", "e2e: peers to run beside the platform (riversw: River doing the same work, in serial, e2e and latency; river: River's bare insert → complete; temporal; empty: none)")
	var swRates string
	flag.StringVar(&swRates, "riversw-rates", "200", "latency: the offered rates at which the same-work River peer runs too (of -rates)")
	flag.IntVar(&o.retryN, "retry-n", 200, "retry: executions whose first attempt fails retryably and whose second succeeds")
	flag.StringVar(&o.profileAll, "profile", "", "e2e: directory for CPU profiles of every service over the first -profile-d of the run (serves pprof on each)")
	flag.DurationVar(&o.profileLength, "profile-d", 15*time.Second, "e2e: length of the -profile CPU profiles")
	flag.IntVar(&o.gomaxprocs, "service-gomaxprocs", 0, "GOMAXPROCS of every program of the stack (0: Go's default, the CPUs available to it)")
	flag.StringVar(&o.mqJSON, "mq-json", "", "a bench-mq JSON result to include in the report (make bench passes the one it just measured)")
	flag.Float64Var(&o.rlRate, "ratelimit-rate", 50, "ratelimit: application B's steady invokes per second (open loop)")
	flag.StringVar(&o.rlVia, "ratelimit-flood-via", "both", "ratelimit: how A floods: both (every other call over REST, the others over gRPC), rest or grpc")
	flag.IntVar(&o.rlReps, "ratelimit-r", 3, "ratelimit: passes of the three phases (the report is the pass of the median flooded ÷ alone ratio, every pass printed)")
	flag.DurationVar(&o.rlD, "ratelimit-d", 10*time.Second, "ratelimit: how long B is measured in each phase (alone, while A runs at its limit, while A floods)")
	flag.IntVar(&o.rlCallers, "ratelimit-callers", 32, "ratelimit: application A's flooding callers (half REST, half gRPC) when -ratelimit-flood-rate is 0")
	flag.Float64Var(&o.rlFloodRate, "ratelimit-flood-rate", 1000, "ratelimit: application A's offered invokes per second, open loop (calls not awaited; half REST, half gRPC), so that runs on different machines offer the same flood — the default is 1.3× the 750/s one key reached with no limit (issue 11); 0: closed loop with -ratelimit-callers")
	flag.Float64Var(&o.rlALimit, "ratelimit-a-limit", 10, "ratelimit: application A's invoke limit per second (its catalog entry; burst: a second's worth), and the rate A offers in the at-limit phase")
	flag.BoolVar(&o.rlOff, "ratelimit-off", false, "run the gateway with its default rate limits off (INTEGRATIONS_RATE_LIMIT_INVOKES/READS=0), to measure what the limiter costs on accept")
	flag.StringVar(&o.rlHold, "ratelimit-refusal-delay", "", "the gateway's INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY (how long a call over its limit is held before it is refused; empty: the gateway's default)")
	flag.StringVar(&callers, "callers", "1,16,64", "concurrent callers (closed loop)")
	flag.IntVar(&o.n, "n", 0, "calls per run (0: run for -d instead)")
	flag.DurationVar(&o.duration, "d", 5*time.Second, "duration of a run when -n is 0")
	flag.IntVar(&o.reps, "r", 3, "repetitions of each run; the median req/s is reported")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unreported warm-up run of each workload at each concurrency (0: none)")
	flag.BoolVar(&o.drain, "drain", true, "before each run, wait until the stack has settled every execution and delivered every event")
	flag.DurationVar(&o.drainTimeout, "drain-timeout", 3*time.Minute, "give up waiting for the stack to drain after this long")
	flag.StringVar(&o.out, "out", "", "directory for the JSON result (default <root>/bench/results; \"-\": none)")
	flag.StringVar(&params, "service-db-params", "", "query parameters added to the services' database URL, e.g. pool_max_conns=16 (default: none, as deployed)")
	flag.StringVar(&o.profileDir, "gateway-profile", "", "directory for CPU profiles of the gateway, one per accept run of the first repetition (needs -d; turns on -pprof)")
	flag.BoolVar(&o.pprof, "pprof", false, "serve net/http/pprof on the gateway's metrics address (INTEGRATIONS_PPROF=true)")
	flag.StringVar(&only, "only", "", "run only these workloads: accept/grpc, accept/rest, postgres/pgx, river/pgx (comma-separated; default all)")
	flag.IntVar(&o.maxErrors, "max-errors", 100, "stop a run after this many failed calls")
	flag.BoolVar(&o.keepLogs, "keep-logs", false, "keep the programs' log directory")
	flag.IntVar(&o.peerPool, "peer-pool", 16, "the peers' (raw pgx, River) pool: min(callers, this) connections; 16 is their best on the 2-core dev machine (64 backends do worse)")
	flag.DurationVar(&o.autovacNap, "autovacuum-naptime", 10*time.Second, "when the server's autovacuum is off (as on the dev machines), the bench vacuums and analyzes the tables over autovacuum's thresholds itself, this often (0: not at all: every generic plan stays the one made on the warm-up's nearly empty tables)")
	var without string
	flag.StringVar(&without, "diagnose-without", "", "DIAGNOSIS ONLY: programs not to start (e.g. dispatcher); the figures are then not the platform's")
	flag.Parse()
	var err error
	if o.callers, err = flagx.Ints(callers); err != nil {
		return o, fmt.Errorf("-callers: %w", err)
	}
	if o.reps < 1 || o.n < 0 || (o.n == 0 && o.duration <= 0) {
		return o, errors.New("-r must be positive, and -n positive or -d positive")
	}
	if o.scenarios, err = flagx.Set(scen, "accept", "serial", "e2e", "latency", "retry", "ratelimit"); err != nil {
		return o, fmt.Errorf("-scenarios: %w", err)
	}
	if o.peers, err = flagx.Set(peers, "riversw", "river", "temporal"); err != nil {
		return o, fmt.Errorf("-peers: %w", err)
	}
	if o.e2eModes, err = flagx.Choices(modes, modePipelined, modeClosed); err != nil {
		return o, fmt.Errorf("-e2e-modes: %w", err)
	}
	if o.rates, err = flagx.Floats(rates); err != nil {
		return o, fmt.Errorf("-rates: %w", err)
	}
	if o.swRates, err = flagx.Floats(swRates); err != nil {
		return o, fmt.Errorf("-riversw-rates: %w", err)
	}
	if o.rlRate <= 0 || o.rlD <= 0 || o.rlCallers < 1 || o.rlFloodRate < 0 || o.rlALimit <= 0 {
		return o, errors.New("-ratelimit-rate, -ratelimit-d, -ratelimit-callers and -ratelimit-a-limit must be positive, -ratelimit-flood-rate at least 0")
	}
	if o.rlVia != "both" && o.rlVia != "rest" && o.rlVia != "grpc" {
		return o, fmt.Errorf("-ratelimit-flood-via %q: want both, rest or grpc", o.rlVia)
	}
	if o.e2eN < 1 || o.e2eC < 1 || o.serialN < 1 || o.openD <= 0 {
		return o, errors.New("-e2e-n, -e2e-c, -serial-n and -open-d must be positive")
	}
	if params != "" {
		if o.dbParams, err = url.ParseQuery(params); err != nil {
			return o, fmt.Errorf("-service-db-params: %w", err)
		}
	}
	o.without = flagx.List(without)
	o.only = map[string]bool{}
	for _, s := range flagx.List(only) {
		o.only[s] = true
	}
	if o.profileDir != "" {
		if o.n > 0 {
			return o, errors.New("-gateway-profile needs duration runs (-n 0)")
		}
		o.pprof = true
	}
	return o, nil
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.root == "" {
		if o.root, err = stack.FindRoot(); err != nil {
			return err
		}
	}
	if o.out == "" {
		o.out = filepath.Join(o.root, "bench", "results")
	}
	started := time.Now()

	fmt.Fprintln(os.Stderr, "bench: building the services")
	binDir, err := stack.Build(ctx, o.root, os.Stderr)
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(binDir) }()

	st, err := stack.Start(ctx, stack.Config{
		Root: o.root, BinDir: binDir, DatabaseURL: o.dbURL, Broker: stack.Broker{URL: o.amqpURL},
		DatabaseParams: o.dbParams, GatewayPprof: o.pprof, Pprof: o.profileAll != "", Log: os.Stderr, Without: o.without,
		Env: append(gomaxprocsEnv(o.gomaxprocs), rateLimitEnv(o.rlOff, o.rlHold)...),
	})
	if err != nil {
		return err
	}
	failed := true
	defer func() {
		if failed {
			fmt.Fprint(os.Stderr, st.LogTails())
		}
		var cerr error
		if failed || o.keepLogs {
			cerr = st.CloseKeepLogs()
			fmt.Fprintln(os.Stderr, "bench: logs kept in", st.LogDir)
		} else {
			cerr = st.Close()
		}
		if cerr != nil {
			fmt.Fprintln(os.Stderr, "bench: cleanup:", cerr)
		}
	}()

	machine, err := describeMachine(ctx, st)
	if err != nil {
		return err
	}
	var standIn *autovac.StandIn
	if machine.PGSettings["autovacuum"] == "off" && o.autovacNap > 0 {
		standIn = autovac.Start(ctx, st.DB, o.autovacNap)
	}
	rep := &Report{
		Benchmark: "bench", Started: started.UTC(), Machine: machine,
		Config: Config{
			Scenarios: keys(o.scenarios), Callers: o.callers, N: o.n, Duration: o.duration.String(), Reps: o.reps,
			Warmup: o.warmup.String(), Drain: o.drain, ServiceDBParams: o.dbParams.Encode(), GatewayPprof: o.pprof,
			LogLevel: "info", TimeScale: 1, DiagnoseWithout: o.without, PeerPool: o.peerPool,
			AutovacuumStandIn: autovacText(machine, standIn, o.autovacNap),
		},
	}
	printHeader(os.Stdout, rep)

	if o.scenarios["accept"] {
		rows, err := runAccept(ctx, o, st)
		rep.Rows = append(rep.Rows, rows...)
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	if err := runFlow(ctx, o, st, rep); err != nil && ctx.Err() == nil {
		return err
	}
	// Last: A's admitted executions have no consumer, so their events stay undelivered and the
	// stack would not drain after it.
	if o.scenarios["ratelimit"] && ctx.Err() == nil {
		if err := runRateLimit(ctx, o, st, rep); err != nil && ctx.Err() == nil {
			return err
		}
	}
	if o.mqJSON != "" {
		raw, err := os.ReadFile(o.mqJSON)
		if err != nil {
			return fmt.Errorf("-mq-json: %w", err)
		}
		rep.MQ = json.RawMessage(raw)
	}
	if standIn != nil {
		av := standIn.Stop()
		rep.Config.AutovacuumStandIn += fmt.Sprintf(": %d passes, %d vacuums, %d analyzes", av.Passes, av.Vacuums, av.Analyzes)
		if av.Errors > 0 {
			rep.Config.AutovacuumStandIn += fmt.Sprintf(", %d failed (last: %v)", av.Errors, av.LastErr)
		}
		fmt.Println("autovacuum stand-in" + strings.TrimPrefix(rep.Config.AutovacuumStandIn, "stand-in"))
	}
	rep.Finished = time.Now().UTC()
	fmt.Println()
	if hasAccept(rep) {
		printTable(os.Stdout, rep)
	}
	printFlowTable(os.Stdout, rep)
	if len(rep.Flow) > 0 || rep.Retry != nil {
		rep.Issue13 = issue13(rep)
		printIssue13(os.Stdout, rep.Issue13)
	}
	printRateLimit(os.Stdout, rep)
	printMQ(os.Stdout, rep)
	if ctx.Err() != nil {
		fmt.Println("\ninterrupted: the table holds what was measured before the signal")
	}
	if o.out != "-" && (len(rep.Rows) > 0 || len(rep.Flow) > 0 || rep.RateLimit != nil || rep.Retry != nil) {
		path, err := rep.Write(o.out)
		if err != nil {
			return err
		}
		fmt.Println("\nwrote", path)
	}
	failed = false
	return nil
}

// runAccept measures the accept scenario: for each concurrency, the four workloads, repetition by
// repetition in rotating order, so that drift (table and index growth, autovacuum, a neighbour)
// hits each alike.
func runAccept(ctx context.Context, o options, st *stack.Stack) ([]Row, error) {
	riverSchema := st.Schema + "_river"
	if err := accept.MigrateRiver(ctx, o.dbURL, riverSchema); err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if pool, err := accept.Pool(cctx, o.dbURL, 1); err == nil {
			if _, err := pool.Exec(cctx, "DROP SCHEMA "+riverSchema+" CASCADE"); err != nil {
				fmt.Fprintln(os.Stderr, "bench: drop River schema:", err)
			}
			pool.Close()
		}
	}()
	all := []accept.Workload{accept.Postgres(st, o.peerPool), accept.River(o.dbURL, riverSchema, o.peerPool), accept.GRPC(st), accept.REST(st)}
	var workloads []accept.Workload
	for _, w := range all {
		if len(o.only) == 0 || o.only[w.Scenario+"/"+w.Transport] {
			workloads = append(workloads, w)
		}
	}
	if len(workloads) == 0 {
		return nil, errors.New("-only selects no workload")
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return nil, err
		}
	}

	var rows []Row
	for _, c := range o.callers {
		runs := make([][]load.Result, len(workloads))
		cpus := make([][]map[string]float64, len(workloads))
		for r := -1; r < o.reps; r++ {
			for k := range workloads {
				i := (k + max(r, 0)) % len(workloads) // rotate the order each repetition
				w := workloads[i]
				if ctx.Err() != nil {
					return append(rows, summarize(workloads, c, runs, cpus)...), ctx.Err()
				}
				p := load.Params{Callers: c, N: o.n, Duration: o.duration}
				if r < 0 { // warm-up
					if o.warmup <= 0 {
						continue
					}
					p = load.Params{Callers: c, Duration: o.warmup}
				}
				profile := ""
				if r == 0 && o.profileDir != "" && w.Scenario == "accept" {
					profile = filepath.Join(o.profileDir, fmt.Sprintf("gateway-%s-c%d.pprof", w.Transport, c))
				}
				res, cpu, err := measure(ctx, o, st, w, p, profile)
				if err != nil {
					return append(rows, summarize(workloads, c, runs, cpus)...), err
				}
				label := "warm-up"
				if r >= 0 {
					label = fmt.Sprintf("run %d", r+1)
					runs[i] = append(runs[i], res)
					cpus[i] = append(cpus[i], cpu)
				}
				fmt.Fprintf(os.Stderr, "  %-8s %-4s c=%-3d %-7s %6d calls %6.2fs %7.0f req/s  p50 %6.2fms  p99 %7.2fms  cpu %s\n",
					w.Scenario, w.Transport, c, label, res.Requests, res.Elapsed.Seconds(), res.Rate(),
					ms(res.P50), ms(res.P99), cpuText(cpu))
			}
		}
		rows = append(rows, summarize(workloads, c, runs, cpus)...)
	}
	return rows, nil
}

// measure drains the stack, prepares the workload, runs it (taking a gateway CPU profile meanwhile
// if profile is set) and checks that every program still runs.
func measure(ctx context.Context, o options, st *stack.Stack, w accept.Workload, p load.Params, profile string) (load.Result, map[string]float64, error) {
	if o.drain {
		took, err := st.Drain(ctx, o.drainTimeout)
		if err != nil {
			return load.Result{}, nil, err
		}
		if took > time.Second {
			fmt.Fprintf(os.Stderr, "  (stack drained its backlog in %.1fs)\n", took.Seconds())
		}
	}
	op, release, err := w.Prepare(ctx, p.Callers)
	if err != nil {
		return load.Result{}, nil, fmt.Errorf("%s/%s: %w", w.Scenario, w.Transport, err)
	}
	defer release()
	var profDone chan error
	if profile != "" {
		profDone = make(chan error, 1)
		go func() { profDone <- fetchProfile(ctx, st.PprofURL(), p.Duration, profile) }()
	}
	before := cpuSnapshot(st)
	res := load.Run(ctx, p, o.maxErrors, op)
	cpu := cpuDelta(before, cpuSnapshot(st))
	if profDone != nil {
		if err := <-profDone; err != nil {
			fmt.Fprintln(os.Stderr, "bench: gateway profile:", err)
		} else {
			fmt.Fprintln(os.Stderr, "  (gateway CPU profile:", profile+")")
		}
	}
	if err := st.Check(); err != nil {
		return res, cpu, err
	}
	if ctx.Err() != nil {
		return res, cpu, nil
	}
	if err := res.Check(); err != nil {
		return res, cpu, fmt.Errorf("%s/%s c=%d: %w", w.Scenario, w.Transport, p.Callers, err)
	}
	return res, cpu, nil
}

func summarize(workloads []accept.Workload, c int, runs [][]load.Result, cpus [][]map[string]float64) []Row {
	var rows []Row
	for i, w := range workloads {
		if len(runs[i]) == 0 {
			continue
		}
		s := load.Summarize(runs[i])
		m := s.Median
		row := Row{
			Scenario: w.Scenario, Transport: w.Transport, Callers: c, What: w.What,
			Requests: m.Requests, Seconds: m.Elapsed.Seconds(), Rate: m.Rate(), RateMin: s.Min, RateMax: s.Max,
			P50ms: ms(m.P50), P99ms: ms(m.P99), Errors: s.Errors, Runs: len(s.Runs),
			CPUPerCall: cpuPerCall(cpus[i], runs[i]),
		}
		if s.FirstErr != nil {
			row.FirstError = s.FirstErr.Error()
		}
		rows = append(rows, row)
	}
	fillRatios(rows)
	return rows
}

// The targets of issue 6 for the accept rows.
const (
	targetVsRiver    = 1.0
	targetVsPostgres = 0.7
)

// fillRatios sets each accept row's ratios to the peers at the same concurrency and its verdicts.
func fillRatios(rows []Row) {
	peer := map[string]float64{}
	for _, r := range rows {
		if r.Scenario != "accept" {
			peer[r.Scenario] = r.Rate
		}
	}
	for i := range rows {
		r := &rows[i]
		if r.Scenario != "accept" {
			continue
		}
		if pg := peer["postgres"]; pg > 0 {
			r.VsPostgres = r.Rate / pg
			r.Targets = append(r.Targets, Target{Name: "vs postgres", Want: targetVsPostgres, Got: r.VsPostgres, Pass: r.VsPostgres >= targetVsPostgres})
		}
		if rv := peer["river"]; rv > 0 {
			r.VsRiver = r.Rate / rv
			r.Targets = append(r.Targets, Target{Name: "vs river", Want: targetVsRiver, Got: r.VsRiver, Pass: r.VsRiver >= targetVsRiver})
		}
	}
}

// snapshot is the CPU time of every program of the stack, of the Postgres processes and the
// RabbitMQ node, and of this process (the load generator and the peers' clients).
type snapshot struct {
	byName map[string]map[int]time.Duration
	procs  map[string]time.Duration
}

// cpuSnapshot reads a snapshot.
func cpuSnapshot(st *stack.Stack, extra ...map[string]int) snapshot {
	s := snapshot{byName: procstat.ByName("postgres", "beam.smp"), procs: map[string]time.Duration{}}
	pids := st.PIDs()
	for _, m := range extra {
		maps.Copy(pids, m)
	}
	for name, pid := range pids {
		if d, ok := procstat.CPU(pid); ok {
			s.procs[name] = d
		}
	}
	s.procs["bench"] = procstat.Self()
	return s
}

// cpuDelta is the CPU seconds spent between two snapshots, by process name.
func cpuDelta(before, after snapshot) map[string]float64 {
	out := map[string]float64{}
	for k, d := range procstat.Diff(before.byName, after.byName) {
		out[k] = d.Seconds()
	}
	for k, a := range after.procs {
		if d := a - before.procs[k]; d > 0 {
			out[k] = d.Seconds()
		}
	}
	return out
}

// cpuPerCall is, per process, the CPU time of all the runs of a row divided by their calls, in
// microseconds per call (background work of the stack included: it processes what was accepted).
func cpuPerCall(cpus []map[string]float64, runs []load.Result) map[string]float64 {
	calls := 0
	for _, r := range runs {
		calls += r.Requests
	}
	if calls == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, m := range cpus {
		for k, v := range m {
			out[k] += v
		}
	}
	for k, v := range out {
		out[k] = round1(v * 1e6 / float64(calls))
	}
	return out
}

func cpuText(cpu map[string]float64) string {
	var parts []string
	for _, k := range []string{"gateway", "postgres", "bench", "dispatcher", "execution-consumer", "settlement", "event-router", "dummy-adapter", "beam.smp"} {
		if v := cpu[k]; v >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.1fs", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

// fetchProfile takes a CPU profile of the gateway over d and writes it to path.
func fetchProfile(ctx context.Context, base string, d time.Duration, path string) error {
	secs := max(int((d+time.Second-1)/time.Second), 1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/profile?seconds="+strconv.Itoa(secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %.200s", resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func defaultDBURL() string {
	if u := os.Getenv("INTEGRATIONS_BENCH_DATABASE_URL"); u != "" {
		return u
	}
	if u := os.Getenv("INTEGRATIONS_PG_URL"); u != "" {
		return strings.TrimRight(u, "/") + "/bench?sslmode=disable"
	}
	return "postgres://postgres@127.0.0.1:5432/bench?sslmode=disable"
}

func gomaxprocsEnv(n int) []string {
	if n <= 0 {
		return nil
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(n)}
}

// ms is d in milliseconds, to 0.01 ms.
func ms(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*100) / 100 }

// rateLimitEnv is the gateway's default rate limits in the stack: far above what the stack can do
// here, so that the limiter runs on every call (its cost is in every figure) without capping any
// (the ratelimit scenario gives its flooding application a limit of its own); or, with off, none
// (the limiter then only reads the cached limits and admits).
func rateLimitEnv(off bool, hold string) []string {
	rate := "100000"
	if off {
		rate = "0"
	}
	env := []string{"INTEGRATIONS_RATE_LIMIT_INVOKES=" + rate, "INTEGRATIONS_RATE_LIMIT_INVOKE_BURST=100000",
		"INTEGRATIONS_RATE_LIMIT_READS=" + rate, "INTEGRATIONS_RATE_LIMIT_READ_BURST=100000"}
	if hold != "" {
		env = append(env, "INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY="+hold)
	}
	return env
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

func keys[V any](m map[string]V) []string {
	out := slices.Collect(maps.Keys(m))
	slices.Sort(out)
	return out
}
