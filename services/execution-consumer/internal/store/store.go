// Package store is the SQL the execution-consumer owns: starting an attempt with one compare of
// status and attempt number, and recording an adapter's lease.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotStartable means the execution is not pending at the attempt before this one: the message
// is a duplicate, or obsolete (the execution moved on or settled).
var ErrNotStartable = errors.New("attempt is not startable")

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
	Lease           time.Duration
}

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
func (s *Store) AttemptStart(ctx context.Context, id string, n int32, tokenHash []byte, scale func(time.Duration) time.Duration) (*Started, error) {
	r := Started{ExecutionID: id, Attempt: n}
	var leaseMS int64
	err := s.pool.QueryRow(ctx, `
		WITH started AS (
			UPDATE executions e
			SET status = 'running', attempt = $2,
				lease_expires_at = now() + make_interval(secs => c.lease_ms / 1000.0 * $4), updated_at = now()
			FROM capabilities c, adapters a
			WHERE e.id = $1 AND e.status = 'pending' AND e.attempt = $2 - 1
				AND c.name = e.capability AND a.id = c.adapter_id
			RETURNING e.capability, e.mode, e.payload, e.deadline_at, e.lease_expires_at, a.endpoint, c.lease_ms
		), attempt AS (
			INSERT INTO execution_attempts (execution_id, n, callback_token_hash) SELECT $1, $2, $3 FROM started
		)
		SELECT * FROM started`,
		id, n, tokenHash, scale(time.Second).Seconds()).
		Scan(&r.Capability, &r.Mode, &r.Payload, &r.Deadline, &r.LeaseExpiresAt, &r.AdapterEndpoint, &leaseMS)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotStartable
	}
	if err != nil {
		return nil, fmt.Errorf("start attempt %d of %s: %w", n, id, err)
	}
	r.Lease = scale(time.Duration(leaseMS) * time.Millisecond)
	return &r, nil
}

// AttemptStartable reports whether attempt n of the execution could start now: the execution is
// pending at attempt n-1. It is a read, for a message that arrived early: one that could never
// start (a duplicate, or the execution moved on or settled) is dropped instead of being deferred.
// AttemptStart's compare is still what decides.
func (s *Store) AttemptStartable(ctx context.Context, id string, n int32) (bool, error) {
	var ok bool
	if err := s.pool.QueryRow(ctx,
		`SELECT EXISTS (SELECT 1 FROM executions WHERE id = $1 AND status = 'pending' AND attempt = $2 - 1)`,
		id, n).Scan(&ok); err != nil {
		return false, fmt.Errorf("check attempt %d of %s: %w", n, id, err)
	}
	return ok, nil
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
// nothing (the adapter could not be reached): the execution returns to pending at attempt n-1 and
// the attempt's row is deleted, so that the attempt is not spent and the same dispatch can start
// it later. It reports false, changing nothing, if the attempt is no longer the running one.
func (s *Store) AttemptUndo(ctx context.Context, id string, n int32) (bool, error) {
	var undone bool
	err := s.pool.QueryRow(ctx, `
		WITH e AS (
			UPDATE executions SET status = 'pending', attempt = $2 - 1, lease_expires_at = NULL, updated_at = now()
			WHERE id = $1 AND status = 'running' AND attempt = $2
			RETURNING id
		), a AS (
			DELETE FROM execution_attempts WHERE execution_id = (SELECT id FROM e) AND n = $2
		)
		SELECT EXISTS (SELECT 1 FROM e)`, id, n).Scan(&undone)
	if err != nil {
		return false, fmt.Errorf("undo start of attempt %d of %s: %w", n, id, err)
	}
	return undone, nil
}
