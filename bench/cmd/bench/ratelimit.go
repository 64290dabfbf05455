package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/bench/internal/stack"
	"github.com/integrations-platform/integrations/pkg/catalog"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// RateLimitResult is the ratelimit scenario (issue 11): application B's accept latency under a
// light steady load, alone and while application A floods the gateway far past its invoke limit.
// A's flood runs on connections of its own (B's gRPC connection is not shared with it).
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
	// Hold is the gateway's INTEGRATIONS_RATE_LIMIT_REFUSAL_DELAY ("": its default).
	Hold    string  `json:"refusal_delay,omitempty"`
	Seconds float64 `json:"seconds"`
	// What A got: admitted (202 / pending), refused (429 / RESOURCE_EXHAUSTED), other answers.
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
	// B: async invokes over gRPC, open loop at BRate per second.
	BRate    float64 `json:"b_offered_per_s"`
	BIdle    FlowRow `json:"b_idle"`
	BFlooded FlowRow `json:"b_flooded"`
	Ratio    float64 `json:"b_p99_flooded_vs_idle"`
	// Cores each process used (CPU seconds ÷ wall seconds) during B's runs, alone and flooded
	// ("bench" is the load generator: B and A's callers, on the same cores as the stack).
	CoresIdle    map[string]float64 `json:"cores_idle"`
	CoresFlooded map[string]float64 `json:"cores_flooded"`
	// GatewayUsPerRefusal is the gateway's extra CPU while flooded ÷ A's calls (REST and gRPC).
	GatewayUsPerRefusal float64 `json:"gateway_cpu_us_per_flood_call"`
	// LoadAvg is the host's 1-minute load average before and after the scenario: the host may be
	// shared, and B's latency depends on what else runs.
	LoadAvg [2]string `json:"loadavg_before_after"`
	Target  Target    `json:"target"`
}

// Targets of the ratelimit scenario.
const targetFloodP99Ratio = 2.0

// runRateLimit adds application A with a small invoke limit to the stack's catalog, measures B
// (the dev application, at the deployment's defaults) alone, then again while A floods.
func runRateLimit(ctx context.Context, o options, st *stack.Stack, rep *Report) error {
	const aLimit, aBurst = 50.0, 50
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

	conn, err := st.DialGateway()
	if err != nil {
		return err
	}
	defer conn.Close()
	client := gatewayv1.NewGatewayServiceClient(conn)
	// A floods on a connection of its own, as a separate client would: sharing B's, its calls
	// would queue with B's in one HTTP/2 connection and measure the client, not the gateway.
	aConn, err := st.DialGateway()
	if err != nil {
		return err
	}
	defer aConn.Close()
	aClient := gatewayv1.NewGatewayServiceClient(aConn)
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
	measureB := func() load.Result {
		return load.RunOpen(ctx, load.OpenParams{Rate: o.rlRate, Duration: o.rlD},
			func(ctx context.Context, _ int, _ int64) error { return invokeOn(ctx, client, st.APIKey) })
	}
	what := fmt.Sprintf("B: async invoke over gRPC, open loop at %.0f/s (answered pending)", o.rlRate)

	fmt.Fprintf(os.Stderr, "bench: ratelimit: B alone at %.0f invokes/s for %s\n", o.rlRate, o.rlD)
	load0 := loadAvg()
	cpu0 := cpuSnapshot(st)
	idle := measureB()
	cpuIdle := cpuDelta(cpu0, cpuSnapshot(st))
	res := &RateLimitResult{ALimit: aLimit, ABurst: aBurst, AOffered: o.rlFloodRate, BRate: o.rlRate, Hold: o.rlHold,
		BIdle: rowOf("ratelimit", "integrations", what+", alone", 0, o.rlRate, int(o.rlRate*o.rlD.Seconds()), idle)}
	printFlowRow(os.Stderr, res.BIdle)

	if o.rlFloodRate == 0 {
		res.ACallers = o.rlCallers
		fmt.Fprintf(os.Stderr, "bench: ratelimit: B again while A floods with %d callers (limit %.0f/s)\n", o.rlCallers, aLimit)
	} else {
		fmt.Fprintf(os.Stderr, "bench: ratelimit: B again while A floods at %.0f calls/s, open loop (limit %.0f/s)\n", o.rlFloodRate, aLimit)
	}
	floodCtx, stopFlood := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var firstOther atomic.Value
	other := func(err error) {
		res.AOther++ // under mu
		firstOther.CompareAndSwap(nil, err.Error())
	}
	var mu sync.Mutex
	idleConns := max(o.rlCallers, 256) // the open loop keeps a few hundred calls in flight
	tr := &http.Transport{MaxIdleConns: idleConns, MaxIdleConnsPerHost: idleConns, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	httpClient := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	restURL := st.RESTURL + "/v1/capabilities/" + stack.Capability + ":invoke"
	body := []byte(`{"mode": "MODE_ASYNC", "payload": {"bench": "ratelimit"}}`)
	restInvoke := func(ctx context.Context) (code int, retryAfter string, err error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, restURL, bytes.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+aKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After"), nil
	}
	// floodCall makes A's i-th call, REST for even i, gRPC for odd, and counts its answer.
	floodCall := func(i int) {
		if i%2 == 0 {
			code, retryAfter, err := restInvoke(floodCtx)
			if floodCtx.Err() != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				other(err)
			case code == http.StatusAccepted:
				res.AAdmitted++
			case code == http.StatusTooManyRequests:
				res.ARefused++
				res.ARefusedREST++
				if s, err := strconv.Atoi(retryAfter); err == nil && s >= 1 {
					res.ARetryAfter++
				}
			default:
				other(fmt.Errorf("REST answered %d", code))
			}
			return
		}
		err := invokeOn(floodCtx, aClient, aKey)
		if floodCtx.Err() != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch status.Code(err) {
		case codes.OK:
			res.AAdmitted++
		case codes.ResourceExhausted:
			res.ARefused++
			res.ARefusedGRPC++
			if grpcx.RetryDelay(err) > 0 {
				res.ARetryInfo++
			}
		default:
			other(err)
		}
	}
	floodStart := time.Now()
	if o.rlFloodRate > 0 {
		// Open loop: calls at the offered rate, each on its own goroutine, for as long as B is
		// measured and then some (the flood is stopped when B is done).
		n := int(o.rlFloodRate * (o.rlD + 30*time.Second).Seconds())
		wg.Go(func() {
			r := load.RunOpen(floodCtx, load.OpenParams{Rate: o.rlFloodRate, N: n}, func(_ context.Context, _ int, i int64) error {
				floodCall(int(i))
				return nil
			})
			if r.FirstErr != nil && floodCtx.Err() == nil { // the generator's own refusals: too many in flight
				mu.Lock()
				other(r.FirstErr)
				mu.Unlock()
			}
		})
	} else {
		for i := range o.rlCallers {
			wg.Go(func() {
				for floodCtx.Err() == nil {
					floodCall(i)
				}
			})
		}
	}
	// Let the flood reach its pace (and spend A's burst) before B is measured.
	time.Sleep(time.Second)
	profiled := profileServices(ctx, o, st)
	mu.Lock()
	floodCalls0 := res.AAdmitted + res.ARefused + res.AOther
	mu.Unlock()
	cpu1 := cpuSnapshot(st)
	flooded := measureB()
	cpuFlooded := cpuDelta(cpu1, cpuSnapshot(st))
	mu.Lock()
	floodCalls := res.AAdmitted + res.ARefused + res.AOther - floodCalls0
	mu.Unlock()
	stopFlood()
	wg.Wait()
	profiled()
	res.LoadAvg = [2]string{load0, loadAvg()}
	res.CoresIdle = cores(cpuIdle, idle.Elapsed)
	res.CoresFlooded = cores(cpuFlooded, flooded.Elapsed)
	if floodCalls > 0 {
		res.GatewayUsPerRefusal = round1((cpuFlooded["gateway"] - cpuIdle["gateway"]*flooded.Elapsed.Seconds()/idle.Elapsed.Seconds()) / float64(floodCalls) * 1e6)
	}
	res.Seconds = time.Since(floodStart).Seconds()
	res.ACalls = res.AAdmitted + res.ARefused + res.AOther
	if v := firstOther.Load(); v != nil {
		res.AFirstErr = v.(string)
	}
	res.BFlooded = rowOf("ratelimit", "integrations", what+", while A floods", 0, o.rlRate, int(o.rlRate*o.rlD.Seconds()), flooded)
	printFlowRow(os.Stderr, res.BFlooded)
	if res.BIdle.P99ms > 0 {
		res.Ratio = res.BFlooded.P99ms / res.BIdle.P99ms
	}
	res.Target = Target{Name: "B p99 flooded ÷ idle at most", Want: targetFloodP99Ratio, Got: round2(res.Ratio),
		Pass: res.Ratio > 0 && res.Ratio <= targetFloodP99Ratio}
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
	fmt.Fprintf(w, "\nRate limits: A floods (%s, half REST, half gRPC, own connections, ignoring Retry-After) past its limit of %.0f invokes/s (burst %d); B invokes at %.0f/s; refusal delay %s\n",
		flood, r.ALimit, r.ABurst, r.BRate, hold)
	fmt.Fprintf(w, "A over %.1fs: %d calls answered (%.0f/s; offered %.0f/s), %d admitted (%.1f/s), %d refused (%.0f/s), %d other%s\n",
		r.Seconds, r.ACalls, float64(r.ACalls)/r.Seconds, r.AOffered, r.AAdmitted, float64(r.AAdmitted)/r.Seconds,
		r.ARefused, float64(r.ARefused)/r.Seconds, r.AOther, firstOf(r.AFirstErr))
	fmt.Fprintf(w, "A's refusals saying when to retry: REST %d of %d with Retry-After ≥ 1s, gRPC %d of %d with RetryInfo\n",
		r.ARetryAfter, r.ARefusedREST, r.ARetryInfo, r.ARefusedGRPC)
	fmt.Fprintf(w, "B alone:       %d done, %d errors, p50 %.2fms, p99 %.2fms\n", r.BIdle.Completed, r.BIdle.Errors, r.BIdle.P50ms, r.BIdle.P99ms)
	fmt.Fprintf(w, "B while A floods: %d done, %d errors, p50 %.2fms, p99 %.2fms\n", r.BFlooded.Completed, r.BFlooded.Errors, r.BFlooded.P50ms, r.BFlooded.P99ms)
	fmt.Fprintf(w, "cores used, B alone:        %s\n", kvText(r.CoresIdle, "%.2f"))
	fmt.Fprintf(w, "cores used, while A floods: %s\n", kvText(r.CoresFlooded, "%.2f"))
	fmt.Fprintf(w, "host load average (1 min) before / after: %s / %s\n", r.LoadAvg[0], r.LoadAvg[1])
	fmt.Fprintf(w, "gateway CPU added by the flood ÷ its calls (the admitted ones' work included): %.1f µs\n", r.GatewayUsPerRefusal)
	fmt.Fprintf(w, "B p99 flooded ÷ alone: %.2f× (target ≤ %.0f×): %s\n", r.Ratio, r.Target.Want, passFail(r.Target.Pass))
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
