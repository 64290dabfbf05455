package dispatch

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	queuev1 "github.com/integrations-platform/integrations/pkg/gen/integrations/queue/v1"
	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/services/dispatcher/internal/store"
)

var (
	deadDispatchesRedriven = promauto.NewCounter(prometheus.CounterOpts{
		Name: "integrations_dispatcher_dead_letters_redriven_total",
		Help: "Dead-lettered dispatches sent back to the executions route because their attempt could still start.",
	})
	deadDispatchesCleared = promauto.NewCounter(prometheus.CounterOpts{
		Name: "integrations_dispatcher_dead_letters_cleared_total",
		Help: "Dead-lettered dispatches removed because their attempt started or their execution moved on since.",
	})
)

const (
	// deadLetterBatch is the most dead letters one recovery pass looks at.
	deadLetterBatch = 500
	// recoveryTimeout bounds one recovery pass.
	recoveryTimeout = 10 * time.Second
	// MaxRedrives is how many times the recoverer sends a dispatch back (counted by the port's
	// x-redriven header, which survives retries and dead-lettering). A dispatch lost to a blip
	// comes back after one redrive; one that fails every budget for its own sake (a poison: an
	// error that is not the connection's) would otherwise be redriven every pass, with a warning
	// each time, until its deadline. After the cap it stays in the DLQ for an operator, until the
	// sweeper settles its execution and the dead letter is cleared.
	MaxRedrives = 3
)

// DeadLetterQueue is the part of the message port the recovery uses.
type DeadLetterQueue interface {
	DeadLetters(ctx context.Context, route string, limit int) ([]mq.DeadLetter, error)
	Redrive(ctx context.Context, route string, ids []string) (int, error)
	Discard(ctx context.Context, route string, ids []string) (int, error)
}

// Recoverer brings back dispatches whose message was dead-lettered — the consumer could not do its
// own work (Postgres away) for longer than the executions route's port budget — instead of leaving
// their execution pending until the settlement sweeper fails it at its deadline
// (retry_exhausted.budget, "stranded"). Every interval it reads the head of the executions DLQ:
//   - a dispatch whose attempt could still start, and of which no record waits, is redriven: the
//     dead letter itself goes back to the work queue with a fresh budget (the consumer's
//     compare-and-set makes a duplicate harmless, and it defers one that is early);
//   - a dispatch whose attempt started since, or whose execution moved on or settled, is
//     discarded, counted and logged: its loss cost nothing, or was decided by the execution's own
//     rules, which the execution records;
//   - anything else stays: no such execution or a body that is not a dispatch (for an operator),
//     a record of the attempt that still waits (the dispatcher publishes it), an execution past
//     its deadline that the settlement sweeper is about to settle (no adapter should start work
//     for it now; once settled, the dead letter is cleared).
//
// A dispatch that keeps failing is redriven once per budget and pass, at most MaxRedrives times,
// and no longer once its execution's deadline settled it: bounded, and logged each time; the cap
// is logged once. Pass is not safe for concurrent use (Run calls it in turn).
type Recoverer struct {
	store    *store.Store
	dlq      DeadLetterQueue
	log      *zap.Logger
	interval time.Duration
	// capped is the dead letters last seen at the redrive cap, so that each is reported once.
	capped map[string]bool
	// redriven and cleared count what this recoverer did, for tests (the metrics are
	// process-wide).
	redriven, cleared atomic.Int64
}

// NewRecoverer returns a Recoverer that passes every interval.
func NewRecoverer(st *store.Store, dlq DeadLetterQueue, log *zap.Logger, interval time.Duration) *Recoverer {
	return &Recoverer{store: st, dlq: dlq, log: log, interval: interval}
}

// Run passes every interval until ctx ends.
func (r *Recoverer) Run(ctx context.Context) error {
	return lifecycle.Every(ctx, r.interval, nil, r.log, "dead-lettered dispatches not checked", r.Pass)
}

// Pass looks at the head of the executions DLQ once.
func (r *Recoverer) Pass(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, recoveryTimeout)
	defer cancel()
	dls, err := r.dlq.DeadLetters(ctx, routes.Executions.Name, deadLetterBatch)
	if err != nil || len(dls) == 0 {
		return err
	}
	type key struct {
		exec    string
		attempt int32
	}
	msgIDs := map[key][]string{}
	redriven := map[key]int{} // the most redrives of the key's copies
	var execs []string
	var attempts []int32
	for _, dl := range dls {
		var d queuev1.ExecutionDispatch
		if proto.Unmarshal(dl.Body, &d) != nil || uuid.Validate(d.GetExecutionId()) != nil || d.GetAttempt() < 1 {
			continue
		}
		k := key{d.GetExecutionId(), d.GetAttempt()}
		if _, seen := msgIDs[k]; !seen {
			execs = append(execs, k.exec)
			attempts = append(attempts, k.attempt)
		}
		msgIDs[k] = append(msgIDs[k], dl.ID)
		redriven[k] = max(redriven[k], dl.Redriven)
	}
	if len(execs) == 0 {
		return nil
	}
	states, err := r.store.DeadDispatchStates(ctx, execs, attempts)
	if err != nil {
		return err
	}
	var redrive, discard []string
	capped := map[string]bool{}
	for _, s := range states {
		k := key{s.ExecutionID, s.Attempt}
		ids := msgIDs[k]
		switch {
		case !s.Known, s.Expired:
			// Unexplained, or about to be settled by the sweeper: the next pass decides.
		case s.Startable && !s.Waiting && redriven[k] >= MaxRedrives:
			// It failed every budget it was given: not a blip. Left for an operator (and cleared
			// once the sweeper settles its execution).
			for _, id := range ids {
				capped[id] = true
				if !r.capped[id] {
					r.log.Error("dispatch dead-lettered again after its redrives; left in the DLQ",
						zap.String("message_id", id), zap.Int("redrives", redriven[k]))
				}
			}
		case s.Startable && !s.Waiting:
			// All copies share the attempt's message id; Redrive moves every one, and the consumer
			// starts the attempt once.
			redrive = append(redrive, ids...)
		case !s.Startable && !s.Waiting:
			discard = append(discard, ids...)
		}
	}
	r.capped = capped
	if len(redrive) > 0 {
		moved, err := r.dlq.Redrive(ctx, routes.Executions.Name, redrive)
		if moved > 0 {
			deadDispatchesRedriven.Add(float64(moved))
			r.redriven.Add(int64(moved))
			r.log.Warn("dispatches dead-lettered; sent back to the executions route", zap.Int("dispatches", moved))
		}
		if err != nil {
			return err
		}
	}
	if len(discard) > 0 {
		removed, err := r.dlq.Discard(ctx, routes.Executions.Name, discard)
		if removed > 0 {
			deadDispatchesCleared.Add(float64(removed))
			r.cleared.Add(int64(removed))
			r.log.Info("dead-lettered dispatches cleared: their attempt started or their execution moved on since",
				zap.Int("dispatches", removed))
		}
		if err != nil {
			return err
		}
	}
	return nil
}
