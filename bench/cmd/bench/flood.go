package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/e2e/stack"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
)

// The ratelimit scenario's application A runs in a process of its own ("bench flood"), as an
// attacker's client would: in the bench's process its goroutines, connections and garbage
// slowed B's client as much as the gateway, and B's latency measured the load generator.
//
// Protocol: the child invokes until its stdin is closed; each line written to its stdin makes it
// print its tally so far as one JSON line on stdout, and closing stdin makes it stop, wait for
// its calls and print the final tally.

// floodConfig is what the flooding child needs.
type floodConfig struct {
	GRPCAddr string
	RESTURL  string
	Key      string
	// Rate: open loop at Rate calls a second (not awaited); 0: Callers closed-loop callers.
	Rate    float64
	Callers int
	// MaxD ends an open-loop flood that is not stopped sooner.
	MaxD time.Duration
	// Via is "both" (every other call REST), "rest" or "grpc".
	Via string
}

// flooder is a running child.
type flooder struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *bufio.Scanner
	stopped bool
}

// startFlooder runs this program's "flood" command with cfg.
func startFlooder(ctx context.Context, cfg floodConfig) (*flooder, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("flood: find this program: %w", err)
	}
	args := []string{self, "flood",
		"-grpc", cfg.GRPCAddr, "-rest", cfg.RESTURL, "-key", cfg.Key,
		"-rate", strconv.FormatFloat(cfg.Rate, 'g', -1, 64), "-callers", strconv.Itoa(cfg.Callers), "-max-d", cfg.MaxD.String(), "-via", cfg.Via}
	// At the lowest priority (SCHED_IDLE, else nice 19): the attacker's client runs on another
	// machine, and here it should take only the CPU the stack leaves. Whether it still offers its
	// rate is printed (A's calls answered a second beside the rate offered).
	if chrt, err := exec.LookPath("chrt"); err == nil && exec.Command(chrt, "--idle", "0", "true").Run() == nil {
		args = append([]string{chrt, "--idle", "0"}, args...)
	} else if nice, err := exec.LookPath("nice"); err == nil {
		args = append([]string{nice, "-n", "19"}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("flood: start: %w", err)
	}
	return &flooder{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}, nil
}

// tally asks the child for its answers so far.
func (f *flooder) tally() (aTally, error) {
	if _, err := io.WriteString(f.stdin, "\n"); err != nil {
		return aTally{}, fmt.Errorf("flood: ask for a tally: %w", err)
	}
	return f.read()
}

// stop ends the flood and returns its final tally.
func (f *flooder) stop() (aTally, error) {
	f.stopped = true
	_ = f.stdin.Close()
	t, err := f.read()
	if werr := f.cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("flood: %w", werr)
	}
	return t, err
}

// kill ends the child at once unless stop has: for the error paths (defer it).
func (f *flooder) kill() {
	if f.stopped {
		return
	}
	f.stopped = true
	_ = f.cmd.Process.Kill()
	_ = f.cmd.Wait()
}

func (f *flooder) read() (aTally, error) {
	var t aTally
	if !f.out.Scan() {
		return t, fmt.Errorf("flood: the child ended without a tally: %v", f.out.Err())
	}
	return t, json.Unmarshal(f.out.Bytes(), &t)
}

// runFlood is the "flood" command: the child side of the protocol above.
func runFlood(args []string) error {
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	var cfg floodConfig
	fs.StringVar(&cfg.GRPCAddr, "grpc", "", "the gateway's gRPC address")
	fs.StringVar(&cfg.RESTURL, "rest", "", "the gateway's REST base URL")
	fs.StringVar(&cfg.Key, "key", "", "application A's API key")
	fs.Float64Var(&cfg.Rate, "rate", 0, "offered calls a second, open loop (0: -callers closed-loop callers)")
	fs.IntVar(&cfg.Callers, "callers", 32, "closed-loop callers when -rate is 0")
	fs.DurationVar(&cfg.MaxD, "max-d", time.Minute, "end an open-loop flood after this long if not stopped sooner")
	fs.StringVar(&cfg.Via, "via", "both", "both (every other call over REST), rest or grpc")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.GRPCAddr == "" || cfg.RESTURL == "" || cfg.Key == "" {
		return errors.New("flood: -grpc, -rest and -key are required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var t aTally
	var mu sync.Mutex
	stop, err := flood(ctx, cfg, &t, &mu)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		mu.Lock()
		err := enc.Encode(t)
		mu.Unlock()
		if err != nil {
			return err
		}
	}
	stop()
	return enc.Encode(t)
}

// countREST counts a REST call's answer: its status code and Retry-After header, or err.
func (t *aTally) countREST(code int, retryAfter string, err error) {
	switch {
	case err != nil:
		t.other(err)
	case code == http.StatusAccepted:
		t.Admitted++
	case code == http.StatusTooManyRequests:
		t.Refused++
		t.RefusedREST++
		if s, err := strconv.Atoi(retryAfter); err == nil && s >= 1 {
			t.RetryAfter++
		}
	default:
		t.other(fmt.Errorf("REST answered %d", code))
	}
}

// countGRPC counts a gRPC call's answer by its error's code.
func (t *aTally) countGRPC(err error) {
	switch status.Code(err) {
	case codes.OK:
		t.Admitted++
	case codes.ResourceExhausted:
		t.Refused++
		t.RefusedGRPC++
		if rpcstatus.RetryDelay(err) > 0 {
			t.RetryInfo++
		}
	default:
		t.other(err)
	}
}

// flood invokes as application A until stopped: its i-th call REST for even i, gRPC for odd
// (cfg.Via "both"; "rest" or "grpc": every call that way),
// each answer counted in t under mu. It ignores Retry-After, as a hostile client would.
func flood(ctx context.Context, cfg floodConfig, t *aTally, mu *sync.Mutex) (stop func(), err error) {
	conn, err := grpcx.Dial(cfg.GRPCAddr)
	if err != nil {
		return nil, err
	}
	client := gatewayv1.NewGatewayServiceClient(conn)
	p, err := structpb.NewStruct(map[string]any{"bench": "ratelimit"})
	if err != nil {
		return nil, err
	}
	idleConns := max(cfg.Callers, 256) // the open loop keeps a few hundred calls in flight
	tr := &http.Transport{MaxIdleConns: idleConns, MaxIdleConnsPerHost: idleConns, IdleConnTimeout: time.Minute}
	httpClient := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	restURL := cfg.RESTURL + "/v1/capabilities/" + stack.Capability + ":invoke"
	body := []byte(`{"mode": "MODE_ASYNC", "payload": {"bench": "ratelimit"}}`)
	restInvoke := func(ctx context.Context) (code int, retryAfter string, err error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, restURL, bytes.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+cfg.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After"), nil
	}
	aCtx, cancel := context.WithCancel(ctx)
	call := func(i int) {
		if cfg.Via == "rest" || (cfg.Via != "grpc" && i%2 == 0) {
			code, retryAfter, err := restInvoke(aCtx)
			if aCtx.Err() != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			t.countREST(code, retryAfter, err)
			return
		}
		resp, err := client.InvokeCapability(grpcx.WithBearer(aCtx, cfg.Key),
			&gatewayv1.InvokeCapabilityRequest{Capability: stack.Capability, Mode: executionv1.Mode_MODE_ASYNC, Payload: p})
		if aCtx.Err() != nil {
			return
		}
		if err == nil && resp.GetExecution().GetStatus() != executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING {
			err = fmt.Errorf("answered %v, want pending", resp.GetExecution().GetStatus())
		}
		mu.Lock()
		defer mu.Unlock()
		t.countGRPC(err)
	}
	var wg sync.WaitGroup
	if cfg.Rate > 0 {
		// Open loop: calls at the offered rate, each on its own goroutine, until stopped.
		wg.Go(func() {
			r := load.RunOpen(aCtx, load.OpenParams{Rate: cfg.Rate, Duration: cfg.MaxD}, func(_ context.Context, _ int, i int64) error {
				call(int(i))
				return nil
			})
			if r.Errors > 0 { // the generator's own refusals: too many in flight (ErrOverloaded)
				mu.Lock()
				t.Other += int64(r.Errors)
				if t.FirstErr == "" {
					t.FirstErr = r.FirstErr.Error()
				}
				mu.Unlock()
			}
		})
	} else {
		for i := range cfg.Callers {
			wg.Go(func() {
				for aCtx.Err() == nil {
					call(i)
				}
			})
		}
	}
	return func() {
		cancel()
		wg.Wait()
		tr.CloseIdleConnections()
		_ = conn.Close()
	}, nil
}
