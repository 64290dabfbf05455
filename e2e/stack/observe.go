package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// PprofURL is the gateway's net/http/pprof base ("" unless Config.GatewayPprof or Pprof).
func (s *Stack) PprofURL() string {
	if !s.cfg.GatewayPprof && !s.cfg.Pprof {
		return ""
	}
	return s.PprofURLOf("gateway")
}

// PprofURLOf is a service's net/http/pprof base URL ("" if it has no metrics address of its own).
func (s *Stack) PprofURLOf(name string) string {
	addr, ok := s.Addrs[name+"-metrics"]
	if !ok {
		return ""
	}
	return "http://" + addr + "/debug/pprof"
}

// Check reports a program that exited while it should be running.
func (s *Stack) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unexpected) > 0 {
		return errors.New(strings.Join(s.unexpected, "; "))
	}
	return nil
}

// PIDs returns the process ids of the running instances by name.
func (s *Stack) PIDs() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for n, p := range s.procs {
		out[n] = p.cmd.Process.Pid
	}
	return out
}

// Backlog counts what the stack has still to do: executions not settled and events not yet
// delivered (or dead).
func (s *Stack) Backlog(ctx context.Context) (executions, events int64, err error) {
	err = s.DB.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM executions WHERE settled_at IS NULL),
		(SELECT count(*) FROM integration_events WHERE delivery_status = 'pending')`).Scan(&executions, &events)
	return executions, events, err
}

// Drain waits until the stack has settled every execution and delivered every event, polling,
// for at most timeout, and returns how long it took.
func (s *Stack) Drain(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		ex, ev, err := s.Backlog(ctx)
		if err != nil {
			return time.Since(start), err
		}
		if ex == 0 && ev == 0 {
			return time.Since(start), nil
		}
		if err := s.Check(); err != nil {
			return time.Since(start), err
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("backlog not drained after %s: %d executions unsettled, %d events undelivered", timeout, ex, ev)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// PortCounters sums the message port's counters (integrations_mq_messages_total) by route and
// event ("executions/published"…) over the named instances, or every service's when none is
// named: what this stack's own processes sent and settled, which the broker's global counters
// (cost.ReadMQ) cannot tell apart from other users of the same broker. A service restarted since
// starts again from zero.
func (s *Stack) PortCounters(ctx context.Context, names ...string) (map[string]float64, error) {
	if len(names) == 0 {
		for _, p := range Programs {
			names = append(names, s.Instances(p.Name)...)
		}
	}
	out := map[string]float64{}
	for _, name := range names {
		if addr, ok := s.Addrs[name+"-metrics"]; ok {
			if err := addPortCounters(ctx, "http://"+addr+"/metrics", out); err != nil {
				return nil, fmt.Errorf("metrics of %s: %w", name, err)
			}
		}
	}
	return out, nil
}

// addPortCounters adds the integrations_mq_messages_total samples at url to out.
func addPortCounters(ctx context.Context, url string, out map[string]float64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		rest, ok := strings.CutPrefix(line, "integrations_mq_messages_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		var route, event string
		for _, kv := range strings.Split(labels, ",") {
			k, val, _ := strings.Cut(kv, "=")
			switch val = strings.Trim(val, `"`); k {
			case "route":
				route = val
			case "event":
				event = val
			}
		}
		out[route+"/"+event] += v
	}
	return nil
}
