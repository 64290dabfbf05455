// Package store is the SQL the dispatcher owns: claiming dispatch records due now or within the
// broker's delay horizon, and deleting the published ones.
package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/integrations-platform/integrations/pkg/execution"
)

// Dispatch is a claimed dispatch record.
type Dispatch struct {
	ID           int64
	ExecutionID  string
	Attempt      int32
	DueAt        time.Time
	ClaimedUntil time.Time
	// ClaimedAt is the database's time of the claim: the clock DueAt was written by, so DueAt minus
	// ClaimedAt is how far ahead the record was due, whatever the dispatcher's own clock says.
	ClaimedAt time.Time
	// Traceparent and Tracestate are the execution's trace context (its accept's), which the
	// dispatch's message continues; empty for none.
	Traceparent, Tracestate string
}

// Store is the dispatcher's data access.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Claim is what one claim statement answers: the records it claimed and, from the same
// statement, when the next pass is due.
type Claim struct {
	Dispatches []Dispatch
	// NextIn is how long, from the statement's now(), until the earliest record it did not claim
	// becomes claimable with the same horizon — horizon before its due time, or the end of its
	// claim if one holds it — or nil if none waits. Measured by the database, on the clock that
	// wrote due_at and claimed_until, so the dispatcher wakes on time whatever its own clock says.
	// It may be negative (claimable already: a record locked by another dispatcher's claim as
	// this one ran, or one left out by the limit).
	NextIn *time.Duration
}

// DispatchClaim reserves for ttl up to limit unclaimed (or claim-expired) records due within
// horizon from now, earliest first: those due already and, with a positive horizon, those the
// broker's delay levels can hold until they are due. Several dispatchers can claim at once: SKIP
// LOCKED gives each its own rows. The same statement answers when the next pass is due
// (Claim.NextIn), so a pass costs no second statement to learn when to wake; limit 0 claims
// nothing and only answers that.
func (s *Store) DispatchClaim(ctx context.Context, limit int, ttl, horizon time.Duration) (Claim, error) {
	// The next-due lookups are two index-ordered scans (least ignores NULLs): the earliest
	// unclaimed record and the earliest claim to expire, leaving out the rows this statement
	// claims (the statement's snapshot still shows them unclaimed).
	rows, err := s.pool.Query(ctx, `
		WITH due AS (
			SELECT id FROM dispatches
			WHERE due_at <= now() + make_interval(secs => $3)
				AND (claimed_until IS NULL OR claimed_until < now())
			ORDER BY due_at
			LIMIT $1
			FOR UPDATE SKIP LOCKED
		), claimed AS (
			UPDATE dispatches d SET claimed_until = now() + make_interval(secs => $2)
			FROM due
			WHERE d.id = due.id
			RETURNING d.id, d.execution_id, d.attempt, d.due_at, d.claimed_until
		), next AS (
			SELECT extract(epoch FROM least(
				(SELECT due_at FROM dispatches WHERE claimed_until IS NULL AND id NOT IN (SELECT id FROM due)
				 ORDER BY due_at LIMIT 1) - make_interval(secs => $3),
				(SELECT greatest(due_at - make_interval(secs => $3), claimed_until) FROM dispatches
				 WHERE claimed_until IS NOT NULL AND id NOT IN (SELECT id FROM due)
				 ORDER BY claimed_until LIMIT 1)) - now())::float8 AS secs
		)
		SELECT c.id, c.execution_id, c.attempt, c.due_at, c.claimed_until, now(), next.secs,
			e.traceparent, e.tracestate
		FROM next LEFT JOIN claimed c ON true LEFT JOIN executions e ON e.id = c.execution_id`,
		limit, ttl.Seconds(), max(horizon, 0).Seconds())
	if err != nil {
		return Claim{}, fmt.Errorf("claim dispatches: %w", err)
	}
	var out Claim
	var next *float64
	for rows.Next() {
		var (
			id           *int64
			d            Dispatch
			execID       *string
			attempt      *int32
			due, claimed *time.Time
			tp, ts       *string
		)
		if err := rows.Scan(&id, &execID, &attempt, &due, &claimed, &d.ClaimedAt, &next, &tp, &ts); err != nil {
			rows.Close()
			return Claim{}, fmt.Errorf("claim dispatches: %w", err)
		}
		if id == nil {
			continue // nothing claimed: the one row carries only the next due time
		}
		d.ID, d.ExecutionID, d.Attempt, d.DueAt, d.ClaimedUntil = *id, *execID, *attempt, *due, *claimed
		if tp != nil {
			d.Traceparent = *tp
		}
		if ts != nil {
			d.Tracestate = *ts
		}
		out.Dispatches = append(out.Dispatches, d)
	}
	if err := rows.Err(); err != nil {
		return Claim{}, fmt.Errorf("claim dispatches: %w", err)
	}
	if next != nil {
		wait := time.Duration(*next * float64(time.Second))
		out.NextIn = &wait
	}
	return out, nil
}

// DispatchDeletePublished deletes published records, but only while this dispatcher's claim
// still holds them: a record whose claim expired may already be another dispatcher's.
func (s *Store) DispatchDeletePublished(ctx context.Context, ids []int64, claimedUntil time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM dispatches WHERE id = ANY($1) AND claimed_until = $2`, ids, claimedUntil)
	if err != nil {
		return 0, fmt.Errorf("delete published dispatches: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DispatchRelease gives up this dispatcher's claim on records it could not publish (the broker did
// not confirm them, or the service is stopping), so that the next pass — this replica's or
// another's — publishes them at once instead of after the claim expires. A record whose claim is no
// longer this one's is left alone.
func (s *Store) DispatchRelease(ctx context.Context, ids []int64, claimedUntil time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE dispatches SET claimed_until = NULL WHERE id = ANY($1) AND claimed_until = $2`, ids, claimedUntil)
	if err != nil {
		return 0, fmt.Errorf("release unpublished dispatches: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeadDispatch is what the database says about a dispatch whose message is in the executions
// route's DLQ.
type DeadDispatch struct {
	ExecutionID string
	Attempt     int32
	// Known is false when no such execution exists.
	Known bool
	// Startable: the execution is pending at the attempt before this one, so the attempt could
	// start now (the consumer's own compare, AttemptStart), and its deadline has not passed.
	Startable bool
	// Expired: pending at the attempt before this one, but past its deadline: the settlement
	// sweeper settles it (retry_exhausted.budget), and no adapter should start work for it now.
	Expired bool
	// Waiting: a dispatch record of this attempt waits, so the dispatcher publishes it again anyway.
	Waiting bool
}

// DeadDispatchStates looks up, for each (executionIDs[i], attempts[i]) of a dead-lettered dispatch,
// whether its attempt could still start and whether a record of it waits. Ids that are not UUIDs
// must be left out by the caller.
func (s *Store) DeadDispatchStates(ctx context.Context, executionIDs []string, attempts []int32) ([]DeadDispatch, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT k.execution_id::text, k.attempt, e.id IS NOT NULL,
			coalesce(`+execution.Start.FromSQL("e.status")+` AND e.attempt = k.attempt - 1 AND e.deadline_at > now(), false),
			coalesce(`+execution.Start.FromSQL("e.status")+` AND e.attempt = k.attempt - 1 AND e.deadline_at <= now(), false),
			EXISTS (SELECT 1 FROM dispatches d WHERE d.execution_id = k.execution_id AND d.attempt = k.attempt)
		FROM unnest($1::uuid[], $2::int[]) AS k(execution_id, attempt)
		LEFT JOIN executions e ON e.id = k.execution_id`, executionIDs, attempts)
	if err != nil {
		return nil, fmt.Errorf("read dead-lettered dispatches: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadDispatch, error) {
		var d DeadDispatch
		err := r.Scan(&d.ExecutionID, &d.Attempt, &d.Known, &d.Startable, &d.Expired, &d.Waiting)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read dead-lettered dispatches: %w", err)
	}
	return out, nil
}
