package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/metrics"
)

// serviceHistograms are the latency histograms each service must show after one async execution
// delivered: its own hop's, and the per-RPC server handling time (every service serves gRPC).
var serviceHistograms = map[string][]string{
	"gateway":            {"integrations_accept_seconds", "grpc_server_handling_seconds"},
	"dispatcher":         {"integrations_dispatch_lag_seconds", "grpc_server_handling_seconds"},
	"execution-consumer": {"integrations_queue_wait_seconds", "integrations_adapter_call_seconds", "grpc_server_handling_seconds", "grpc_client_handling_seconds"},
	"adapter-callback":   {"grpc_server_handling_seconds"},
	"settlement":         {"integrations_settle_seconds", "grpc_server_handling_seconds"},
	"event-router":       {"integrations_relay_lag_seconds", "integrations_delivery_seconds", "integrations_accept_to_delivered_seconds", "grpc_server_handling_seconds"},
}

// One async execution to a delivered webhook, then each service's /metrics: every histogram it
// exposes has observations, and the hop's own histograms are among them.
func TestMetricsHistograms(t *testing.T) {
	s := newStack(t)
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	r := newReceiver(t)
	r.register(t, s)

	code, body := s.call(http.MethodPost, "/v1/capabilities/dummy.echo:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "payload": {"greeting": "hello", "n": 1}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	id, _ := execution(body)["id"].(string)
	require.NotEmpty(t, id)
	r.await(t, id)

	for service, want := range serviceHistograms {
		// The delivery is recorded, and its histograms observed, after the receiver answered:
		// poll until they show.
		var counts map[string]float64
		require.Eventually(t, func() bool {
			counts = histogramCounts(t, "http://"+s.Addrs[service+"-metrics"]+"/metrics")
			for _, name := range want {
				if counts[name] == 0 {
					return false
				}
			}
			return true
		}, startTimeout, 20*time.Millisecond, "%s: histograms %v, have counts %v", service, want, counts)
		for name, n := range counts {
			require.Positive(t, n, "%s: histogram %s exposed with no observations", service, name)
		}
	}
}

// histogramCounts is the total _count of each histogram family the metrics page at url exposes.
func histogramCounts(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec // the test's own listener
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	counts := map[string]float64{}
	histograms := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && f[3] == "histogram" {
			histograms[f[2]] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			name = line[:i]
			_, rest, _ = strings.Cut(line[strings.LastIndexByte(line, '}'):], " ")
		}
		base, ok := strings.CutSuffix(name, "_count")
		if !ok || !histograms[base] {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		require.NoError(t, err, line)
		counts[base] += v
	}
	require.NoError(t, sc.Err())
	return counts
}

// The Grafana dashboard queries only metrics the code registers: the integrations_* names the
// services and pkg/ define (their Name: fields), and the per-RPC metrics pkg/metrics builds.
// A renamed or removed metric fails here instead of leaving a panel silently empty.
func TestDashboardMetricsRegistered(t *testing.T) {
	registered := map[string]bool{}
	nameField := regexp.MustCompile(`Name:\s*"((?:integrations|grpc)_[a-z0-9_]+)"`)
	for _, root := range []string{"../services", "../pkg"} {
		require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range nameField.FindAllSubmatch(b, -1) {
				registered[string(m[1])] = true
			}
			return nil
		}))
	}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range []prometheus.Collector{metrics.GRPCServer(), metrics.GRPCClient()} {
		descs := make(chan *prometheus.Desc, 64)
		c.Describe(descs)
		close(descs)
		for d := range descs {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				registered[m[1]] = true
			}
		}
	}
	require.True(t, registered["integrations_accept_seconds"] && registered["grpc_server_handling_seconds"], "registered: %v", registered)

	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(mustRead(t, "../deploy/grafana/integrations.json"), &dash))
	// Label lists (by (...)) and selectors ({...}) name labels, not metrics.
	labels := regexp.MustCompile(`by \([^)]*\)|\{[^}]*\}`)
	name := regexp.MustCompile(`\b(?:integrations|grpc)_[a-z0-9_]+\b`)
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(labels.ReplaceAllString(tg.Expr, ""), -1) {
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && registered[b] {
						base = b
					}
				}
				require.True(t, registered[base], "panel %q queries %s, which no code registers", p.Title, n)
				queried++
			}
		}
	}
	require.Positive(t, queried, "the dashboard queries metrics")
	// And every latency histogram has a panel.
	expr, err := os.ReadFile("../deploy/grafana/integrations.json")
	require.NoError(t, err)
	for _, hs := range serviceHistograms {
		for _, h := range hs {
			require.Contains(t, string(expr), h+"_bucket", "no panel for %s", h)
		}
	}
}
