// Command temporal measures Temporal as a peer for the end-to-end benchmark:
// N calls, each one workflow running one echo activity, issued by C
// closed-loop callers against an in-process Temporal server
// (go.temporal.io/server/temporaltest, SQLite in memory).
//
// Every call is client.ExecuteWorkflow followed by run.Get; its latency runs
// from the start of ExecuteWorkflow until Get returns. The result is one JSON
// object (see result); human progress goes to stderr.
//
// Worker settings: the defaults of the tuning flags (bestTuning) are the best
// of the settings tried on the 2-core benchmark machine: autoscaling workflow
// and activity task pollers (SDK defaults: initial 5, min 1, max 100) plus
// eager workflow start (StartWorkflowOptions.EnableEagerStart, the worker and
// the callers sharing one client), with eager activities on and every other
// worker option at its SDK default (execution slots 1000, sticky cache 10000).
// Also tried, all slower or with a much longer p99: fixed pollers 2/2 (SDK
// default), 4/4, 8/8 and 16/16; eager activities off; a separate client for
// the callers. README.md has the figures. They are never tuned down: the point
// is to give Temporal its best throughput.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"
)

const (
	taskQueue     = "bench-echo"
	serverVersion = "v1.32.2" // go.temporal.io/server, as pinned in go.mod
)

// EchoWorkflow runs one Echo activity and returns its result.
func EchoWorkflow(ctx workflow.Context, in string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
	})
	var out string
	if err := workflow.ExecuteActivity(ctx, Echo, in).Get(ctx, &out); err != nil {
		return "", err
	}
	return out, nil
}

// Echo returns its input.
func Echo(_ context.Context, in string) (string, error) {
	return in, nil
}

type result struct {
	Peer         string  `json:"peer"`
	What         string  `json:"what"`
	Config       string  `json:"config"`
	N            int     `json:"n"`
	Concurrency  int     `json:"concurrency"`
	Completed    int64   `json:"completed"`
	Errors       int64   `json:"errors"`
	FirstError   string  `json:"first_error"`
	Seconds      float64 `json:"seconds"`
	PerSecond    float64 `json:"per_second"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
}

// tuning holds the worker and start options under test.
type tuning struct {
	wfPollers       int  // MaxConcurrentWorkflowTaskPollers (0 = SDK default, 2)
	actPollers      int  // MaxConcurrentActivityTaskPollers (0 = SDK default, 2)
	autoscale       bool // use PollerBehaviorAutoscaling instead of fixed pollers
	maxWFExec       int  // MaxConcurrentWorkflowTaskExecutionSize (0 = default 1000)
	maxActExec      int  // MaxConcurrentActivityExecutionSize (0 = default 1000)
	stickyCache     int  // worker.SetStickyWorkflowCacheSize (0 = default 10000)
	noEagerActivity bool // DisableEagerActivities
	eagerStart      bool // StartWorkflowOptions.EnableEagerStart
	separateClient  bool // callers use their own client (gRPC connection) apart from the worker's
}

// bestTuning is the best of the settings tried on the 2-core machine (see
// README.md): autoscaling pollers and eager workflow start, everything else
// at the SDK defaults. The flags default to it.
var bestTuning = tuning{autoscale: true, eagerStart: true}

func (t tuning) workerOptions() worker.Options {
	o := worker.Options{
		MaxConcurrentWorkflowTaskExecutionSize: t.maxWFExec,
		MaxConcurrentActivityExecutionSize:     t.maxActExec,
		DisableEagerActivities:                 t.noEagerActivity,
	}
	if t.autoscale {
		o.WorkflowTaskPollerBehavior = worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{})
		o.ActivityTaskPollerBehavior = worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{})
	} else {
		o.MaxConcurrentWorkflowTaskPollers = t.wfPollers
		o.MaxConcurrentActivityTaskPollers = t.actPollers
	}
	return o
}

func (t tuning) String() string {
	def := func(v, d int) int {
		if v == 0 {
			return d
		}
		return v
	}
	pollers := fmt.Sprintf("MaxConcurrentWorkflowTaskPollers=%d MaxConcurrentActivityTaskPollers=%d",
		def(t.wfPollers, 2), def(t.actPollers, 2))
	if t.autoscale {
		pollers = "WorkflowTaskPollerBehavior=ActivityTaskPollerBehavior=Autoscaling(initial 5, min 1, max 100)"
	}
	note := "(this program's defaults: the best of the settings tried on the 2-core machine, see bench/temporal/README.md)"
	if t != bestTuning {
		note = "(NOT this program's defaults, which are the best settings tried: a tuning run)"
	}
	return fmt.Sprintf("%s MaxConcurrentWorkflowTaskExecutionSize=%d MaxConcurrentActivityExecutionSize=%d "+
		"StickyWorkflowCacheSize=%d DisableEagerActivities=%t EnableEagerStart=%t SeparateCallerClient=%t %s",
		pollers, def(t.maxWFExec, 1000), def(t.maxActExec, 1000), def(t.stickyCache, 10000),
		t.noEagerActivity, t.eagerStart, t.separateClient, note)
}

// stderrLogger is an SDK logger that keeps only errors, on stderr.
type stderrLogger struct{}

func (stderrLogger) Debug(string, ...any) {}
func (stderrLogger) Info(string, ...any)  {}
func (stderrLogger) Warn(string, ...any)  {}
func (stderrLogger) Error(msg string, kv ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"temporal sdk error:", msg}, kv...)...)
}

var _ sdklog.Logger = stderrLogger{}

func main() {
	var (
		n       = flag.Int("n", 20000, "number of measured calls")
		c       = flag.Int("c", 64, "concurrent callers (closed loop)")
		warmup  = flag.Int("warmup", 200, "calls made before measuring (not recorded)")
		out     = flag.String("json", "-", `path to write the result JSON ("-" = stdout)`)
		timeout = flag.Duration("timeout", 30*time.Minute, "overall time limit")
		piped   = flag.Bool("pipelined", false, "callers start the next workflow without waiting for the result of the last (the wait runs in the background); default: one call in flight per caller")
		cpuProf = flag.String("cpuprofile", "", "write a CPU profile of the measured part to this file")
		t       tuning
	)
	// Tuning flags. The defaults (autoscaling pollers + eager workflow start,
	// every other option at its SDK default) are the best of the settings
	// tried on the 2-core machine; see README.md for the figures.
	flag.BoolVar(&t.autoscale, "autoscale", bestTuning.autoscale, "autoscaling poller behaviour (SDK defaults: initial 5, min 1, max 100) for workflow and activity task pollers; false = fixed poller counts below")
	flag.IntVar(&t.wfPollers, "wf-pollers", bestTuning.wfPollers, "worker MaxConcurrentWorkflowTaskPollers when -autoscale=false (0 = SDK default, 2)")
	flag.IntVar(&t.actPollers, "act-pollers", bestTuning.actPollers, "worker MaxConcurrentActivityTaskPollers when -autoscale=false (0 = SDK default, 2)")
	flag.IntVar(&t.maxWFExec, "max-wf-exec", bestTuning.maxWFExec, "worker MaxConcurrentWorkflowTaskExecutionSize (0 = SDK default, 1000)")
	flag.IntVar(&t.maxActExec, "max-act-exec", bestTuning.maxActExec, "worker MaxConcurrentActivityExecutionSize (0 = SDK default, 1000)")
	flag.IntVar(&t.stickyCache, "sticky-cache", bestTuning.stickyCache, "sticky workflow cache size (0 = SDK default, 10000)")
	flag.BoolVar(&t.noEagerActivity, "no-eager-activities", bestTuning.noEagerActivity, "worker DisableEagerActivities (eager activities are on by default)")
	flag.BoolVar(&t.eagerStart, "eager-start", bestTuning.eagerStart, "StartWorkflowOptions.EnableEagerStart (the first workflow task goes straight to the in-process worker)")
	flag.BoolVar(&t.separateClient, "separate-client", bestTuning.separateClient, "callers use a client (gRPC connection) of their own instead of sharing the worker's")
	flag.Parse()
	if t.autoscale && (t.wfPollers != 0 || t.actPollers != 0) {
		fmt.Fprintln(os.Stderr, "temporal: -wf-pollers/-act-pollers are ignored with -autoscale (set -autoscale=false)")
		t.wfPollers, t.actPollers = 0, 0
	}

	if *n <= 0 || *c <= 0 || *warmup < 0 {
		fatalf("-n and -c must be > 0 and -warmup >= 0")
	}
	res, err := run(*n, *c, *warmup, *timeout, *cpuProf, t, *piped)
	if err != nil {
		fatalf("%v", err)
	}
	if err := writeJSON(*out, res); err != nil {
		fatalf("writing result: %v", err)
	}
	if res.Errors*100 > int64(res.N) {
		fatalf("%d of %d calls failed (> 1%%); first error: %s", res.Errors, res.N, res.FirstError)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/temporal: "+format+"\n", args...)
	os.Exit(1)
}

func run(n, c, warmup int, timeout time.Duration, cpuProf string, t tuning, pipelined bool) (res *result, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	if t.stickyCache > 0 {
		worker.SetStickyWorkflowCacheSize(t.stickyCache)
	}

	setupStart := time.Now()
	// temporaltest panics on setup failures when it has no testing.T.
	ts, err := startServer()
	if err != nil {
		return nil, err
	}
	defer stopServer(ts)

	// The worker is stopped by stopServer: TestServer.Stop stops its workers
	// before the clients and the server.
	ts.NewWorkerWithOptions(taskQueue, func(r worker.Registry) {
		r.RegisterWorkflow(EchoWorkflow)
		r.RegisterActivity(Echo)
	}, t.workerOptions())

	cl := ts.GetDefaultClient()
	if t.separateClient {
		cl = ts.NewClientWithOptions(client.Options{Logger: stderrLogger{}})
	}
	fmt.Fprintf(os.Stderr, "temporal: server and worker up in %s (namespace %s, %s)\n",
		time.Since(setupStart).Round(time.Millisecond), ts.GetDefaultNamespace(), t)

	b := &bench{cl: cl, eagerStart: t.eagerStart}
	if warmup > 0 {
		fmt.Fprintf(os.Stderr, "temporal: warm-up, %d calls at concurrency %d\n", warmup, c)
		wr := b.loop(ctx, warmup, c, "w", nil)
		if wr.errors > 0 {
			fmt.Fprintf(os.Stderr, "temporal: warm-up had %d errors; first: %s\n", wr.errors, wr.firstErr)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("warm-up: %w", ctx.Err())
		}
	}

	b.pipelined = pipelined
	fmt.Fprintf(os.Stderr, "temporal: measuring %d calls at concurrency %d (pipelined %t)\n", n, c, pipelined)
	lat := make([]time.Duration, n)
	if cpuProf != "" {
		f, err := os.Create(cpuProf)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
	}
	cpu0 := cpuSeconds()
	start := time.Now()
	mr := b.loop(ctx, n, c, "m", lat)
	elapsed := time.Since(start)
	cpu := cpuSeconds() - cpu0
	if cpuProf != "" {
		pprof.StopCPUProfile()
	}

	ok := lat[:0]
	for _, d := range lat {
		if d > 0 {
			ok = append(ok, d)
		}
	}
	sort.Slice(ok, func(i, j int) bool { return ok[i] < ok[j] })
	res = &result{
		Peer: "temporal",
		What: "temporaltest in-process server (" + serverVersion +
			"), one workflow running one echo activity per call, ExecuteWorkflow + Get" + modeText(pipelined),
		Config:       t.String(),
		N:            n,
		Concurrency:  c,
		Completed:    mr.completed,
		Errors:       mr.errors,
		FirstError:   mr.firstErr,
		Seconds:      round(elapsed.Seconds(), 3),
		PerSecond:    round(float64(mr.completed)/elapsed.Seconds(), 1),
		P50Ms:        pct(ok, 0.50),
		P99Ms:        pct(ok, 0.99),
		CPUSeconds:   round(cpu, 2),
		PeakRSSBytes: peakRSS(),
	}
	if len(ok) > 0 {
		res.MaxMs = ms(ok[len(ok)-1])
	}
	if mr.completed+mr.errors < int64(n) {
		// Calls left unissued (time limit): count them as errors.
		res.Errors = int64(n) - mr.completed
		if res.FirstError == "" {
			res.FirstError = fmt.Sprintf("stopped before all calls were made: %v", ctx.Err())
		}
	}
	fmt.Fprintf(os.Stderr, "temporal: %d calls in %.1fs = %.1f/s, p50 %.1fms p99 %.1fms, %d errors\n",
		res.Completed, res.Seconds, res.PerSecond, res.P50Ms, res.P99Ms, res.Errors)
	return res, nil
}

func startServer() (ts *temporaltest.TestServer, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("starting temporal test server: %v", r)
		}
	}()
	ts = temporaltest.NewServer(
		temporaltest.WithBaseClientOptions(client.Options{Logger: stderrLogger{}}),
	)
	return ts, nil
}

// stopServer stops the worker(s), the clients and the server. TestServer.Stop
// logs a server stop error through its (nil) testing.T, which panics: recover
// and report it instead.
func stopServer(ts *temporaltest.TestServer) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "temporal: error stopping server: %v\n", r)
		}
	}()
	start := time.Now()
	ts.Stop()
	fmt.Fprintf(os.Stderr, "temporal: worker and server stopped in %s\n", time.Since(start).Round(time.Millisecond))
}

type bench struct {
	cl         client.Client
	eagerStart bool
	// pipelined: a caller starts its next workflow as soon as ExecuteWorkflow answered, and
	// waits for the result (run.Get) in the background; otherwise each caller has one call in
	// flight.
	pipelined bool
	seq       atomic.Int64
}

type loopResult struct {
	completed, errors int64
	firstErr          string
}

// loop makes n calls from c closed-loop callers. If lat is non-nil, the
// latency of call i (successful calls only) is stored in lat[i].
func (b *bench) loop(ctx context.Context, n, c int, tag string, lat []time.Duration) loopResult {
	var (
		next      atomic.Int64
		completed atomic.Int64
		failed    atomic.Int64
		errOnce   sync.Once
		firstErr  string
		wg        sync.WaitGroup
	)
	for g := 0; g < c; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				done := func(d time.Duration, err error) {
					if err != nil {
						failed.Add(1)
						errOnce.Do(func() { firstErr = err.Error() })
						return
					}
					completed.Add(1)
					if lat != nil {
						lat[i] = d
					}
				}
				start := time.Now()
				wait, err := b.start(ctx, tag)
				if err != nil {
					done(0, err)
					continue
				}
				if b.pipelined {
					wg.Add(1)
					go func() {
						defer wg.Done()
						done(wait(start))
					}()
					continue
				}
				done(wait(start))
			}
		}()
	}
	wg.Wait()
	return loopResult{completed: completed.Load(), errors: failed.Load(), firstErr: firstErr}
}

// start starts one workflow and returns the wait for its result, which gives the call's latency
// from start.
func (b *bench) start(ctx context.Context, tag string) (func(start time.Time) (time.Duration, error), error) {
	seq := b.seq.Add(1)
	id := fmt.Sprintf("echo-%s-%d", tag, seq)
	in := fmt.Sprintf("payload-%d", seq)
	run, err := b.cl.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:               id,
		TaskQueue:        taskQueue,
		EnableEagerStart: b.eagerStart,
	}, EchoWorkflow, in)
	if err != nil {
		return nil, fmt.Errorf("ExecuteWorkflow: %w", err)
	}
	return func(start time.Time) (time.Duration, error) {
		var out string
		if err := run.Get(ctx, &out); err != nil {
			return 0, fmt.Errorf("Get: %w", err)
		}
		d := time.Since(start)
		if out != in {
			return 0, fmt.Errorf("echo mismatch: sent %q, got %q", in, out)
		}
		if d <= 0 {
			d = 1 // keep "recorded" distinguishable from "failed" (0)
		}
		return d, nil
	}, nil
}

func modeText(pipelined bool) string {
	if pipelined {
		return " (pipelined: Get in the background)"
	}
	return " (one call in flight per caller)"
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// peakRSS is the process's peak resident set size in bytes (Linux reports
// ru_maxrss in KiB).
func peakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return int64(ru.Maxrss) * 1024
}

func pct(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return ms(sorted[i])
}

func ms(d time.Duration) float64 { return round(float64(d)/1e6, 3) }

func round(v float64, places int) float64 {
	p := 1.0
	for i := 0; i < places; i++ {
		p *= 10
	}
	if v < 0 {
		return -float64(int64(-v*p+0.5)) / p
	}
	return float64(int64(v*p+0.5)) / p
}

func writeJSON(path string, res *result) error {
	var w io.Writer = os.Stdout
	if path != "-" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	enc := json.NewEncoder(w)
	if err := enc.Encode(res); err != nil {
		return err
	}
	if f, ok := w.(*os.File); ok && f != os.Stdout {
		return f.Sync()
	}
	return nil
}
