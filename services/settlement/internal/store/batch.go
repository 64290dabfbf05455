package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// Batching of concurrent settlements (Settle and FailAttempt calls): each batch is one pipelined
// round trip of one statement per settlement, all in one implicit transaction (the batch is sent
// with a single Sync), so one commit — one WAL flush — for the batch. One batch at a time: while
// it commits, the next gathers; with two in flight a free runner takes the first one or two
// callers at once and the batches stay small (BenchmarkSettleConcurrent, 64 callers: 32
// settlements a batch and 0.32 ms each with one, 8 and 0.41–0.59 ms with two). 64 is above the
// settlements in flight at the bench's concurrency.
//
// A batch does not wait on a row lock for long: an execution locked elsewhere (a sweeper pass, a
// cancellation, another replica's batch, a transaction left open) would otherwise hold every
// settlement queued behind the batch for as long as the lock is held. A batch's statements wait
// at most batchLockTimeout for a lock; past it the batch is rolled back and run again one
// settlement at a time under the same bound, and a settlement that still cannot have its lock
// leaves the batcher (errLockWait) and waits for it on its own, holding up nobody else.
const (
	settleBatchMax         = 64
	settleBatchConcurrency = 1
	batchLockTimeout       = 500 * time.Millisecond
)

// errLockWait is a batched settlement whose execution stayed locked past batchLockTimeout: its
// caller runs it outside the batcher.
var errLockWait = errors.New("execution locked by another transaction")

// lockTimeoutSQL bounds the lock waits of the transaction it runs in (set_config's is_local: a
// pipeline sent with one Sync is one implicit transaction, and the setting ends with it).
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

func (s *Store) lockTimeoutArg() string { return fmt.Sprintf("%dms", s.lockTimeout.Milliseconds()) }

// settleRequest is one settlement to batch: exactly one of settle and fail is set.
type settleRequest struct {
	settle *Outcome
	fail   *AttemptFailure
}

// settleAnswered is a settleRequest's answer: the one of settled and failed that its kind asks.
type settleAnswered struct {
	settled *Settled
	failed  *AttemptFailed
}

func (r settleRequest) executionID() string {
	if r.settle != nil {
		return r.settle.ExecutionID
	}
	return r.fail.ExecutionID
}

// SettleStats are the settlement batcher's counts (batches, settlements in them, the largest).
func (s *Store) SettleStats() batch.Stats { return s.batcher.Stats() }

// settleBatch runs one batch of settlements in one transaction. The compare-and-set is each
// statement's own: a loser gets its conflict answer and moves nothing, the others settle. The
// statements run in the order of their execution ids, so that two batches running at once (of two
// replicas) lock their executions in the same order (no deadlock between them), and two
// settlements of the same execution in one batch run one after the other: the second sees the
// first's write (each statement of a read-committed transaction takes a new snapshot) and loses.
//
// A batch whose connection is lost (or whose context ends) fails every caller with that error, a
// connection error that the callers see as UNAVAILABLE: retry. Its transaction did not commit,
// unless the connection was lost after the commit was sent — the same uncertainty as a lost
// COMMIT, which a retry resolves (it finds the execution settled). A batch that fails on a
// statement's error (which rolled the whole batch back) is run again one settlement per
// statement, so that each caller gets its own answer and only the faulty one its error.
func (s *Store) settleBatch(ctx context.Context, reqs []settleRequest) ([]settleAnswered, []error, error) {
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(reqs[i].executionID(), reqs[j].executionID()) })

	for _, r := range reqs {
		if r.fail != nil && r.fail.Policy == nil {
			return nil, nil, fmt.Errorf("settle a batch: the failed attempt of %s came without its retry policy", r.fail.ExecutionID)
		}
	}
	eventIDs := make([]uuid.UUID, len(reqs))
	b := &pgx.Batch{}
	b.Queue(lockTimeoutSQL, s.lockTimeoutArg())
	for _, i := range order {
		id, err := newEventID()
		if err != nil {
			return nil, nil, err
		}
		eventIDs[i] = id
		if r := reqs[i]; r.settle != nil {
			b.Queue(settleSQL, settleArgs(*r.settle, id)...)
		} else {
			b.Queue(attemptFailSQL, attemptFailArgs(*r.fail, id)...)
		}
	}
	answers := make([]settleAnswered, len(reqs))
	errs := make([]error, len(reqs))
	br := s.pool.SendBatch(ctx, b)
	var failed error
	if _, err := br.Exec(); err != nil {
		failed = err
	}
	for _, i := range order {
		if failed != nil {
			break
		}
		r := reqs[i]
		if r.settle != nil {
			a, err := scanSettled(br.QueryRow())
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				failed = err
				break
			}
			answers[i].settled, errs[i] = settleAnswer(*r.settle, eventIDs[i], a, err)
			continue
		}
		var (
			status *execution.Status
			reason *string
			next   *time.Time
		)
		a, err := scanSettled(br.QueryRow(), &status, &reason, &next)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			failed = err
			break
		}
		answers[i].failed, errs[i] = attemptFailAnswer(*r.fail, eventIDs[i], a, status, reason, next, err)
	}
	// Close reads the commit's answer: until it has, nothing is known to be written.
	if err := br.Close(); err != nil && failed == nil {
		failed = err
	}
	if failed == nil {
		return answers, errs, nil
	}
	if db.IsConnectionError(failed) || ctx.Err() != nil {
		return nil, nil, fmt.Errorf("settle a batch of %d: %w", len(reqs), failed)
	}
	// A statement's error (or a lock wait past the bound) rolled the batch back: each settlement
	// on its own, each lock wait still bounded; one whose execution stays locked goes back to its
	// caller to wait alone.
	for i, r := range reqs {
		a, err := s.settleBounded(ctx, r)
		if db.IsLockTimeout(err) {
			err = errLockWait
		}
		answers[i], errs[i] = a, err
	}
	return answers, errs, nil
}

// settleBounded runs one settlement in a transaction of its own whose lock waits last at most
// the batch's bound.
func (s *Store) settleBounded(ctx context.Context, r settleRequest) (settleAnswered, error) {
	var out settleAnswered
	err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockTimeoutSQL, s.lockTimeoutArg()); err != nil {
			return fmt.Errorf("bound lock waits: %w", err)
		}
		var err error
		out, err = s.settleIn(ctx, tx, r)
		return err
	})
	return out, err
}

// settleOne runs one settlement in a statement of its own.
func (s *Store) settleOne(ctx context.Context, r settleRequest) (settleAnswered, error) {
	return s.settleIn(ctx, s.pool, r)
}

func (s *Store) settleIn(ctx context.Context, q querier, r settleRequest) (settleAnswered, error) {
	if r.settle != nil {
		out, err := settle(ctx, q, *r.settle)
		return settleAnswered{settled: out}, err
	}
	out, err := attemptFail(ctx, q, *r.fail)
	return settleAnswered{failed: out}, err
}
