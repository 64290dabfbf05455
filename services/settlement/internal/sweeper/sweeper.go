// Package sweeper ends the attempts nobody else will end: running executions whose lease expired
// (the adapter went silent, or the consumer that ran the attempt died) or whose deadline passed.
// Each is a timeout failure of its attempt, decided by the same retry rules as every other failed
// attempt (store.ExecutionSweep). Several replicas sweep at once without meeting: the claim skips
// locked rows.
package sweeper

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/services/settlement/internal/store"
)

// Outcomes of a swept execution, as counted.
const (
	OutcomeRetried = "retried"
	OutcomeFailed  = "failed"
)

var (
	swept = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "integrations_sweeper_swept_total",
		Help: "Running executions whose lease expired or deadline passed, by what followed: retried (next attempt scheduled) or failed (settled).",
	}, []string{"outcome"})
	lastRun = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "integrations_sweeper_last_run_timestamp_seconds",
		Help: "Unix time of the sweeper's last completed pass; alert when it is stale.",
	})
)

func init() {
	// Both series exist from the start, so that a rate over them is defined before the first sweep.
	swept.WithLabelValues(OutcomeRetried)
	swept.WithLabelValues(OutcomeFailed)
}

// DefaultBatchSize is how many executions one transaction claims.
const DefaultBatchSize = 100

// Options configures a Sweeper.
type Options struct {
	// Interval between passes.
	Interval time.Duration
	// BatchSize is how many executions one transaction claims; 0 means DefaultBatchSize.
	BatchSize int
	// Grace is how long after a lease or deadline passed an execution is swept (see
	// store.ExecutionSweep).
	Grace time.Duration
	// Scale shrinks the retry schedule's delays (INTEGRATIONS_TIME_SCALE).
	Scale func(time.Duration) time.Duration
	// Nudge wakes the dispatcher after a next attempt was scheduled.
	Nudge  func()
	Logger *zap.Logger
}

// Sweeper runs the passes.
type Sweeper struct {
	store *store.Store
	opts  Options
	log   *zap.Logger
}

// New returns a Sweeper.
func New(st *store.Store, opts Options) *Sweeper {
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.Nudge == nil {
		opts.Nudge = func() {}
	}
	opts.Logger = cmp.Or(opts.Logger, zap.NewNop())
	return &Sweeper{store: st, opts: opts, log: opts.Logger}
}

// Run passes every interval until ctx ends.
func (s *Sweeper) Run(ctx context.Context) error {
	return lifecycle.Every(ctx, s.opts.Interval, nil, s.log, "sweep pass failed", func(ctx context.Context) error {
		_, err := s.Pass(ctx)
		return err
	})
}

// Counts is what one pass did.
type Counts struct {
	Retried, Failed, Errors int
}

// Pass sweeps, batch by batch, until a batch comes back short; then it records the time.
func (s *Sweeper) Pass(ctx context.Context) (Counts, error) {
	total, err := s.sweep(func() ([]store.Swept, error) {
		return s.store.ExecutionSweep(ctx, s.opts.BatchSize, s.opts.Grace, s.opts.Scale)
	})
	if err != nil {
		return total, err
	}
	stranded, err := s.sweep(func() ([]store.Swept, error) {
		return s.store.ExecutionSweepStranded(ctx, s.opts.BatchSize, s.opts.Grace)
	})
	total.Failed += stranded.Failed
	total.Errors += stranded.Errors
	if err != nil {
		return total, err
	}
	lastRun.SetToCurrentTime()
	return total, nil
}

// sweep runs one kind of sweep batch by batch until a batch comes back short.
func (s *Sweeper) sweep(batch func() ([]store.Swept, error)) (Counts, error) {
	var total Counts
	for {
		list, err := batch()
		if err != nil {
			return total, err
		}
		c := s.report(list)
		total.Retried += c.Retried
		total.Failed += c.Failed
		total.Errors += c.Errors
		if c.Retried > 0 {
			s.opts.Nudge()
		}
		// A batch whose every row failed would be claimed again at once: wait for the next pass.
		if len(list) < s.opts.BatchSize || c.Errors == len(list) {
			return total, nil
		}
	}
}

func (s *Sweeper) report(list []store.Swept) Counts {
	var c Counts
	for _, sw := range list {
		fields := []zap.Field{log.ExecutionID(sw.ExecutionID), log.Attempt(sw.Attempt), zap.String("cause", sw.Cause)}
		switch {
		case sw.Err != nil:
			c.Errors++
			s.log.Error("sweep of execution failed", append(fields, zap.Error(sw.Err))...)
		case sw.Result.NextAttemptAt != nil:
			c.Retried++
			swept.WithLabelValues(OutcomeRetried).Inc()
			s.log.Info("attempt timed out, next scheduled", append(fields, zap.Time("next_attempt_at", *sw.Result.NextAttemptAt))...)
		default:
			c.Failed++
			swept.WithLabelValues(OutcomeFailed).Inc()
			s.log.Info("attempt timed out, execution settled", append(fields,
				zap.String("status", string(sw.Result.Execution.Status)), zap.String("reason", str(sw.Result.Execution.FailureReason)),
				log.EventID(sw.Result.EventID))...)
		}
	}
	return c
}

func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
