package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/e2e/stack"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// Behaviours of the workload's scripts (the dummy adapter's, cmd/internal/dummy).
const (
	bSucceed       = "succeed"
	bFailTransient = "fail_transient"
	bFailPermanent = "fail_permanent"
	bCompleteLater = "complete_later"
	bSleep         = "sleep"
)

// script is one execution of the workload: what the client asks and what it should end as.
type script struct {
	i         int
	key       string // idempotency key
	sync      bool
	rest      bool
	behaviour string
	payload   map[string]any
	// needed is the number of attempts the script itself takes (fail_transient N: N+1).
	needed int
	// want is the status the execution should settle as.
	want string
}

// Mix weighs the async behaviours of the workload.
type Mix map[string]float64

// DefaultMix is the async workload's mix.
var DefaultMix = Mix{bSucceed: 40, bFailTransient: 20, bFailPermanent: 10, bCompleteLater: 15, bSleep: 15}

// mixOrder fixes the order behaviours are drawn in, so that a seed draws the same workload.
var mixOrder = []string{bSucceed, bFailTransient, bFailPermanent, bCompleteLater, bSleep}

// ParseMix reads "succeed=40,fail_transient=20,…" (weights, any scale); behaviours left out
// get no share.
func ParseMix(s string) (Mix, error) {
	m := Mix{}
	total := 0.0
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, w, ok := strings.Cut(item, "=")
		v, err := strconv.ParseFloat(w, 64)
		if !ok || err != nil || v < 0 || !slices.Contains(mixOrder, name) {
			return nil, fmt.Errorf("mix item %q: want <behaviour>=<weight>, behaviour one of %s", item, strings.Join(mixOrder, ", "))
		}
		m[name] = v
		total += v
	}
	if total <= 0 {
		return nil, fmt.Errorf("mix %q: no behaviour has a weight", s)
	}
	return m, nil
}

// pick returns the behaviour p (uniform in [0,1)) falls on.
func pick(m Mix, p float64) string {
	total := 0.0
	for _, b := range mixOrder {
		total += m[b]
	}
	acc := 0.0
	for _, b := range mixOrder {
		acc += m[b] / total
		if p < acc {
			return b
		}
	}
	return bSleep
}

// newScript draws execution i of the workload.
func newScript(r *rand.Rand, run string, i int, syncShare, restShare float64, mix Mix) script {
	sc := script{i: i, key: fmt.Sprintf("%s-%d", run, i), sync: r.Float64() < syncShare, rest: r.Float64() < restShare, needed: 1, want: "succeeded"}
	dummy := map[string]any{}
	p := r.Float64()
	if sc.sync {
		// One attempt inline: no transient failures (the sync path does not retry) and no
		// long work (it runs inline, which sleep already covers).
		switch {
		case p < 0.5:
			sc.behaviour = bSucceed
		case p < 0.75:
			sc.behaviour = bSleep
			dummy["sleep_ms"] = 20 + r.IntN(180)
		default:
			sc.behaviour = bFailPermanent
			dummy["fail_permanent"] = true
			sc.want = "failed"
		}
	} else {
		switch pick(mix, p) {
		case bSucceed:
			sc.behaviour = bSucceed
		case bFailTransient:
			sc.behaviour = bFailTransient
			n := 1 + r.IntN(2)
			dummy["fail_transient"] = n
			sc.needed = n + 1
		case bFailPermanent:
			sc.behaviour = bFailPermanent
			dummy["fail_permanent"] = true
			sc.want = "failed"
		case bCompleteLater:
			sc.behaviour = bCompleteLater
			dummy["complete_later_ms"] = 100 + r.IntN(400)
			dummy["lease_ms"] = 2000
		default:
			sc.behaviour = bSleep
			dummy["sleep_ms"] = 20 + r.IntN(280)
		}
	}
	sc.payload = map[string]any{"chaos": i, "dummy": dummy}
	return sc
}

// calls counts the answers the workload's callers got, by protocol and code.
type calls struct {
	mu    sync.Mutex
	codes map[string]int64 // "grpc OK", "rest 503", "grpc transport" …
}

func (c *calls) add(key string) {
	c.mu.Lock()
	c.codes[key]++
	c.mu.Unlock()
}

func (c *calls) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.codes)
}

// accepted is what a caller learnt about one execution.
type accepted struct {
	sc script
	id string
	at time.Time
}

// caller invokes scripts over its own connections (so that the callers spread over the gateway
// replicas, as many clients behind a balancer do), retrying what a careful client retries with
// the same idempotency key.
type caller struct {
	st     *stack.Stack
	grpc   gatewayv1.GatewayServiceClient
	http   *http.Client
	calls  *calls
	closer func()
}

func newCaller(st *stack.Stack, c *calls) (*caller, error) {
	conn, err := st.Dial("gateway", "")
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 2}
	return &caller{
		st: st, grpc: gatewayv1.NewGatewayServiceClient(conn), calls: c,
		http:   &http.Client{Transport: tr, Timeout: 60 * time.Second},
		closer: func() { _ = conn.Close(); tr.CloseIdleConnections() },
	}, nil
}

// errRetry marks an answer a client should retry.
var errRetry = errors.New("retryable answer")

// invoke calls until an answer that settles the question (accepted, or a refusal that is not
// retryable) or giveUp passes; it returns the execution id ("" if none was accepted).
func (c *caller) invoke(ctx context.Context, sc script, giveUp time.Duration) (string, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 50*time.Millisecond, 2*time.Second
	return backoff.Retry(ctx, func() (string, error) {
		var id string
		var err error
		if sc.rest {
			id, err = c.invokeREST(ctx, sc)
		} else {
			id, err = c.invokeGRPC(ctx, sc)
		}
		if err != nil && !errors.Is(err, errRetry) {
			return "", backoff.Permanent(err)
		}
		return id, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(giveUp))
}

func mode(sc script) executionv1.Mode {
	if sc.sync {
		return executionv1.Mode_MODE_SYNC
	}
	return executionv1.Mode_MODE_ASYNC
}

func (c *caller) invokeGRPC(ctx context.Context, sc script) (string, error) {
	p, err := structpb.NewStruct(sc.payload)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	resp, err := c.grpc.InvokeCapability(grpcx.WithBearer(cctx, c.st.APIKey), &gatewayv1.InvokeCapabilityRequest{
		Capability: capability, Mode: mode(sc), Payload: p, IdempotencyKey: sc.key,
	})
	code := status.Code(err)
	c.calls.add("grpc " + code.String())
	switch code {
	case codes.OK:
		return resp.GetExecution().GetId(), nil
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
		// Internal and Unknown are retried too, with the same key: the platform may have
		// committed the execution, and a client that gives up there is what "lost" means.
		codes.Internal, codes.Unknown:
		return "", fmt.Errorf("%w: %v", errRetry, err)
	}
	return "", fmt.Errorf("invoke %s: %w", sc.key, err)
}

func (c *caller) invokeREST(ctx context.Context, sc script) (string, error) {
	m := "MODE_ASYNC"
	if sc.sync {
		m = "MODE_SYNC"
	}
	body, err := json.Marshal(map[string]any{"mode": m, "payload": sc.payload})
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, c.st.RESTURL+"/v1/capabilities/"+capability+":invoke", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.st.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", sc.key)
	resp, err := c.http.Do(req)
	if err != nil {
		c.calls.add("rest transport-error")
		return "", fmt.Errorf("%w: %v", errRetry, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	c.calls.add(fmt.Sprintf("rest %d", resp.StatusCode))
	if err != nil {
		return "", fmt.Errorf("%w: %v", errRetry, err)
	}
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted:
		var out struct {
			Execution struct {
				ID string `json:"id"`
			} `json:"execution"`
		}
		if err := json.Unmarshal(raw, &out); err != nil || out.Execution.ID == "" {
			return "", fmt.Errorf("invoke %s: answer %d without an execution: %.200s", sc.key, resp.StatusCode, raw)
		}
		return out.Execution.ID, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return "", fmt.Errorf("%w: %d %.200s", errRetry, resp.StatusCode, raw)
	}
	return "", fmt.Errorf("invoke %s: %d %.200s", sc.key, resp.StatusCode, raw)
}

// workload runs callers over the scripts until n are submitted (n > 0) or stop is closed.
type workload struct {
	st        *stack.Stack
	run       string
	n         int
	callers   int
	think     time.Duration
	rate      float64 // executions per second over all callers (0: as fast as they go)
	syncShare float64
	restShare float64
	mix       Mix
	seed      uint64

	calls    calls
	mu       sync.Mutex
	accepted []accepted
	refused  []string // calls that ended without an execution: why
}

func (w *workload) start(ctx context.Context, stop <-chan struct{}) (wait func() error) {
	w.calls.codes = map[string]int64{}
	next := make(chan int)
	go func() {
		defer close(next)
		var tick <-chan time.Time
		if w.rate > 0 {
			t := time.NewTicker(time.Duration(float64(time.Second) / w.rate))
			defer t.Stop()
			tick = t.C
		}
		for i := 0; w.n <= 0 || i < w.n; i++ {
			if tick != nil {
				select {
				case <-tick:
				case <-stop:
					return
				case <-ctx.Done():
					return
				}
			}
			select {
			case next <- i:
			case <-stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, w.callers)
	for k := range w.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := newCaller(w.st, &w.calls)
			if err != nil {
				errs <- err
				return
			}
			defer c.closer()
			r := rand.New(rand.NewPCG(w.seed, uint64(k)))
			for i := range next {
				sc := newScript(r, w.run, i, w.syncShare, w.restShare, w.mix)
				at := time.Now()
				id, err := c.invoke(ctx, sc, 2*time.Minute)
				w.mu.Lock()
				if id != "" {
					w.accepted = append(w.accepted, accepted{sc: sc, id: id, at: at})
				} else {
					w.refused = append(w.refused, fmt.Sprintf("%s: %v", sc.key, err))
				}
				w.mu.Unlock()
				if w.think > 0 {
					time.Sleep(w.think) // the caller's own pace between calls, not a synchronisation
				}
			}
		}()
	}
	return func() error {
		wg.Wait()
		close(errs)
		return errors.Join(func() []error {
			var out []error
			for e := range errs {
				out = append(out, e)
			}
			return out
		}()...)
	}
}

func (w *workload) submitted() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.accepted) + len(w.refused)
}
