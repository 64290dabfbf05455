// Package chaos is the project's own fault suite (make chaos): the whole platform as processes
// — N replicas of every service behind a TCP balancer, the dummy adapter, a webhook receiver —
// under a mixed workload, while faults fire and until it settles: kill -9 of a replica of each
// service and of the adapter (restarted), every broker connection of the run closed, every
// Postgres connection of the services terminated, a receiver failing a share of deliveries.
// Then it checks the invariants from the database, the broker and the receiver, and counts
// what the faults cost (provider work done twice, 500s, attempts spent). See docs/chaos.md.
//
// The run touches only its own things: its own Postgres schema, its own RabbitMQ vhost (every
// broker connection closed is one of that vhost), its own services' Postgres backends (by
// application_name).
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/integrations-platform/integrations/e2e/stack"
	"github.com/integrations-platform/integrations/pkg/catalog"
)

// Modes.
const (
	// ModeChaos fires every fault type in turn (chaosSchedule).
	ModeChaos = "chaos"
	// ModeAdapter only kills the adapter: what an adapter outage costs in attempts.
	ModeAdapter = "adapter"
	// ModeRolling gives every service instance SIGTERM in turn and restarts it, as a rolling
	// deploy, while the callers keep invoking.
	ModeRolling = "rolling"
	// ModeNone fires nothing: a baseline.
	ModeNone = "none"
)

// capability is the workload's capability: the dummy adapter under delays short enough that
// retries run in seconds at the run's time scale.
const capability = "dummy.chaos"

// Config says how to run.
type Config struct {
	Root, BinDir string
	DatabaseURL  string // a database to create the run's schema in (no search_path)
	AMQPURL      string // the broker; the run uses a vhost of its own on it

	Mode       string
	Replicas   int
	Executions int // the workload's size (in rolling mode: at least this many, and on until the restarts end)
	Callers    int
	Think      time.Duration // each caller's pause between calls
	// Rate paces the workload: executions per second over all callers (0: as fast as they go),
	// so that it runs while the faults fire.
	Rate      float64
	SyncShare float64
	RESTShare float64
	Seed      uint64
	TimeScale float64
	// FaultEvery is the pause between two faults; Warmup the fault-free start (the rolling
	// mode's delay baseline).
	FaultEvery time.Duration
	Warmup     time.Duration
	// Schedule replaces the chaos mode's round of faults (ParseSchedule); Mix the async
	// behaviours' weights (DefaultMix when nil).
	Schedule []string
	Mix      Mix
	// FaultsAfter is how long faults go on after the workload ended, while the backlog drains.
	FaultsAfter time.Duration
	// ReceiverFailRate is the share of webhook deliveries the receiver answers 500.
	ReceiverFailRate float64
	// SettleTimeout bounds the wait for the backlog to drain after the faults.
	SettleTimeout time.Duration
	// DrainWindow is the services' drain window (rolling mode checks no execution is delayed by
	// more than it plus a second); TermTimeout bounds one instance's exit after SIGTERM.
	DrainWindow time.Duration
	TermTimeout time.Duration
	// Strict makes the must-show counts (0 repeats, 0 INTERNAL, 0 attempts spent, scripted
	// outcomes) fail the run like the invariants.
	Strict bool
	// Env is added to every program's environment (e.g. a drain window's setting).
	Env []string
	// KeepLogs leaves the programs' logs (and the adapter's journal) in place.
	KeepLogs bool
	Log      io.Writer
}

func (c *Config) defaults() {
	if c.Mode == "" {
		c.Mode = ModeChaos
	}
	if c.Replicas == 0 {
		c.Replicas = 2
	}
	if c.Callers == 0 {
		c.Callers = 16
	}
	if c.TimeScale == 0 {
		c.TimeScale = 0.01
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 2 * time.Second
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = 3 * time.Minute
	}
	if c.TermTimeout == 0 {
		c.TermTimeout = 30 * time.Second
	}
	if c.DrainWindow == 0 {
		c.DrainWindow = time.Second
	}
	if c.Mix == nil {
		c.Mix = DefaultMix
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
}

func (c *Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, "chaos: "+format+"\n", args...)
	}
}

// delivery is what the receiver saw of one event.
type delivery struct {
	executionID string
	ok, failed  int // answered 204, answered 500 on purpose
	bad         int // signature did not verify
}

// Run runs the suite and returns its report; err is for a run that could not be carried out
// (the report's Failed lists broken invariants).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	runID := "chaos_" + time.Now().UTC().Format("20060102t150405") + "_" + randomHex(3)
	cfg.logf("run %s: mode %s, %d replicas, %d executions, %d callers, time scale %v, seed %d",
		runID, cfg.Mode, cfg.Replicas, cfg.Executions, cfg.Callers, cfg.TimeScale, cfg.Seed)

	// The run's own vhost.
	vhost := runID
	rb, err := newRabbit(cfg.AMQPURL, vhost)
	if err != nil {
		return nil, err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rb.createVhost(setupCtx); err != nil {
		return nil, fmt.Errorf("the run's vhost: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rb.deleteVhost(dctx); err != nil {
			cfg.logf("delete vhost %s: %v", vhost, err)
		}
	}()
	amqpURL, err := withVhost(cfg.AMQPURL, vhost)
	if err != nil {
		return nil, err
	}

	journalDir, err := os.MkdirTemp("", "integrations-chaos-")
	if err != nil {
		return nil, err
	}
	if !cfg.KeepLogs {
		defer func() { _ = os.RemoveAll(journalDir) }()
	}
	journalPath := filepath.Join(journalDir, "dummy-adapter.journal")
	appName := "integrations-" + runID
	env := append([]string{
		// Expired leases and stranded work are looked for often: everything is local. The sweep
		// grace stays the production default (5 s, not time-scaled): it is the time an outcome
		// report in flight at the lease's end has to land while settlement or Postgres recovers
		// from a fault, and a grace of 200 ms made the sweeper, not the faults, cost provider work.
		"INTEGRATIONS_SWEEP_INTERVAL=200ms",
		// Event retries in seconds (scaled): 1m,1m,2m,2m,2m → 0.6 s … 1.2 s at 0.01.
		"INTEGRATIONS_EVENT_RETRY_DELAYS=1m,1m,2m,2m,2m",
	}, cfg.Env...)
	st, err := stack.Start(ctx, stack.Config{
		Root: cfg.Root, BinDir: cfg.BinDir, DatabaseURL: cfg.DatabaseURL, Broker: stack.Broker{URL: amqpURL},
		Name: "chaos", TimeScale: cfg.TimeScale, Replicas: cfg.Replicas, Log: cfg.Log,
		DatabaseParams: url.Values{"application_name": {appName}},
		Env:            env,
		ProgramEnv:     map[string][]string{"dummy-adapter": {"INTEGRATIONS_DUMMY_JOURNAL=" + journalPath}},
		StartTimeout:   60 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	closeStack := func() {
		var err error
		if cfg.KeepLogs {
			err = st.CloseKeepLogs()
			cfg.logf("logs kept in %s, the adapter's journal in %s", st.LogDir, journalPath)
		} else {
			err = st.Close()
		}
		if err != nil {
			cfg.logf("close: %v", err)
		}
	}
	defer closeStack()
	if err := applyCatalog(ctx, st); err != nil {
		return nil, err
	}

	// The receiver: fails a share, remembers every delivery by event id.
	var dmu sync.Mutex
	deliveries := map[string]*delivery{}
	st.Receiver.OnEvent(func(ev stack.Event) {
		var body struct {
			Data struct {
				ExecutionID string `json:"execution_id"`
			} `json:"data"`
		}
		_ = json.Unmarshal(ev.Body, &body)
		id := ev.Header.Get("webhook-id")
		dmu.Lock()
		defer dmu.Unlock()
		d := deliveries[id]
		if d == nil {
			d = &delivery{executionID: body.Data.ExecutionID}
			deliveries[id] = d
		}
		switch {
		case ev.VerifyErr != nil:
			d.bad++
		case ev.Status < 300:
			d.ok++
		default:
			d.failed++
		}
	})

	f := &faults{st: st, rabbit: rb, appName: appName, fired: map[string]int{}, turn: map[string]int{},
		log: func(format string, args ...any) { cfg.logf(format, args...) }}
	w := &workload{st: st, run: runID, n: cfg.Executions, callers: cfg.Callers, think: cfg.Think, rate: cfg.Rate,
		syncShare: cfg.SyncShare, restShare: cfg.RESTShare, mix: cfg.Mix, seed: cfg.Seed}

	// The workload, and the faults beside it.
	start := time.Now()
	stopWork := make(chan struct{})
	if cfg.Mode == ModeRolling {
		w.n = 0 // on until the restarts end
	}
	waitWork := w.start(ctx, stopWork)
	workDone := make(chan error, 1)
	go func() { workDone <- waitWork() }()

	var schedule []string
	switch cfg.Mode {
	case ModeChaos:
		schedule = chaosSchedule()
		if len(cfg.Schedule) > 0 {
			schedule = cfg.Schedule
		}
	case ModeAdapter:
		schedule = []string{killFault("dummy-adapter")}
	case ModeRolling, ModeNone:
	default:
		return nil, fmt.Errorf("unknown mode %q (chaos, adapter, rolling, none)", cfg.Mode)
	}
	if cfg.ReceiverFailRate > 0 {
		st.Receiver.SetFailRate(cfg.ReceiverFailRate)
	}
	sleepCtx(ctx, cfg.Warmup)
	faultsFrom := time.Now()
	var workErr error
	workEnded := false
	var workEnd time.Time
	switch cfg.Mode {
	case ModeRolling:
		f.rolling(ctx, cfg.TermTimeout)
		// Keep invoking until the last restart has settled in, and the minimum is reached.
		sleepCtx(ctx, 2*time.Second)
		for w.submitted() < cfg.Executions && ctx.Err() == nil {
			sleepCtx(ctx, 100*time.Millisecond)
		}
		close(stopWork)
		workErr = <-workDone
		workEnd = time.Now()
	default:
		for i := 0; ; i++ {
			if !workEnded {
				select {
				case workErr = <-workDone:
					workEnded, workEnd = true, time.Now()
				default:
				}
			}
			if workEnded {
				// Faults go on while the backlog drains: until every kind fired, the backlog is
				// empty, or FaultsAfter passed.
				ex, ev, _ := st.Backlog(ctx)
				allFired := len(f.firedCopy()) >= len(kinds(schedule))
				if allFired && (ex+ev == 0 || time.Since(workEnd) > cfg.FaultsAfter) {
					break
				}
				// A fault that never fires (its every try failed: see the report's notes) must
				// not keep the run going: one more round at most.
				if time.Since(workEnd) > cfg.FaultsAfter+time.Duration(len(schedule))*(cfg.FaultEvery+5*time.Second) {
					break
				}
				if len(schedule) == 0 {
					break
				}
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if len(schedule) > 0 {
				f.fire(ctx, schedule[i%len(schedule)])
			}
			sleepCtx(ctx, cfg.FaultEvery)
		}
	}
	faultsUntil := time.Now()
	cfg.logf("workload submitted %d in %s; faults ended after %s", w.submitted(), workEnd.Sub(start).Round(time.Millisecond), faultsUntil.Sub(start).Round(time.Millisecond))

	// Settle: the backlog drains with no more faults (the receiver still fails its share:
	// events are retried up to their sixth attempt).
	settleTook, settleErr := settle(ctx, st, cfg.SettleTimeout)
	cfg.logf("settled %s after the faults (%v)", settleTook.Round(time.Millisecond), settleErr)
	// Messages may still sit in holding queues (a retry notice of an event already delivered,
	// a copy of a dispatch already handled): they drain on their own, into consumers that
	// discard them. Wait for that, within the same bound, before the queues are checked.
	if settleErr == nil {
		queuesTook := awaitQueues(ctx, rb, cfg.SettleTimeout-settleTook)
		cfg.logf("queues empty %s later", queuesTook.Round(time.Millisecond))
	}
	// Deliveries acknowledged just before the check may still be being recorded: wait until the
	// database's delivered events are all seen by the receiver, or a few seconds.
	awaitDeliveries(ctx, st, func() int { dmu.Lock(); defer dmu.Unlock(); return okCount(deliveries) })

	dmu.Lock()
	dcopy := maps.Clone(deliveries)
	dmu.Unlock()
	rep, err := check(ctx, checkInput{
		cfg: cfg, st: st, rabbit: rb, faults: f, work: w, workErr: workErr,
		deliveries: dcopy, journalPath: journalPath, schedule: schedule,
		start: start, faultsFrom: faultsFrom, faultsUntil: faultsUntil, settleErr: settleErr, amqpURL: amqpURL,
	})
	if err != nil {
		return nil, err
	}
	if len(rep.Failed) > 0 && !cfg.KeepLogs {
		rep.Notes = append(rep.Notes, "run with -keep-logs to keep the programs' logs and the adapter's journal")
	}
	return rep, nil
}

// settle waits until every execution is settled, every event delivered or dead and every
// dispatch record gone (a record outlives its execution's settlement until the dispatcher has
// published it), for at most timeout.
func settle(ctx context.Context, st *stack.Stack, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		ex, ev, err := st.Backlog(ctx)
		var dispatches int64
		if err == nil {
			err = st.DB.QueryRow(ctx, `SELECT count(*) FROM dispatches`).Scan(&dispatches)
		}
		if err != nil {
			return time.Since(start), err
		}
		if ex+ev+dispatches == 0 {
			return time.Since(start), nil
		}
		if err := st.Check(); err != nil {
			return time.Since(start), err
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("not settled after %s: %d executions unsettled, %d events undelivered, %d dispatch records", timeout, ex, ev, dispatches)
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// awaitQueues polls the run's queues (dead-letter queues aside) until they are empty, for at
// most timeout (each poll is a rabbitmqctl call, about a second).
func awaitQueues(ctx context.Context, rb *rabbit, timeout time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < timeout && ctx.Err() == nil {
		qs, err := rb.queues(ctx)
		if err != nil {
			break
		}
		empty := true
		for _, q := range qs {
			if q.messages > 0 && !strings.HasSuffix(q.name, ".dlq") {
				empty = false
			}
		}
		if empty {
			break
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
	return time.Since(start)
}

func okCount(ds map[string]*delivery) int {
	n := 0
	for _, d := range ds {
		if d.ok > 0 {
			n++
		}
	}
	return n
}

func awaitDeliveries(ctx context.Context, st *stack.Stack, seen func() int) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var n int
		if err := st.DB.QueryRow(ctx, `SELECT count(*) FROM integration_events WHERE delivery_status = 'delivered'`).Scan(&n); err != nil {
			return
		}
		if seen() >= n {
			return
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// applyCatalog adds the workload's capability to the stack's dev catalog.
func applyCatalog(ctx context.Context, st *stack.Stack) error {
	adapterEndpoint, credential := st.Addrs["dummy-adapter"], st.AdapterCredential
	c, err := catalog.Parse([]byte(fmt.Sprintf(`
adapters:
  - id: dummy
    endpoint: %s
    credential: %s
capabilities:
  - name: %s
    adapter: dummy
    modes: [async, sync]
    max_attempts: 10
    async_budget: 24h
    retry_delays: [1m, 1m, 2m]
    lease: 5m
    sync_timeout: 30s
`, adapterEndpoint, credential, capability)), func(string) (string, bool) { return "", false })
	if err != nil {
		return fmt.Errorf("chaos catalog: %w", err)
	}
	if err := catalog.Apply(ctx, st.DB, c); err != nil {
		return fmt.Errorf("apply the chaos catalog: %w", err)
	}
	return nil
}

func withVhost(raw, vhost string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("amqp url: %w", err)
	}
	u.Path = "/" + vhost
	u.RawPath = ""
	return u.String(), nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
