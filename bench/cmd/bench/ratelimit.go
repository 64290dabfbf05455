package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/bench/internal/procstat"
	"github.com/integrations-platform/integrations/e2e/stack"
	"github.com/integrations-platform/integrations/pkg/catalog"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// RateLimitResult is the ratelimit scenario (issue 11): application B's accept latency under a
// light steady load in three phases: alone; while application A runs at exactly its invoke limit
// (its admitted load, nothing refused); and while A floods the gateway far past that limit. The
// second phase separates what A's admitted work costs B from what the refusals add. A runs on
// connections of its own (B's gRPC connection is not shared with it).
type RateLimitResult struct {
	// A's limit (invokes per second, burst) and its flood, half over REST and half over gRPC,
	// ignoring Retry-After as a hostile client would: open loop at AOffered calls a second, not
	// awaited (the same flood whatever the machine), or, if AOffered is 0, ACallers each invoking
	// again as soon as answered.
	ALimit   float64 `json:"a_invokes_per_s"`
	ABurst   int     `json:"a_invoke_burst"`
	AOffered float64 `json:"a_offered_per_s,omitempty"`
	ACallers int     `json:"a_callers,omitempty"`
	// ACalls is A's calls answered during the flood (admitted + refused + other).
	ACalls int64 `json:"a_calls"`
	// AAnsweredPerS is A's calls answered a second while B was measured: the flood the gateway
	// met. The flooder runs at the lowest CPU priority, so on a busy machine it could fall
	// behind its offered rate; the target needs at least 90 % of it.
	AAnsweredPerS float64 `json:"a_answered_per_s_during_b"`
	// Hold is the gateway's INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY ("": its default).
	Hold string `json:"refusal_delay,omitempty"`
	// Via is how A floods: "both" (every other call over REST), "rest" or "grpc".
	Via     string  `json:"a_flood_via"`
	Seconds float64 `json:"seconds"`
	// What A got during the flood: admitted (202 / pending), refused (429 / RESOURCE_EXHAUSTED),
	// other answers.
	AAdmitted int64  `json:"a_admitted"`
	ARefused  int64  `json:"a_refused"`
	AOther    int64  `json:"a_other"`
	AFirstErr string `json:"a_first_other,omitempty"`
	// Refusals that said when to retry: REST with a Retry-After of whole seconds ≥ 1, gRPC with
	// a RetryInfo of a positive delay.
	ARefusedREST int64 `json:"a_refused_rest"`
	ARetryAfter  int64 `json:"a_refused_rest_with_retry_after"`
	ARefusedGRPC int64 `json:"a_refused_grpc"`
	ARetryInfo   int64 `json:"a_refused_grpc_with_retry_info"`
	// AAtLimit is what A got while it ran open loop at exactly its limit (offered = ALimit):
	// nothing should be refused.
	AAtLimit aTally `json:"a_at_limit"`
	// B: async invokes over gRPC, open loop at BRate per second, in each phase.
	BRate    float64 `json:"b_offered_per_s"`
	BIdle    FlowRow `json:"b_idle"`
	BAtLimit FlowRow `json:"b_a_at_limit"`
	BFlooded FlowRow `json:"b_flooded"`
	// Ratio is B's p99 flooded ÷ alone (issue 11's target); RatioAtLimit at-limit ÷ alone (what
	// A's admitted load costs B); RatioVsAtLimit flooded ÷ at-limit (what the refusals add).
	Ratio          float64 `json:"b_p99_flooded_vs_idle"`
	RatioAtLimit   float64 `json:"b_p99_a_at_limit_vs_idle"`
	RatioVsAtLimit float64 `json:"b_p99_flooded_vs_a_at_limit"`
	// Cores each process used (CPU seconds ÷ wall seconds) during B's runs in each phase
	// ("bench" is the load generator: B and A's callers, on the same cores as the stack).
	CoresIdle    map[string]float64 `json:"cores_idle"`
	CoresAtLimit map[string]float64 `json:"cores_a_at_limit"`
	CoresFlooded map[string]float64 `json:"cores_flooded"`
	// GatewayUsPerRefusal is the gateway's extra CPU while flooded ÷ A's calls (REST and gRPC).
	GatewayUsPerRefusal float64 `json:"gateway_cpu_us_per_flood_call"`
	// LoadAvg is the host's 1-minute load average before and after the scenario: the host may be
	// shared, and B's latency depends on what else runs.
	LoadAvg [2]string `json:"loadavg_before_after"`
	// Stall is the host's CPU pressure in each phase (alone, at limit, flooded): the time, in ms
	// per second, that some runnable task waited for a CPU (/proc/pressure/cpu "some"; -1 where
	// the kernel does not report it). Most of B's latency under load is that wait.
	Stall [3]float64 `json:"cpu_stall_ms_per_s"`
	// Passes are every pass's figures; the fields above are those of the pass of the median
	// Ratio. Pooled are B's p99 over the calls of every pass in each phase, and PooledRatio the
	// target's figure: flooded ÷ alone over them — a p99 of one pass is its few slowest calls,
	// and a scheduling hiccup of the shared machine moves it by itself.
	Passes           []RateLimitPass    `json:"passes,omitempty"`
	PooledP99ms      [3]float64         `json:"b_p99_ms_pooled"`
	PooledCalls      [3]int             `json:"b_calls_pooled"`
	PooledRatio      float64            `json:"b_p99_flooded_vs_idle_pooled"`
	PooledRatioAtLim float64            `json:"b_p99_a_at_limit_vs_idle_pooled"`
	lats             [3][]time.Duration // B's latencies in each phase
	Target           Target             `json:"target"`
}

// RateLimitPass is one pass of the ratelimit scenario's three phases.
type RateLimitPass struct {
	BIdleP99ms     float64    `json:"b_idle_p99_ms"`
	BAtLimitP99ms  float64    `json:"b_a_at_limit_p99_ms"`
	BFloodedP99ms  float64    `json:"b_flooded_p99_ms"`
	Ratio          float64    `json:"b_p99_flooded_vs_idle"`
	RatioAtLimit   float64    `json:"b_p99_a_at_limit_vs_idle"`
	RatioVsAtLimit float64    `json:"b_p99_flooded_vs_a_at_limit"`
	Stall          [3]float64 `json:"cpu_stall_ms_per_s"`
	AAnsweredPerS  float64    `json:"a_answered_per_s_during_b"`
}

// aTally counts application A's answers in one phase.
type aTally struct {
	Admitted    int64  `json:"admitted"`
	Refused     int64  `json:"refused"`
	Other       int64  `json:"other"`
	RefusedREST int64  `json:"refused_rest"`
	RetryAfter  int64  `json:"refused_rest_with_retry_after"`
	RefusedGRPC int64  `json:"refused_grpc"`
	RetryInfo   int64  `json:"refused_grpc_with_retry_info"`
	FirstErr    string `json:"first_other,omitempty"`
}

func (t *aTally) calls() int64 { return t.Admitted + t.Refused + t.Other }

// other counts an answer that was neither an admission nor a refusal, keeping the first.
func (t *aTally) other(err error) {
	t.Other++
	if t.FirstErr == "" {
		t.FirstErr = err.Error()
	}
}

// Targets of the ratelimit scenario.
const targetFloodP99Ratio = 2.0

// runRateLimit adds application A with a small invoke limit to the stack's catalog, measures B
// (the dev application, at the deployment's defaults) alone, then while A runs at its limit, then
// while A floods.
func runRateLimit(ctx context.Context, o options, st *stack.Stack, rep *Report) error {
	aLimit := o.rlALimit
	aBurst := max(1, int(math.Ceil(aLimit))) // a second's worth, as the deployment's defaults
	keyBytes := make([]byte, 16)
	_, _ = rand.Read(keyBytes)
	aKey := "flood_" + hex.EncodeToString(keyBytes)
	limit, burst := aLimit, aBurst
	if err := catalog.Apply(ctx, st.DB, &catalog.Catalog{Applications: []catalog.Application{{
		ID: "flood-app", Name: "ratelimit bench: the flooding application", APIKey: aKey,
		RateLimits: &catalog.RateLimits{InvokesPerSecond: &limit, InvokeBurst: &burst},
	}}}); err != nil {
		return fmt.Errorf("ratelimit: add the flooding application: %w", err)
	}
	if _, err := st.Drain(ctx, o.drainTimeout); err != nil {
		return err
	}

	conn, err := st.Dial("gateway", "")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	client := gatewayv1.NewGatewayServiceClient(conn)
	p, err := structpb.NewStruct(map[string]any{"bench": "ratelimit"})
	if err != nil {
		return err
	}
	invokeOn := func(ctx context.Context, client gatewayv1.GatewayServiceClient, key string) error {
		resp, err := client.InvokeCapability(grpcx.WithBearer(ctx, key),
			&gatewayv1.InvokeCapabilityRequest{Capability: stack.Capability, Mode: executionv1.Mode_MODE_ASYNC, Payload: p})
		if err != nil {
			return err
		}
		if s := resp.GetExecution().GetStatus(); s != executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING {
			return fmt.Errorf("answered %v, want pending", s)
		}
		return nil
	}
	n := int(o.rlRate * o.rlD.Seconds())
	what := fmt.Sprintf("B: async invoke over gRPC, open loop at %.0f/s (answered pending)", o.rlRate)
	// measureB measures B for -ratelimit-d, with each process's cores over that time.
	// A's process, if running, is counted as "flooder".
	var stall float64 // the CPU pressure over the last measureB
	measureB := func(phase string, a *flooder) (FlowRow, load.Result, map[string]float64) {
		snap := func() snapshot {
			s := cpuSnapshot(st)
			if a != nil {
				if d, ok := procstat.CPU(a.cmd.Process.Pid); ok {
					s.procs["flooder"] = d
				}
			}
			return s
		}
		cpu0, stall0, t0 := snap(), cpuStall(), time.Now()
		r := load.RunOpen(ctx, load.OpenParams{Rate: o.rlRate, Duration: o.rlD},
			func(ctx context.Context, _ int, _ int64) error { return invokeOn(ctx, client, st.APIKey) })
		cpu := cpuDelta(cpu0, snap())
		stall = -1
		if stall1 := cpuStall(); stall0 >= 0 && stall1 >= 0 {
			stall = round1(float64(stall1-stall0) / 1e3 / time.Since(t0).Seconds())
		}
		row := rowOf("ratelimit", "integrations", what+", "+phase, 0, o.rlRate, n, r)
		printFlowRow(os.Stderr, row)
		return row, r, cpu
	}

	// runA starts A in a process of its own (flood.go): open loop at rate calls a second (0:
	// closed loop with -ratelimit-callers).
	runA := func(rate float64) (*flooder, error) {
		return startFlooder(ctx, floodConfig{GRPCAddr: st.Addrs["gateway"], RESTURL: st.RESTURL, Key: aKey,
			Rate: rate, Callers: o.rlCallers, MaxD: o.rlD + 30*time.Second, Via: o.rlVia})
	}

	// pass measures the three phases once.
	pass := func() (*RateLimitResult, error) {
		res := &RateLimitResult{ALimit: aLimit, ABurst: aBurst, AOffered: o.rlFloodRate, BRate: o.rlRate, Hold: o.rlHold, Via: o.rlVia}
		load0 := loadAvg()

		// Phase 1: B alone.
		fmt.Fprintf(os.Stderr, "bench: ratelimit: B alone at %.0f invokes/s for %s\n", o.rlRate, o.rlD)
		var idle load.Result
		var cpuIdle map[string]float64
		res.BIdle, idle, cpuIdle = measureB("alone", nil)
		res.lats[0] = idle.Latencies
		res.Stall[0] = stall
		res.CoresIdle = cores(cpuIdle, idle.Elapsed)

		// Phase 2: B while A offers exactly its limit, open loop: A's admitted load without refusals.
		fmt.Fprintf(os.Stderr, "bench: ratelimit: B again while A runs at its limit (%.0f calls/s, open loop)\n", aLimit)
		atA, err := runA(aLimit)
		if err != nil {
			return nil, err
		}
		defer atA.kill()
		time.Sleep(time.Second) // let A reach its pace before B is measured
		var atLimit load.Result
		var cpuAt map[string]float64
		res.BAtLimit, atLimit, cpuAt = measureB("while A runs at its limit", atA)
		res.lats[1] = atLimit.Latencies
		res.Stall[1] = stall
		if res.AAtLimit, err = atA.stop(); err != nil {
			return nil, err
		}
		res.CoresAtLimit = cores(cpuAt, atLimit.Elapsed)
		fmt.Fprintf(os.Stderr, "bench: ratelimit: A at its limit: %d admitted, %d refused, %d other\n",
			res.AAtLimit.Admitted, res.AAtLimit.Refused, res.AAtLimit.Other)

		// Phase 3: B while A floods.
		if o.rlFloodRate == 0 {
			res.ACallers = o.rlCallers
			fmt.Fprintf(os.Stderr, "bench: ratelimit: B again while A floods with %d callers (limit %.0f/s)\n", o.rlCallers, aLimit)
		} else {
			fmt.Fprintf(os.Stderr, "bench: ratelimit: B again while A floods at %.0f calls/s, open loop (limit %.0f/s)\n", o.rlFloodRate, aLimit)
		}
		floodStart := time.Now()
		floodA, err := runA(o.rlFloodRate)
		if err != nil {
			return nil, err
		}
		defer floodA.kill()
		// Let the flood reach its pace (and spend A's burst) before B is measured.
		time.Sleep(time.Second)
		profiled := profileServices(ctx, o, st)
		before, err := floodA.tally()
		if err != nil {
			return nil, err
		}
		var flooded load.Result
		var cpuFlooded map[string]float64
		res.BFlooded, flooded, cpuFlooded = measureB("while A floods", floodA)
		res.lats[2] = flooded.Latencies
		res.Stall[2] = stall
		after, err := floodA.tally()
		if err != nil {
			return nil, err
		}
		floodCalls := after.calls() - before.calls()
		if flooded.Elapsed > 0 {
			res.AAnsweredPerS = round1(float64(floodCalls) / flooded.Elapsed.Seconds())
		}
		flood, err := floodA.stop()
		if err != nil {
			return nil, err
		}
		profiled()
		res.Seconds = time.Since(floodStart).Seconds()
		res.LoadAvg = [2]string{load0, loadAvg()}
		res.CoresFlooded = cores(cpuFlooded, flooded.Elapsed)
		if floodCalls > 0 {
			res.GatewayUsPerRefusal = round1((cpuFlooded["gateway"] - cpuIdle["gateway"]*flooded.Elapsed.Seconds()/idle.Elapsed.Seconds()) / float64(floodCalls) * 1e6)
		}
		res.AAdmitted, res.ARefused, res.AOther, res.AFirstErr = flood.Admitted, flood.Refused, flood.Other, flood.FirstErr
		res.ARefusedREST, res.ARetryAfter, res.ARefusedGRPC, res.ARetryInfo = flood.RefusedREST, flood.RetryAfter, flood.RefusedGRPC, flood.RetryInfo
		res.ACalls = flood.calls()
		if res.BIdle.P99ms > 0 {
			res.Ratio = res.BFlooded.P99ms / res.BIdle.P99ms
			res.RatioAtLimit = res.BAtLimit.P99ms / res.BIdle.P99ms
		}
		if res.BAtLimit.P99ms > 0 {
			res.RatioVsAtLimit = res.BFlooded.P99ms / res.BAtLimit.P99ms
		}
		return res, nil
	}

	// The phases are measured -ratelimit-r times; the report is the pass of the median ratio,
	// with every pass's figures beside it: a p99 of a few hundred calls on a shared machine moves
	// by itself from one run to the next.
	var passes []*RateLimitResult
	for i := range max(o.rlReps, 1) {
		fmt.Fprintf(os.Stderr, "bench: ratelimit: pass %d of %d\n", i+1, max(o.rlReps, 1))
		res, err := pass()
		if err != nil {
			return err
		}
		passes = append(passes, res)
	}
	sorted := slices.Clone(passes)
	slices.SortFunc(sorted, func(a, b *RateLimitResult) int { return cmp.Compare(a.Ratio, b.Ratio) })
	res := sorted[len(sorted)/2]
	for _, p := range passes {
		res.Passes = append(res.Passes, RateLimitPass{BIdleP99ms: p.BIdle.P99ms, BAtLimitP99ms: p.BAtLimit.P99ms,
			BFloodedP99ms: p.BFlooded.P99ms, Ratio: round2(p.Ratio), RatioAtLimit: round2(p.RatioAtLimit),
			RatioVsAtLimit: round2(p.RatioVsAtLimit), Stall: p.Stall, AAnsweredPerS: p.AAnsweredPerS})
	}
	for phase := range 3 {
		var pooled []time.Duration
		for _, p := range passes {
			pooled = append(pooled, p.lats[phase]...)
		}
		slices.Sort(pooled)
		res.PooledP99ms[phase], res.PooledCalls[phase] = ms(load.Percentile(pooled, 99)), len(pooled)
	}
	if res.PooledP99ms[0] > 0 {
		res.PooledRatio = round2(res.PooledP99ms[2] / res.PooledP99ms[0])
		res.PooledRatioAtLim = round2(res.PooledP99ms[1] / res.PooledP99ms[0])
	}
	// The flood must have been met: an open-loop flooder that fell behind its rate measured less.
	delivered := true
	for _, p := range passes {
		if o.rlFloodRate > 0 && p.AAnsweredPerS < 0.9*o.rlFloodRate {
			delivered = false
		}
	}
	res.Target = Target{Name: "B p99 flooded ÷ idle at most (B's calls of every pass pooled; the flood delivered)", Want: targetFloodP99Ratio, Got: res.PooledRatio,
		Pass: delivered && res.PooledRatio > 0 && res.PooledRatio <= targetFloodP99Ratio}
	rep.RateLimit = res
	return st.Check()
}

// printRateLimit prints the ratelimit scenario's figures.
func printRateLimit(w io.Writer, rep *Report) {
	r := rep.RateLimit
	if r == nil {
		return
	}
	hold := r.Hold
	if hold == "" {
		hold = "the gateway's default"
	}
	flood := fmt.Sprintf("%.0f calls/s offered, open loop", r.AOffered)
	if r.AOffered == 0 {
		flood = fmt.Sprintf("%d callers, closed loop", r.ACallers)
	}
	via := "half REST, half gRPC"
	if r.Via != "both" && r.Via != "" {
		via = "all over " + r.Via
	}
	fmt.Fprintf(w, "\nRate limits: A floods (%s, %s, own process and connections, ignoring Retry-After) past its limit of %.0f invokes/s (burst %d); B invokes at %.0f/s; refusal delay %s\n",
		flood, via, r.ALimit, r.ABurst, r.BRate, hold)
	a := r.AAtLimit
	fmt.Fprintf(w, "A at its limit (%.0f calls/s offered, open loop): %d admitted, %d refused, %d other%s\n",
		r.ALimit, a.Admitted, a.Refused, a.Other, firstOf(a.FirstErr))
	fmt.Fprintf(w, "A flooding over %.1fs: %d calls answered (%.0f/s; offered %.0f/s), %d admitted (%.1f/s), %d refused (%.0f/s), %d other%s\n",
		r.Seconds, r.ACalls, float64(r.ACalls)/r.Seconds, r.AOffered, r.AAdmitted, float64(r.AAdmitted)/r.Seconds,
		r.ARefused, float64(r.ARefused)/r.Seconds, r.AOther, firstOf(r.AFirstErr))
	fmt.Fprintf(w, "A's refusals while flooding saying when to retry: REST %d of %d with Retry-After ≥ 1s, gRPC %d of %d with RetryInfo\n",
		r.ARetryAfter, r.ARefusedREST, r.ARetryInfo, r.ARefusedGRPC)
	for _, b := range []struct {
		name string
		row  FlowRow
	}{{"alone", r.BIdle}, {"while A at limit", r.BAtLimit}, {"while A floods", r.BFlooded}} {
		fmt.Fprintf(w, "B %-17s %d done, %d errors, p50 %.2fms, p99 %.2fms\n", b.name+":", b.row.Completed, b.row.Errors, b.row.P50ms, b.row.P99ms)
	}
	fmt.Fprintf(w, "cores used, B alone:          %s\n", kvText(r.CoresIdle, "%.2f"))
	fmt.Fprintf(w, "cores used, while A at limit: %s\n", kvText(r.CoresAtLimit, "%.2f"))
	fmt.Fprintf(w, "cores used, while A floods:   %s\n", kvText(r.CoresFlooded, "%.2f"))
	fmt.Fprintf(w, "host load average (1 min) before / after: %s / %s\n", r.LoadAvg[0], r.LoadAvg[1])
	fmt.Fprintf(w, "host CPU stall (/proc/pressure/cpu some, ms/s), alone / at limit / flooded: %.0f / %.0f / %.0f\n", r.Stall[0], r.Stall[1], r.Stall[2])
	fmt.Fprintf(w, "gateway CPU added by the flood ÷ its calls (the admitted ones' work included): %.1f µs\n", r.GatewayUsPerRefusal)
	fmt.Fprintf(w, "B p99 at limit ÷ alone: %.2f× (what A's admitted load costs B)\n", r.RatioAtLimit)
	fmt.Fprintf(w, "B p99 flooded ÷ at limit: %.2f× (what the refusals add)\n", r.RatioVsAtLimit)
	if len(r.Passes) > 1 {
		fmt.Fprintf(w, "%-6s %12s %14s %14s %10s %10s %12s %22s %12s\n", "pass", "B alone p99", "B at-limit p99", "B flooded p99", "flood÷idle", "limit÷idle", "flood÷limit", "CPU stall ms/s (3 ph.)", "A answered/s")
		for i, p := range r.Passes {
			fmt.Fprintf(w, "%-6d %10.2fms %12.2fms %12.2fms %9.2f× %9.2f× %11.2f× %8.0f / %4.0f / %4.0f %12.0f\n", i+1, p.BIdleP99ms, p.BAtLimitP99ms,
				p.BFloodedP99ms, p.Ratio, p.RatioAtLimit, p.RatioVsAtLimit, p.Stall[0], p.Stall[1], p.Stall[2], p.AAnsweredPerS)
		}
	}
	fmt.Fprintf(w, "B p99 over every pass's calls (%d / %d / %d calls), alone / at limit / flooded: %.2fms / %.2fms / %.2fms\n",
		r.PooledCalls[0], r.PooledCalls[1], r.PooledCalls[2], r.PooledP99ms[0], r.PooledP99ms[1], r.PooledP99ms[2])
	fmt.Fprintf(w, "B p99 at limit ÷ alone, pooled: %.2f×; the pass of the median ratio: %.2f×\n", r.PooledRatioAtLim, r.Ratio)
	fmt.Fprintf(w, "B p99 flooded ÷ alone, pooled over %d passes: %.2f× (target ≤ %.0f×): %s\n", max(len(r.Passes), 1), r.PooledRatio, r.Target.Want, passFail(r.Target.Pass))
}

// cpuStall is the total of /proc/pressure/cpu's "some" line in µs (-1 where there is none).
func cpuStall() int64 {
	raw, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "total="); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// loadAvg is the host's 1-minute load average ("" where /proc/loadavg is not).
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	if f := strings.Fields(string(raw)); len(f) > 0 {
		return f[0]
	}
	return ""
}

// cores is CPU seconds per process over a wall time, in cores.
func cores(cpu map[string]float64, wall time.Duration) map[string]float64 {
	out := map[string]float64{}
	if wall <= 0 {
		return out
	}
	for k, v := range cpu {
		out[k] = round2(v / wall.Seconds())
	}
	return out
}

func firstOf(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf(" (first: %.200s)", s)
}
