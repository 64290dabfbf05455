// Package store is the SQL the execution-consumer owns: starting an attempt with one compare of
// status and attempt number, and recording an adapter's lease.
package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/db"

	"github.com/integrations-platform/integrations/pkg/execution"
)

// ErrNotStartable means the execution is not pending at the attempt before this one: the message
// is a duplicate, or obsolete (the execution moved on or settled).
var ErrNotStartable = errors.New("attempt is not startable")

// EarlyError means the dispatch arrived before its due time, by the database's clock: the attempt
// did not start, and could start in By.
type EarlyError struct{ By time.Duration }

func (e *EarlyError) Error() string { return fmt.Sprintf("attempt is due in %v", e.By) }

// Started is an attempt that this consumer now owns.
type Started struct {
	ExecutionID     string
	Attempt         int32
	Capability      string
	Mode            string
	Payload         []byte
	Deadline        time.Time
	AdapterEndpoint string
	AdapterID       string // the adapter's catalog id: the audience of the platform's token
	Lease           time.Duration
	// Remaining is how long the attempt may run, as the database measured it when it started the
	// attempt: until the lease it wrote or the deadline, whichever comes first. A call bounded by
	// it ends when the sweeper will consider the attempt over, whatever this host's clock says
	// (Deadline is the database's time, for messages and logs, not for local timers).
	Remaining time.Duration
	// DeadlineIn is how long until Deadline, as the database measured it when it started the
	// attempt: what the adapter is told to count its deadline from.
	DeadlineIn time.Duration
	// Overdue is how late the attempt started after the dispatch's due time, as the database
	// measured it (0 without a due time).
	Overdue time.Duration
	// PendingFor is how long the execution had been waiting for this attempt when it started, as
	// the database measured it: since the previous attempt ended, or since the execution was
	// created. Unlike Overdue it keeps growing while the attempt is rescheduled (AttemptUndo writes
	// a new due time each time), so that a long adapter outage is polled less often.
	PendingFor time.Duration
	// Measured is this host's time just before the statement that started the attempt (with its
	// monotonic reading): Remaining, DeadlineIn, Overdue and Lease count from the database's now(),
	// which is no earlier, so that times counted from Measured on this host's clock end no later
	// than the database's. See LocalDeadline and LocalLeaseEnd.
	Measured time.Time
}

// LocalDeadline is the execution's deadline on this host's monotonic clock, no later than the
// database's: for local timers and bounds, never for SQL.
func (r *Started) LocalDeadline() time.Time { return r.Measured.Add(r.DeadlineIn) }

// LocalLeaseEnd is when the attempt's first lease ends, on this host's monotonic clock, no later
// than the database's lease_expires_at: for local timers and bounds, never for SQL.
func (r *Started) LocalLeaseEnd() time.Time { return r.Measured.Add(r.Lease) }

// LocalCallDeadline is when the adapter call must end: the lease or the deadline, whichever comes
// first, on this host's monotonic clock.
func (r *Started) LocalCallDeadline() time.Time { return r.Measured.Add(r.Remaining) }

// PastDeadlineError means the execution is pending at the attempt before this one but its
// deadline has passed: no attempt may start. The caller settles it failed with
// retry_exhausted.budget (the settlement sweeper would, later). Class is the execution's last
// failure class ("" if none).
type PastDeadlineError struct{ Class string }

func (e *PastDeadlineError) Error() string { return "the execution's deadline has passed" }

// Store is the consumer's data access.
type Store struct {
	pool *pgxpool.Pool
	// tolerance is how early a dispatch may arrive and still start (see WithEarlyTolerance).
	tolerance time.Duration
	starts    *batch.Batcher[startRequest, startAnswer]
}

// Batching of concurrent attempt starts: the consumer's handlers run concurrently (the route's
// prefetch, INTEGRATIONS_CONSUMER_CONCURRENCY), and each batch of them is one statement and one
// commit. Two batches may run at once so that one commit's flush overlaps the next batch's
// gathering; 64 covers the executions route's prefetch (32) of two subscriptions.
const (
	startBatchMax         = 64
	startBatchConcurrency = 2
)

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store {
	s := &Store{pool: pool}
	s.starts = batch.New(s.startBatch, batch.Options{Name: "attempt start", MaxSize: startBatchMax, Concurrency: startBatchConcurrency})
	return s
}

// WithEarlyTolerance sets how early (by the database's clock) a dispatch may arrive and still
// start its attempt: mq.DelayTolerance time-scaled (50 ms unscaled). Deferring it for those
// milliseconds would cost a held worker and a second start statement, or a holding-queue hop,
// for nothing. 0 (the default) starts nothing early. Call before use.
func (s *Store) WithEarlyTolerance(d time.Duration) *Store {
	s.tolerance = max(d, 0)
	return s
}

// StartStats are the attempt-start batcher's counts (batches, attempts in them, the largest).
func (s *Store) StartStats() batch.Stats { return s.starts.Stats() }

// AttemptStart claims attempt n of the execution: an UPDATE that succeeds only if the execution
// is pending at attempt n-1, so that of any number of copies of the dispatch message exactly one
// starts the attempt. With it, in the same statement (one round trip, one commit), the attempt's
// row and its callback token hash are inserted. scale shrinks the capability's lease as the
// service's time scale does (it must be linear, as config.Common.Scale is).
//
// Concurrent calls are coalesced (pkg/batch): a batch is one statement over arrays, each row with
// its own compare, and each caller gets its own answer — one that cannot start does not hold back
// the others. A batch whose statement fails gives every caller of it the error (a connection
// terminated, a deadlock: retryable); a failure that one row could cause (a constraint) runs the
// batch's requests again one by one, so that only that row's caller gets it.
//
// due is the dispatch's due time (zero: none), as the database wrote it. The same statement
// compares it with the database's now(): a dispatch that arrived early by the early tolerance or
// more starts nothing and gets an *EarlyError saying by how much, if the attempt could start
// then, or ErrNotStartable if it never could (a duplicate, or the execution moved on or settled),
// so that such a message is dropped instead of being carried to its due time. An execution whose
// deadline has passed starts nothing and gets a *PastDeadlineError. The consumer's clock plays no
// part.
func (s *Store) AttemptStart(ctx context.Context, id string, n int32, tokenHash []byte, scale func(time.Duration) time.Duration, due time.Time) (*Started, error) {
	a, err := s.starts.Do(ctx, startRequest{id: id, n: n, tokenHash: tokenHash, scale: scale(time.Second).Seconds(), due: due})
	if err != nil {
		return nil, fmt.Errorf("start attempt %d of %s: %w", n, id, err)
	}
	if a.err != nil {
		return nil, a.err
	}
	a.started.Lease = scale(a.lease)
	return a.started, nil
}

// startRequest is one AttemptStart in a batch.
type startRequest struct {
	id        string
	n         int32
	tokenHash []byte
	scale     float64 // the time scale: scale(1 s) in seconds
	due       time.Time
}

// startAnswer is one request's answer: started, or err (ErrNotStartable, *EarlyError,
// *PastDeadlineError).
type startAnswer struct {
	started *Started
	lease   time.Duration // the capability's lease, unscaled
	err     error
}

// startBatch runs one batch of attempt starts, in one statement.
func (s *Store) startBatch(ctx context.Context, reqs []startRequest) ([]startAnswer, []error, error) {
	answers, err := s.startStatement(ctx, reqs)
	if err == nil || len(reqs) == 1 || !db.IsRowError(err) {
		return answers, nil, err
	}
	// A row's own fault fails the whole statement: find whose, one statement each.
	answers = make([]startAnswer, len(reqs))
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		one, err := s.startStatement(ctx, []startRequest{r})
		if err != nil {
			errs[i] = err
			continue
		}
		answers[i] = one[0]
	}
	return answers, errs, nil
}

// startSQL is startStatement's statement (Start, for a batch): see startStatement.
var startSQL = `
		WITH k AS (
			SELECT * FROM unnest($1::uuid[], $2::int[], $3::bytea[], $4::float8[], $5::timestamptz[], $6::int[])
				AS k(id, n, token_hash, scale, due, ord)
		), clock AS (
			SELECT k.ord,
				greatest(coalesce(extract(epoch FROM k.due - now()), 0), 0)::float8 AS early,
				greatest(coalesce(extract(epoch FROM now() - k.due), 0), 0)::float8 AS overdue
			FROM k
		), lk AS (
			-- The batch's executions locked in id order, as settlement batches lock theirs: two
			-- batches of either kind touching the same executions cannot deadlock. The UPDATE
			-- reaches them by the locked versions' ctid (a Tid Scan): joined by id, the planner
			-- chose, on statistics not yet caught up with a backlog, to walk every pending
			-- execution by the pending-deadline index and match each to the batch — 64 ms for a
			-- batch of 14 over 20 000 pending, against 0.4 ms (issue 13's pipelined bench: 7 ms of
			-- Postgres CPU per start, three quarters of its CPU).
			SELECT e.id, e.ctid AS tid FROM k JOIN executions e ON e.id = k.id ORDER BY e.id FOR UPDATE OF e
		), started AS (
			UPDATE executions e
			SET status = ` + execution.Start.ToSQL() + `, attempt = k.n,
				lease_expires_at = now() + make_interval(secs => c.lease_ms / 1000.0 * k.scale), updated_at = now()
			FROM k JOIN clock ON clock.ord = k.ord JOIN lk ON lk.id = k.id, capabilities c, adapters a
			WHERE e.ctid = lk.tid AND e.id = k.id AND ` + execution.Start.FromSQL("e.status") + ` AND e.attempt = k.n - 1 AND k.n <= e.max_attempts
				AND e.deadline_at > now() AND (clock.early = 0 OR clock.early < $7)
				AND c.name = e.capability AND a.id = c.adapter_id
			RETURNING k.ord, k.token_hash, e.id, e.capability, e.mode, e.payload, e.deadline_at, a.id AS adapter_id, a.endpoint, c.lease_ms,
				extract(epoch FROM least(e.lease_expires_at, e.deadline_at) - now())::float8 AS remaining,
				extract(epoch FROM e.deadline_at - now())::float8 AS deadline_in,
				greatest(extract(epoch FROM now() - coalesce(
					(SELECT p.ended_at FROM execution_attempts p WHERE p.execution_id = e.id AND p.n = k.n - 1),
					e.created_at)), 0)::float8 AS pending_for
		), attempt AS (
			INSERT INTO execution_attempts (execution_id, n, callback_token_hash)
			SELECT s.id, k.n, s.token_hash FROM started s JOIN k ON k.ord = s.ord
		)
		SELECT k.ord, clock.early, clock.overdue,
			coalesce(` + execution.Start.FromSQL("e.status") + ` AND e.attempt = k.n - 1 AND k.n <= e.max_attempts, false),
			coalesce(e.deadline_at <= now(), false), coalesce(e.failure_class, ''),
			s.capability, s.mode, s.payload, s.deadline_at, s.adapter_id, s.endpoint, s.lease_ms,
			s.remaining, s.deadline_in, s.pending_for
		FROM k JOIN clock ON clock.ord = k.ord
			LEFT JOIN executions e ON e.id = k.id
			LEFT JOIN started s ON s.ord = k.ord`

// startStatement starts reqs in one statement and answers each, in order. Rows are sent in
// execution-id order, so that two batches holding the same executions (duplicate messages)
// lock them in the same order.
func (s *Store) startStatement(ctx context.Context, reqs []startRequest) ([]startAnswer, error) {
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(reqs[a].id, reqs[b].id) })
	var (
		ids    = make([]string, len(reqs))
		ns     = make([]int32, len(reqs))
		hashes = make([][]byte, len(reqs))
		scales = make([]float64, len(reqs))
		dues   = make([]*time.Time, len(reqs))
		ords   = make([]int32, len(reqs))
	)
	for j, i := range order {
		r := reqs[i]
		ids[j], ns[j], hashes[j], scales[j], ords[j] = r.id, r.n, r.tokenHash, r.scale, int32(i)
		if !r.due.IsZero() {
			due := r.due
			dues[j] = &due
		}
	}
	measured := time.Now()
	// Per row: clock says how early or overdue the dispatch is; started is the compare and set
	// (pending at n-1, deadline not passed, not early beyond the tolerance, within max_attempts);
	// the final select answers every row from the statement's snapshot, whether it started or not.
	// RETURNING carries what the adapter call needs (the payload is its input) and nothing else.
	rows, err := s.pool.Query(ctx, startSQL,
		ids, ns, hashes, scales, dues, ords, s.tolerance.Seconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	answers := make([]startAnswer, len(reqs))
	seen := 0
	for rows.Next() {
		var (
			ord                            int32
			early, overdue                 float64
			startable, pastDeadline        bool
			class                          string
			capability, mode               *string
			payload                        []byte
			deadline                       *time.Time
			adapterID, endpoint            *string
			leaseMS                        *int64
			remaining, deadlineIn, pending *float64
		)
		if err := rows.Scan(&ord, &early, &overdue, &startable, &pastDeadline, &class, &capability, &mode, &payload,
			&deadline, &adapterID, &endpoint, &leaseMS, &remaining, &deadlineIn, &pending); err != nil {
			return nil, err
		}
		if ord < 0 || int(ord) >= len(reqs) {
			return nil, fmt.Errorf("attempt start answered an unknown row %d", ord)
		}
		seen++
		r := reqs[ord]
		a := &answers[ord]
		switch {
		case capability != nil:
			a.lease = time.Duration(*leaseMS) * time.Millisecond
			a.started = &Started{ExecutionID: r.id, Attempt: r.n, Capability: *capability, Mode: *mode, Payload: payload,
				Deadline: *deadline, AdapterID: *adapterID, AdapterEndpoint: *endpoint,
				Remaining:  max(time.Duration(*remaining*float64(time.Second)), 0),
				DeadlineIn: max(time.Duration(*deadlineIn*float64(time.Second)), 0),
				Overdue:    time.Duration(overdue * float64(time.Second)),
				PendingFor: time.Duration(*pending * float64(time.Second)),
				Measured:   measured,
			}
		case !startable:
			a.err = ErrNotStartable
		case pastDeadline:
			a.err = &PastDeadlineError{Class: class}
		case early > 0 && early >= s.tolerance.Seconds():
			a.err = &EarlyError{By: time.Duration(early * float64(time.Second))}
		default:
			// Startable and due, yet not started: the execution's capability or adapter is gone,
			// or a copy of the same dispatch in this batch started it.
			a.err = ErrNotStartable
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if seen != len(reqs) {
		return nil, fmt.Errorf("attempt start answered %d of %d rows", seen, len(reqs))
	}
	return answers, nil
}

// acceptedSQL is AttemptAccepted's statement (Renew): $1 id, $2 attempt, $3 lease in seconds.
var acceptedSQL = `
		WITH e AS (
			UPDATE executions SET lease_expires_at = least(now() + make_interval(secs => $3), deadline_at), updated_at = now()
			WHERE id = $1 AND ` + execution.Renew.FromSQL("status") + ` AND attempt = $2
			RETURNING id
		)
		UPDATE execution_attempts SET outcome = ` + execution.Literal(execution.AttemptAccepted) + `
		WHERE execution_id = (SELECT id FROM e) AND n = $2`

// AttemptAccepted records that the adapter took the attempt as long-running work under a lease.
// It changes nothing if the attempt is no longer the running one.
func (s *Store) AttemptAccepted(ctx context.Context, id string, n int32, lease time.Duration) error {
	_, err := s.pool.Exec(ctx, acceptedSQL, id, n, lease.Seconds())
	if err != nil {
		return fmt.Errorf("record accepted attempt %d of %s: %w", n, id, err)
	}
	return nil
}

// undoSQL is AttemptUndo's statement (Undo): $1 id, $2 attempt, $3 delay in seconds.
var undoSQL = `
		WITH e AS (
			UPDATE executions SET status = ` + execution.Undo.ToSQL() + `, attempt = $2 - 1, lease_expires_at = NULL, updated_at = now()
			WHERE id = $1 AND ` + execution.Undo.FromSQL("status") + ` AND attempt = $2
			RETURNING id
		), a AS (
			DELETE FROM execution_attempts WHERE execution_id = (SELECT id FROM e) AND n = $2
		), d AS (
			INSERT INTO dispatches (execution_id, attempt, due_at)
			SELECT id, $2, now() + make_interval(secs => $3) FROM e
			ON CONFLICT (execution_id, attempt) DO UPDATE SET due_at = EXCLUDED.due_at, claimed_until = NULL
		)
		SELECT EXISTS (SELECT 1 FROM e)`

// AttemptUndo takes back the start of attempt n, for an attempt whose adapter call provably sent
// nothing (the adapter could not be reached), and schedules the same attempt again in delay: the
// execution returns to pending at attempt n-1, the attempt's row is deleted, and a dispatch record
// for attempt n, due at the database's now() + delay, is written — all in one statement, so that
// the retry lives in Postgres whatever happens to the message that carried the attempt (a
// subscription that died meanwhile cannot publish a deferred copy; the dispatcher publishes the
// record). An existing record for the attempt is taken over, not kept: it is most often the very
// record whose message brought this attempt, published but not yet deleted by the dispatcher,
// which deletes it only while its own claim holds (claimed_until = its claim). Clearing the
// claim and moving its due time makes that delete miss, so the retry survives; keeping the row as
// it was (DO NOTHING) lost the retry to that delete (found by make chaos: executions left pending
// at attempt 0 with no record). It reports false, changing nothing, if the attempt is no longer
// the running one.
func (s *Store) AttemptUndo(ctx context.Context, id string, n int32, delay time.Duration) (bool, error) {
	var undone bool
	err := s.pool.QueryRow(ctx, undoSQL, id, n, delay.Seconds()).Scan(&undone)
	if err != nil {
		return false, fmt.Errorf("undo start of attempt %d of %s: %w", n, id, err)
	}
	return undone, nil
}
