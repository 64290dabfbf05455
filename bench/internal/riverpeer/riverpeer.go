// Package riverpeer is River's end-to-end peer of the flow benchmark (issue 6): a River client
// working one queue with one worker kind, echo, whose Work returns nil at once (the equivalent of
// the dummy echo adapter), driven closed-loop — each caller inserts a job and waits until River
// reports THAT job completed (an EventKindJobCompleted event of the client's subscription) before
// inserting the next, as each caller of the flow benchmark invokes and waits for the webhook. The
// latency is insert start → completion event observed; River marks jobs completed in batches
// (see below), which is part of its end-to-end latency.
//
// What bounds River here (v0.51.2, read from its source and seen in the figures of BestConfig):
//
//   - Completion is batched by a BatchCompleter that is not configurable: it ticks every 50 ms and
//     writes the batch when at least 100 completions are pending, else on every fifth tick — so
//     with fewer than 100 jobs in flight a completed job waits up to 250 ms for its UPDATE and its
//     event. A one-in-flight closed loop of C < 100 callers therefore does about C jobs per
//     ~250 ms, whatever the fetch settings.
//   - Fetching: an insert sends a NOTIFY at most once per FetchCooldown per queue (the client's
//     insert-notify limiter), and the producer fetches at most once per FetchCooldown; an insert
//     whose notification was suppressed and that the next fetch missed waits for the
//     FetchPollInterval poll (1 s by default).
package riverpeer

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/integrations-platform/integrations/bench/internal/accept"
	"github.com/integrations-platform/integrations/bench/internal/load"
)

// Timeout bounds the wait for one job's completion event; a job not reported completed within it
// counts as an error.
const Timeout = 10 * time.Minute

// Config of one run.
type Config struct {
	DatabaseURL string // database; River's tables live in Schema (already migrated by the caller via accept.MigrateRiver)
	Schema      string
	N           int // jobs
	// Concurrency is the number of closed-loop inserters, and River's MaxWorkers for the queue
	// (each inserter has one job in flight, so more workers could never be busy).
	Concurrency       int
	FetchCooldown     time.Duration // River client FetchCooldown; 0 → River's default (100 ms)
	FetchPollInterval time.Duration // River client FetchPollInterval; 0 → River's default (1 s)
	// PoolSize is the pgx pool's connections (all opened before the run); 0 → DefaultPoolSize.
	// River's LISTEN holds one of them for the client's life.
	PoolSize int
}

// DefaultPoolSize is the pool of a Config without PoolSize: a connection per inserter, up to 16
// (the gateway's default pool), plus 4 for River's listener, fetches and completer.
func DefaultPoolSize(concurrency int) int { return min(max(concurrency, 1), 16) + 4 }

// BestConfig returns the fetch settings measured best for this peer on the 2-core development
// machine (Postgres on the same machine, other work running: load average 8–22 during the
// measurements, so figures vary by ±10 %), to be completed with DatabaseURL, Schema, N and
// Concurrency. PoolSize is left 0: DefaultPoolSize measured best.
//
// Below 100 callers River's batch completer (250 ms cycle, not configurable) sets the pace: each
// job takes one cycle, so the ceiling is Concurrency / 250 ms, whatever the fetch settings. What
// the fetch settings decide is whether a job misses a cycle: with River's defaults (FetchCooldown
// 100 ms, FetchPollInterval 1 s) an insert whose NOTIFY the limiter suppressed waits for the 1 s
// poll. Jobs/s and p50/p99 (TestMeasure; N = 5000, but 200 at one caller):
//
//	                          C=1                 C=16                  C=64
//	River defaults            4.0/s  250/320 ms   47.9/s  258/544 ms   215/s  253/525 ms
//	10 ms / 100 ms (best)     4.0/s  250/288 ms   63.0/s  250/383 ms   228/s  252/637 ms
//
// In shorter runs (40 jobs per caller, most repeated): at C=16 the defaults gave 45.6–49.8/s,
// every short-fetch setting 61.6–63.8/s; at C=64 defaults 202–213/s, 1 ms/50 ms 150–249/s,
// 1 ms/10 ms 243–249/s, 5 ms/50 ms 248–255/s, 10 ms/100 ms 231–255/s (ceiling 256/s). Above
// 100 callers, where the completer writes on its 50 ms tick, a very short FetchCooldown costs
// (a fetch and a NOTIFY every millisecond on 2 cores): at C=128, 1 ms/50 ms 471/s, 5 ms/50 ms
// 648/s, 10 ms/100 ms 702–748/s, 20 ms/200 ms 692–698/s, defaults 667–755/s. 10 ms / 100 ms reaches
// the ceiling below 100 callers (as every short setting did) and is among the best above. Pool: at C=128 with
// 10 ms/100 ms, 8 connections gave 618–673/s, 40 gave 536–652/s, DefaultPoolSize (20) 702–748/s;
// at C=64 with 1 ms/10 ms, 8 connections 255/s, 40 232–237/s, default 243/s.
//
// MaxWorkers stays Concurrency (not varied): with one job in flight per caller no more workers
// can be busy, and as a job's work ends long before the completer's next write, fewer could
// only add to its wait.
func BestConfig() Config {
	return Config{
		FetchCooldown:     bestFetchCooldown,
		FetchPollInterval: bestFetchPollInterval,
	}
}

const (
	bestFetchCooldown     = 10 * time.Millisecond
	bestFetchPollInterval = 100 * time.Millisecond
)

// Result of a run.
type Result struct {
	Completed int // jobs whose completion event was observed
	Errors    int // inserts that failed and jobs not reported completed within Timeout
	FirstErr  error
	Elapsed   time.Duration // first insert → last completion observed
	P50, P99  time.Duration // insert start → completion observed
	Max       time.Duration
	Config    string // human description of the River configuration used
	// River's own statistics of the completed jobs (medians): time available before being
	// fetched and started, and time from the worker's return to the completion written (the
	// batch completer's wait included).
	QueueWaitP50, CompleteP50 time.Duration
}

// Rate is completed jobs per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Elapsed.Seconds()
}

// echoArgs is the job: a payload of the same size class as the flow benchmark's.
type echoArgs struct {
	Bench string `json:"bench"`
}

func (echoArgs) Kind() string { return "echo" }

// echoWorker does nothing, as the dummy echo adapter.
type echoWorker struct {
	river.WorkerDefaults[echoArgs]
}

func (echoWorker) Work(context.Context, *river.Job[echoArgs]) error { return nil }

// Peer is a started River client with its completion tracking: Op inserts a job and waits for its
// completion event. Run drives it closed-loop; a caller may drive Op open-loop (load.RunOpen).
type Peer struct {
	pool        *pgxpool.Pool
	client      *river.Client[pgx.Tx]
	unsubscribe func()
	dispatched  chan struct{} // closed when the dispatcher has drained the subscription
	desc        string

	done *load.Completions[int64] // by job id

	statsMu   sync.Mutex
	queueWait []time.Duration
	complete  []time.Duration
}

// Start empties the job table of c.Schema (a run may reuse the schema), opens the pool and starts
// the River client working the default queue with c.Concurrency workers. Close releases it.
func Start(ctx context.Context, c Config) (*Peer, error) {
	if c.Concurrency < 1 {
		c.Concurrency = 1
	}
	if c.PoolSize <= 0 {
		c.PoolSize = DefaultPoolSize(c.Concurrency)
	}
	pool, err := accept.Pool(ctx, c.DatabaseURL, c.PoolSize)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	// An empty job table: completed jobs of an earlier run would otherwise stay (River keeps them
	// a day), and leftovers not completed would be worked during this run.
	if _, err := pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{c.Schema, "river_job"}.Sanitize()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("empty %s.river_job: %w", c.Schema, err)
	}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, echoWorker{}); err != nil {
		pool.Close()
		return nil, err
	}
	cfg := &river.Config{
		Schema:            c.Schema,
		FetchCooldown:     c.FetchCooldown,
		FetchPollInterval: c.FetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: c.Concurrency}},
		Workers:           workers,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	}
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("river client: %w", err)
	}
	p := &Peer{
		pool: pool, client: client,
		dispatched: make(chan struct{}),
		done:       load.NewCompletions[int64](),
		desc: fmt.Sprintf("River v0.51.2 (riverpgxv5): one queue of MaxWorkers %d, worker echo returning nil; "+
			"FetchCooldown %s, FetchPollInterval %s, LISTEN/NOTIFY on; pgx pool of %d connections; "+
			"batch completer (River's, fixed: 50 ms tick, writes at ≥100 pending or every 250 ms); "+
			"completion observed through Subscribe(EventKindJobCompleted)",
			c.Concurrency, orDefault(c.FetchCooldown, river.FetchCooldownDefault),
			orDefault(c.FetchPollInterval, river.FetchPollIntervalDefault), c.PoolSize),
	}
	// Subscribe before starting, so that no completion can be missed. The buffer holds far more
	// than the jobs in flight; the dispatcher below drains it at once regardless.
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		Kinds:    []river.EventKind{river.EventKindJobCompleted},
		ChanSize: max(10_000, 4*c.Concurrency),
	})
	p.unsubscribe = unsubscribe
	go p.dispatch(events)
	if err := client.Start(ctx); err != nil {
		unsubscribe()
		pool.Close()
		return nil, fmt.Errorf("start river client: %w", err)
	}
	return p, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Describe says what River configuration the peer runs.
func (p *Peer) Describe() string { return p.desc }

// dispatch hands each completion event to its waiter; it only timestamps and routes, so that the
// subscription channel never backs up.
func (p *Peer) dispatch(events <-chan *river.Event) {
	defer close(p.dispatched)
	for ev := range events {
		at := time.Now()
		if ev == nil || ev.Kind != river.EventKindJobCompleted || ev.Job == nil {
			continue
		}
		p.done.Done(ev.Job.ID, at, nil)
		if ev.JobStats != nil {
			p.statsMu.Lock()
			p.queueWait = append(p.queueWait, ev.JobStats.QueueWaitDuration)
			p.complete = append(p.complete, ev.JobStats.CompleteDuration)
			p.statsMu.Unlock()
		}
	}
}

// await waits for job id's completion event.
func (p *Peer) await(ctx context.Context, id int64) (time.Time, error) {
	at, err := p.done.Await(ctx, id, Timeout)
	if err != nil && ctx.Err() == nil {
		return at, fmt.Errorf("job %w", err)
	}
	return at, err
}

// Op inserts an echo job and waits until its completion event is observed.
func (p *Peer) Op() load.Op { return load.OpOf(p.Submit()) }

// stats returns the medians of River's queue-wait and complete durations so far.
func (p *Peer) stats() (queueWait, complete time.Duration) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return load.Percentile(s, 50)
	}
	return med(p.queueWait), med(p.complete)
}

// Close stops the client (letting it write its last completions), ends the subscription and
// closes the pool.
func (p *Peer) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := p.client.Stop(ctx)
	if err != nil {
		err = fmt.Errorf("stop river client: %w", err)
		_ = p.client.StopAndCancel(ctx)
	}
	p.unsubscribe()
	select {
	case <-p.dispatched:
	case <-ctx.Done():
	}
	p.pool.Close()
	return err
}

// Submit inserts an echo job and returns the wait for its completion event.
func (p *Peer) Submit() load.Submit {
	args := echoArgs{Bench: "end-to-end"}
	return func(ctx context.Context, _ int, _ int64) (func() error, error) {
		res, err := p.client.Insert(ctx, args, nil)
		if err != nil {
			return nil, fmt.Errorf("insert: %w", err)
		}
		return func() error { _, err := p.await(ctx, res.Job.ID); return err }, nil
	}
}

// Run runs c.N jobs closed-loop with c.Concurrency callers, each with one job in flight, and
// stops the client. The error reports a failure to start or stop River; the jobs' own failures
// are in the Result.
func Run(ctx context.Context, c Config) (Result, error) {
	return run(ctx, c, func(p *Peer) load.Result {
		return load.Run(ctx, load.Params{Callers: c.Concurrency, N: c.N}, 0, p.Op())
	})
}

// RunPipelined runs c.N jobs with c.Concurrency callers inserting without waiting for their
// completions (load.RunPipelined): River's completion throughput with as many jobs in flight as
// the inserters put there.
func RunPipelined(ctx context.Context, c Config) (Result, error) {
	return run(ctx, c, func(p *Peer) load.Result {
		return load.RunPipelined(ctx, load.Params{Callers: c.Concurrency, N: c.N}, 0, p.Submit())
	})
}

func run(ctx context.Context, c Config, drive func(*Peer) load.Result) (Result, error) {
	if c.Concurrency < 1 {
		c.Concurrency = 1
	}
	p, err := Start(ctx, c)
	if err != nil {
		return Result{}, err
	}
	lr := drive(p)
	stopErr := p.Close(ctx)
	r := Result{
		Completed: lr.Requests, Errors: lr.Errors, FirstErr: lr.FirstErr,
		Elapsed: lr.Elapsed, P50: lr.P50, P99: lr.P99, Max: lr.Max,
		Config: p.Describe(),
	}
	r.QueueWaitP50, r.CompleteP50 = p.stats()
	return r, stopErr
}
