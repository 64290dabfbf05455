// Command chaos is the project's own fault suite (make chaos; see docs/chaos.md): the whole
// platform with N replicas of every service under a mixed workload, kill -9 of each service and
// of the adapter, broker and Postgres connections cut, a receiver failing a share of
// deliveries; then the invariants, checked from the database, the broker and the receiver, and
// the counts of what the faults cost. It exits 1 when an invariant fails (with -strict also
// when a must-show count is not 0), 2 when the run could not be carried out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/chaos"
	"github.com/integrations-platform/integrations/bench/internal/flagx"
	"github.com/integrations-platform/integrations/e2e/stack"
)

func main() {
	var cfg chaos.Config
	var env, schedule, mix string
	flag.StringVar(&cfg.Mode, "mode", chaos.ModeChaos, "chaos (every fault type in turn), adapter (only kill -9 of the adapter), rolling (SIGTERM and restart of every service instance in turn), none (no faults)")
	flag.IntVar(&cfg.Replicas, "replicas", 2, "instances of each of the six services")
	flag.IntVar(&cfg.Executions, "executions", 2000, "executions of the workload (rolling: at least, and on until the restarts end)")
	flag.IntVar(&cfg.Callers, "callers", 16, "concurrent callers (rolling: the issue asks for 64)")
	flag.Float64Var(&cfg.Rate, "rate", 40, "executions per second over all callers (0: as fast as they go), so that the workload runs while the faults fire")
	flag.DurationVar(&cfg.Think, "think", 0, "each caller's pause between two calls")
	flag.Float64Var(&cfg.SyncShare, "sync", 0.15, "share of sync calls (the rest async)")
	flag.Float64Var(&cfg.RESTShare, "rest", 0.5, "share of calls over REST (the rest gRPC)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "the workload's random seed (0: from the clock)")
	flag.Float64Var(&cfg.TimeScale, "time-scale", 0.01, "INTEGRATIONS_TIME_SCALE of the services: retries and leases run in seconds")
	flag.StringVar(&schedule, "schedule", "", "chaos mode's round of faults, comma-separated: a service's name or adapter (kill -9), broker (close the run's connections), postgres (terminate the services' backends); default: every service, the adapter twice, broker and postgres twice")
	flag.StringVar(&mix, "mix", "succeed=40,fail_transient=20,fail_permanent=10,complete_later=15,sleep=15", "weights of the async behaviours (sync calls: succeed, sleep, fail_permanent)")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 2*time.Second, "pause between two faults")
	flag.DurationVar(&cfg.Warmup, "warmup", 3*time.Second, "fault-free start (rolling: the baseline of the delays)")
	flag.DurationVar(&cfg.FaultsAfter, "faults-after", 20*time.Second, "how long faults go on after the workload ended, while the backlog drains")
	flag.Float64Var(&cfg.ReceiverFailRate, "receiver-fail", 0.2, "share of webhook deliveries the receiver answers 500")
	flag.DurationVar(&cfg.SettleTimeout, "settle-timeout", 5*time.Minute, "bound of the wait for the backlog to drain after the faults")
	flag.DurationVar(&cfg.DrainWindow, "drain-window", time.Second, "the services' drain window (rolling checks no execution is delayed by more than it plus 1 s)")
	flag.DurationVar(&cfg.TermTimeout, "term-timeout", 30*time.Second, "bound of an instance's exit after SIGTERM before it is killed")
	flag.BoolVar(&cfg.Strict, "strict", false, "fail also when a must-show count (repeats, INTERNAL answers, attempts spent, outcomes) is not 0")
	flag.StringVar(&env, "env", "", "extra environment for every program, comma-separated NAME=VALUE")
	flag.BoolVar(&cfg.KeepLogs, "keep-logs", false, "keep the programs' logs and the adapter's journal")
	flag.StringVar(&cfg.DatabaseURL, "db", defaultDBURL(), "database the run's schema is created in (default $INTEGRATIONS_TEST_DATABASE_URL, else $INTEGRATIONS_PG_URL/test)")
	flag.StringVar(&cfg.AMQPURL, "amqp", envOr("INTEGRATIONS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "broker (the run creates and deletes a vhost of its own on it)")
	flag.StringVar(&cfg.Root, "root", "", "workspace root (default: found from the working directory)")
	flag.Parse()
	cfg.Env = flagx.List(env)
	var err error
	if schedule != "" {
		if cfg.Schedule, err = chaos.ParseSchedule(schedule); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: -schedule:", err)
			os.Exit(2)
		}
	}
	if cfg.Mix, err = chaos.ParseMix(mix); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: -mix:", err)
		os.Exit(2)
	}
	cfg.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, cfg))
}

func run(ctx context.Context, cfg chaos.Config) int {
	var err error
	if cfg.Root == "" {
		if cfg.Root, err = stack.FindRoot(); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
	}
	binDir, err := stack.Build(ctx, cfg.Root, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	defer func() { _ = os.RemoveAll(binDir) }()
	cfg.BinDir = binDir
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	rep.Print(os.Stdout)
	if len(rep.Failed) > 0 {
		return 1
	}
	return 0
}

func defaultDBURL() string {
	if u := os.Getenv("INTEGRATIONS_TEST_DATABASE_URL"); u != "" {
		return u
	}
	if u := os.Getenv("INTEGRATIONS_PG_URL"); u != "" {
		return strings.TrimRight(u, "/") + "/test?sslmode=disable"
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
