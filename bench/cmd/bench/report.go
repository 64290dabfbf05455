package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/autovac"
	"github.com/integrations-platform/integrations/e2e/stack"
)

// Report is what a run prints and writes to bench/results/<name>-<timestamp>.json. Rows of every
// scenario share one shape, so that later scenarios (end to end, open loop, cost) add rows, and
// columns where they need them, without changing the file's structure.
type Report struct {
	Benchmark string    `json:"benchmark"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	Machine   Machine   `json:"machine"`
	Config    Config    `json:"config"`
	// Rows are the accept scenario's.
	Rows []Row `json:"rows"`
	// Flow are the end-to-end (e2e, serial) and open-loop (latency) rows, the peers' among them.
	Flow []FlowRow `json:"flow,omitempty"`
	// Cost is what the platform's e2e run cost.
	Cost *Cost `json:"cost,omitempty"`
	// RiverSWCost is what the same-work River peer's pipelined e2e run cost, measured the same way.
	RiverSWCost *Cost `json:"riversw_cost,omitempty"`
	// Retry is the retry scenario's broker count.
	Retry *RetryResult `json:"retry,omitempty"`
	// Issue13 is issue 13's must-show table.
	Issue13 []Verdict `json:"issue13,omitempty"`
	// RateLimit is the ratelimit scenario's.
	RateLimit *RateLimitResult `json:"rate_limit,omitempty"`
	// MQ is the message port's table from bench-mq (its -json), when make bench passed it.
	MQ json.RawMessage `json:"message_port,omitempty"`
}

func hasAccept(r *Report) bool { return len(r.Rows) > 0 }

// printMQ prints the message port's figures bench-mq measured before this run.
func printMQ(w io.Writer, r *Report) {
	if len(r.MQ) == 0 {
		return
	}
	var recs []struct {
		Scenario    string  `json:"scenario"`
		Concurrency int     `json:"concurrency"`
		PerSecond   float64 `json:"msg_per_s"`
		VsRaw       float64 `json:"vs_raw"`
		Target      string  `json:"target"`
		Verdict     string  `json:"verdict"`
		Error       string  `json:"error"`
	}
	if err := json.Unmarshal(r.MQ, &recs); err != nil {
		fmt.Fprintln(w, "\nmessage port: unreadable bench-mq result:", err)
		return
	}
	fmt.Fprintln(w, "\nMessage port (make bench-mq, measured just before; its table above has every column)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tconc\tmsg/s\tvs raw\ttarget\tverdict\t")
	for _, m := range recs {
		ratio := ""
		if m.VsRaw > 0 {
			ratio = fmt.Sprintf("%.2f×", m.VsRaw)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s%s\t\n", m.Scenario, m.Concurrency, m.PerSecond, ratio, m.Target, m.Verdict, m.Error)
	}
	tw.Flush() //nolint:errcheck // stdout
}

// Machine is where the run happened.
type Machine struct {
	Hostname   string            `json:"hostname"`
	Go         string            `json:"go"`
	OS         string            `json:"os"`
	Arch       string            `json:"arch"`
	CPUs       int               `json:"cpus"`
	GOMAXPROCS int               `json:"gomaxprocs"`
	CPUModel   string            `json:"cpu_model,omitempty"`
	Postgres   string            `json:"postgres"`
	PGSettings map[string]string `json:"postgres_settings"`
	// Durable is true when Postgres commits are durable (fsync and synchronous_commit on).
	Durable bool `json:"postgres_durable"`
}

// Config is how the run was made.
type Config struct {
	Scenarios       []string `json:"scenarios"`
	Callers         []int    `json:"callers"`
	N               int      `json:"n,omitempty"`
	Duration        string   `json:"duration,omitempty"`
	Reps            int      `json:"reps"`
	Warmup          string   `json:"warmup"`
	Drain           bool     `json:"drain_between_runs"`
	ServiceDBParams string   `json:"service_db_params,omitempty"`
	GatewayPprof    bool     `json:"gateway_pprof"`
	LogLevel        string   `json:"service_log_level"`
	TimeScale       float64  `json:"time_scale"`
	// PeerPool caps the peers' pool connections (min(callers, PeerPool)).
	PeerPool int `json:"peer_pool"`
	// DiagnoseWithout lists programs left out for a diagnosis run (empty for a benchmark).
	DiagnoseWithout []string `json:"diagnose_without,omitempty"`
	// AutovacuumStandIn says whether the bench stood in for a server's autovacuum that is off.
	AutovacuumStandIn string `json:"autovacuum_stand_in"`
}

// Row is one scenario × transport × concurrency: the median of its repetitions.
type Row struct {
	Scenario   string  `json:"scenario"`
	Transport  string  `json:"transport"`
	Callers    int     `json:"callers"`
	What       string  `json:"what"`
	Runs       int     `json:"runs"`
	Requests   int     `json:"requests"` // of the median run
	Seconds    float64 `json:"seconds"`  // of the median run
	Rate       float64 `json:"req_per_s"`
	RateMin    float64 `json:"req_per_s_min"`
	RateMax    float64 `json:"req_per_s_max"`
	P50ms      float64 `json:"p50_ms"` // median of the runs' p50
	P99ms      float64 `json:"p99_ms"` // median of the runs' p99
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	// VsPostgres and VsRiver are Rate over the peer's at the same concurrency (accept rows).
	VsPostgres float64  `json:"vs_postgres,omitempty"`
	VsRiver    float64  `json:"vs_river,omitempty"`
	Targets    []Target `json:"targets,omitempty"`
	// CPUPerCall is µs of CPU per successful call, by process (the stack's programs, "postgres"
	// for all its processes, "beam.smp" for RabbitMQ, "bench" for this process).
	CPUPerCall map[string]float64 `json:"cpu_us_per_call,omitempty"`
}

// Target is a target of issue 6 and whether the row meets it.
type Target struct {
	Name string  `json:"name"`
	Want float64 `json:"want_at_least"`
	Got  float64 `json:"got"`
	Pass bool    `json:"pass"`
}

// Write writes the report as <dir>/accept-<timestamp>.json (the scenarios' names joined).
func (r *Report) Write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := "bench-" + strings.Join(r.Config.Scenarios, "+") + "-" + r.Started.Format("20060102T150405Z") + ".json"
	path := filepath.Join(dir, name)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

func describeMachine(ctx context.Context, st *stack.Stack) (Machine, error) {
	m := Machine{Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), PGSettings: map[string]string{}}
	m.Hostname, _ = os.Hostname()
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if err := st.DB.QueryRow(ctx, "SHOW server_version").Scan(&m.Postgres); err != nil {
		return m, err
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
		"commit_delay", "shared_buffers", "autovacuum", "max_connections", "max_wal_size"} {
		var v string
		if err := st.DB.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return m, err
		}
		m.PGSettings[name] = v
	}
	m.Durable = m.PGSettings["fsync"] == "on" && m.PGSettings["synchronous_commit"] != "off"
	return m, nil
}

func printHeader(w io.Writer, r *Report) {
	m := r.Machine
	fmt.Fprintf(w, "bench  %s  scenarios %s\n", r.Started.Format(time.RFC3339), strings.Join(r.Config.Scenarios, ","))
	fmt.Fprintf(w, "%s, %d CPUs (GOMAXPROCS %d), %s %s/%s\n", m.CPUModel, m.CPUs, m.GOMAXPROCS, m.Go, m.OS, m.Arch)
	durable := "DURABLE (commits wait for the WAL flush)"
	if !m.Durable {
		durable = "NOT DURABLE (fsync or synchronous_commit off): figures are not comparable with a durable setup"
	}
	fmt.Fprintf(w, "Postgres %s as configured on this machine, not tuned: fsync=%s synchronous_commit=%s full_page_writes=%s wal_sync_method=%s shared_buffers=%s — %s\n",
		m.Postgres, m.PGSettings["fsync"], m.PGSettings["synchronous_commit"], m.PGSettings["full_page_writes"],
		m.PGSettings["wal_sync_method"], m.PGSettings["shared_buffers"], durable)
	runs := r.Config.Duration + " runs"
	if r.Config.N > 0 {
		runs = fmt.Sprintf("%d calls a run", r.Config.N)
	}
	svcParams := "services' database pools as deployed (gateway 16, others pgxpool's default)"
	if r.Config.ServiceDBParams != "" {
		svcParams = "services' database URL + " + r.Config.ServiceDBParams
	}
	drained := "stack drained before each run"
	if !r.Config.Drain {
		drained = "stack NOT drained between runs"
	}
	fmt.Fprintf(w, "closed loop, %s, %d repetitions (median), warm-up %s, %s; whole stack running (log level %s, time scale %g); %s; peers' pool min(callers, %d)\n",
		runs, r.Config.Reps, r.Config.Warmup, drained, r.Config.LogLevel, r.Config.TimeScale, svcParams, r.Config.PeerPool)
	fmt.Fprintf(w, "autovacuum=%s: %s\n", m.PGSettings["autovacuum"], r.Config.AutovacuumStandIn)
	if len(r.Config.DiagnoseWithout) > 0 {
		fmt.Fprintf(w, "DIAGNOSIS RUN without %s: not the platform's figures\n", strings.Join(r.Config.DiagnoseWithout, ", "))
	}
}

func printTable(w io.Writer, r *Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\ttransport\tcallers\trequests\tseconds\treq/s\tmin–max req/s\tp50\tp99\tvs postgres\tvs river\ttarget\tverdict\t")
	for _, row := range r.Rows {
		vsPG, vsRiver, target, verdict := "", "", "", ""
		if row.VsPostgres > 0 {
			vsPG = fmt.Sprintf("%.2f×", row.VsPostgres)
		}
		if row.VsRiver > 0 {
			vsRiver = fmt.Sprintf("%.2f×", row.VsRiver)
		}
		var ts, vs []string
		for _, t := range row.Targets {
			ts = append(ts, fmt.Sprintf("≥%.1f× %s", t.Want, strings.TrimPrefix(t.Name, "vs ")))
			vs = append(vs, passFail(t.Pass))
		}
		target, verdict = strings.Join(ts, ", "), strings.Join(vs, ", ")
		if row.Scenario == "accept" && len(row.Targets) == 0 {
			verdict = "no peer measured"
		}
		if row.Errors > 0 {
			verdict += fmt.Sprintf(" (%d errors: %s)", row.Errors, row.FirstError)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f\t%.0f\t%.0f–%.0f\t%.2fms\t%.2fms\t%s\t%s\t%s\t%s\t\n",
			row.Scenario, row.Transport, row.Callers, row.Requests, row.Seconds, row.Rate, row.RateMin, row.RateMax,
			row.P50ms, row.P99ms, vsPG, vsRiver, target, verdict)
	}
	tw.Flush() //nolint:errcheck // stdout
	fmt.Fprintln(w, `
accept/grpc:   GatewayService.InvokeCapability(dummy.echo, MODE_ASYNC), API key as Bearer, one shared
               gRPC connection; the gateway's answer time (auth lookup, capability read, the
               execution + dispatch transaction, 202), while the rest of the stack dispatches,
               runs, settles and delivers what was accepted.
accept/rest:   POST /v1/capabilities/dummy.echo:invoke (grpc-gateway in the gateway process), keep-alive.
postgres/pgx:  the ceiling: BEGIN; INSERT executions row; INSERT dispatches row; COMMIT into the stack's
               schema (same tables and indexes; the dispatch due in a year, so the stack leaves it
               alone), pool of min(callers, -peer-pool) connections.
river/pgx:     river.Client.Insert of a trivial job (insert-only client), same pool size.
req/s: successful calls ÷ (first call sent → last answer) of the median run; p50/p99: per-call latency
(medians of the runs'). vs postgres / vs river: accept req/s ÷ the peer's at the same callers.
Targets (issue 6): accept ≥ 1.0× River's insert and ≥ 0.7× the raw Postgres ceiling.`)
}

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// autovacText says how the server's tables are kept vacuumed and analyzed during the run.
func autovacText(m Machine, s *autovac.StandIn, naptime time.Duration) string {
	switch {
	case m.PGSettings["autovacuum"] != "off":
		return "the server's own"
	case s != nil:
		return fmt.Sprintf("stand-in by the bench every %s at the server's autovacuum thresholds (the server has it off)", naptime)
	default:
		return "NONE: the server has it off and -autovacuum-naptime=0; no table is analyzed, generic plans stay those of empty tables"
	}
}
