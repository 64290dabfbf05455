// Package store is the SQL the execution-consumer owns: starting an attempt with one compare of
// status and attempt number, and recording an adapter's lease.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	LeaseExpiresAt  time.Time
	AdapterEndpoint string
	AdapterID       string // the adapter's catalog id: the audience of the platform's token
	Lease           time.Duration
	// Remaining is how long the attempt may run, as the database measured it when it started the
	// attempt: until the lease it wrote or the deadline, whichever comes first. A call bounded by
	// it ends when the sweeper will consider the attempt over, whatever this host's clock says
	// (Deadline and LeaseExpiresAt are the database's times, for messages and logs, not for local
	// timers).
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

// Store is the consumer's data access.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// AttemptStart claims attempt n of the execution: one UPDATE that succeeds only if the execution
// is pending at attempt n-1, so that of any number of copies of the dispatch message exactly one
// starts the attempt. With it, in the same statement (one round trip, one commit), the attempt's
// row and its callback token hash are inserted. scale shrinks the capability's lease as the
// service's time scale does (it must be linear, as config.Common.Scale is).
//
// due is the dispatch's due time (zero: none), as the database wrote it. The same statement
// compares it with the database's now(): a dispatch that arrived early starts nothing and gets an
// *EarlyError saying by how much, if the attempt could start then, or ErrNotStartable if it never
// could (a duplicate, or the execution moved on or settled), so that such a message is dropped
// instead of being carried to its due time. The consumer's clock plays no part.
func (s *Store) AttemptStart(ctx context.Context, id string, n int32, tokenHash []byte, scale func(time.Duration) time.Duration, due time.Time) (*Started, error) {
	r := Started{ExecutionID: id, Attempt: n}
	var (
		dueAt               *time.Time
		early, remaining    *float64
		deadlineIn, overdue *float64
		pendingFor          *float64
		startable           bool
		capability, mode    *string
		payload             []byte
		deadline, leaseEnds *time.Time
		endpoint, adapterID *string
		leaseMS             *int64
	)
	if !due.IsZero() {
		dueAt = &due
	}
	r.Measured = time.Now()
	err := s.pool.QueryRow(ctx, `
		WITH clock AS (
			SELECT greatest(coalesce(extract(epoch FROM $5::timestamptz - now()), 0), 0)::float8 AS early,
				greatest(coalesce(extract(epoch FROM now() - $5::timestamptz), 0), 0)::float8 AS overdue
		), started AS (
			UPDATE executions e
			SET status = 'running', attempt = $2,
				lease_expires_at = now() + make_interval(secs => c.lease_ms / 1000.0 * $4), updated_at = now()
			FROM capabilities c, adapters a
			WHERE e.id = $1 AND e.status = 'pending' AND e.attempt = $2 - 1
				AND c.name = e.capability AND a.id = c.adapter_id
				AND (SELECT early FROM clock) = 0
			RETURNING e.capability, e.mode, e.payload, e.deadline_at, e.lease_expires_at, a.id AS adapter_id, a.endpoint, c.lease_ms,
				extract(epoch FROM least(e.lease_expires_at, e.deadline_at) - now())::float8 AS remaining,
				extract(epoch FROM e.deadline_at - now())::float8 AS deadline_in,
				greatest(extract(epoch FROM now() - coalesce(
					(SELECT p.ended_at FROM execution_attempts p WHERE p.execution_id = e.id AND p.n = $2 - 1),
					e.created_at)), 0)::float8 AS pending_for
		), attempt AS (
			INSERT INTO execution_attempts (execution_id, n, callback_token_hash) SELECT $1, $2, $3 FROM started
		)
		SELECT (SELECT early FROM clock), (SELECT overdue FROM clock),
			EXISTS (SELECT 1 FROM executions WHERE id = $1 AND status = 'pending' AND attempt = $2 - 1),
			started.*
		FROM (SELECT) one LEFT JOIN started ON true`,
		id, n, tokenHash, scale(time.Second).Seconds(), dueAt).
		Scan(&early, &overdue, &startable, &capability, &mode, &payload, &deadline, &leaseEnds, &adapterID, &endpoint, &leaseMS, &remaining, &deadlineIn, &pendingFor)
	if err != nil {
		return nil, fmt.Errorf("start attempt %d of %s: %w", n, id, err)
	}
	switch {
	case capability != nil:
	case !startable:
		return nil, ErrNotStartable
	case *early > 0:
		return nil, &EarlyError{By: time.Duration(*early * float64(time.Second))}
	default:
		// Startable and due, yet not started: the execution's capability or adapter is gone.
		return nil, ErrNotStartable
	}
	r.Capability, r.Mode, r.Payload, r.Deadline, r.LeaseExpiresAt, r.AdapterID, r.AdapterEndpoint =
		*capability, *mode, payload, *deadline, *leaseEnds, *adapterID, *endpoint
	r.Lease = scale(time.Duration(*leaseMS) * time.Millisecond)
	r.Remaining = max(time.Duration(*remaining*float64(time.Second)), 0)
	r.DeadlineIn = max(time.Duration(*deadlineIn*float64(time.Second)), 0)
	r.Overdue = time.Duration(*overdue * float64(time.Second))
	r.PendingFor = time.Duration(*pendingFor * float64(time.Second))
	return &r, nil
}

// AttemptAccepted records that the adapter took the attempt as long-running work under a lease.
// It changes nothing if the attempt is no longer the running one.
func (s *Store) AttemptAccepted(ctx context.Context, id string, n int32, lease time.Duration) error {
	_, err := s.pool.Exec(ctx, `
		WITH e AS (
			UPDATE executions SET lease_expires_at = least(now() + make_interval(secs => $3), deadline_at), updated_at = now()
			WHERE id = $1 AND status = 'running' AND attempt = $2
			RETURNING id
		)
		UPDATE execution_attempts SET outcome = 'accepted'
		WHERE execution_id = (SELECT id FROM e) AND n = $2`, id, n, lease.Seconds())
	if err != nil {
		return fmt.Errorf("record accepted attempt %d of %s: %w", n, id, err)
	}
	return nil
}

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
	err := s.pool.QueryRow(ctx, `
		WITH e AS (
			UPDATE executions SET status = 'pending', attempt = $2 - 1, lease_expires_at = NULL, updated_at = now()
			WHERE id = $1 AND status = 'running' AND attempt = $2
			RETURNING id
		), a AS (
			DELETE FROM execution_attempts WHERE execution_id = (SELECT id FROM e) AND n = $2
		), d AS (
			INSERT INTO dispatches (execution_id, attempt, due_at)
			SELECT id, $2, now() + make_interval(secs => $3) FROM e
			ON CONFLICT (execution_id, attempt) DO UPDATE SET due_at = EXCLUDED.due_at, claimed_until = NULL
		)
		SELECT EXISTS (SELECT 1 FROM e)`, id, n, delay.Seconds()).Scan(&undone)
	if err != nil {
		return false, fmt.Errorf("undo start of attempt %d of %s: %w", n, id, err)
	}
	return undone, nil
}
