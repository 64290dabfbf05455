// Package store is the SQL the adapter-callback service owns: authenticating adapters, reading
// the attempt a callback names, renewing leases and storing progress.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotFound means no such adapter, execution or attempt.
var ErrNotFound = errors.New("not found")

// Store is the callback service's data access.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// AdapterIDByCredentialHash finds the adapter whose credential hashes to hash.
func (s *Store) AdapterIDByCredentialHash(ctx context.Context, hash []byte) (string, error) {
	var id string
	err := s.pool.QueryRow(ctx, `SELECT id FROM adapters WHERE credential_hash = $1`, hash).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("look up adapter by credential: %w", err)
	}
	return id, nil
}

// Attempt is what a callback is checked against.
type Attempt struct {
	Status    string
	Mode      string
	Current   int32 // the execution's current attempt
	AdapterID string
	TokenHash []byte
	Lease     time.Duration
}

// AttemptGet reads execution id's attempt n with what a callback must be checked against.
func (s *Store) AttemptGet(ctx context.Context, id string, n int32) (*Attempt, error) {
	var a Attempt
	var leaseMS int64
	err := s.pool.QueryRow(ctx, `
		SELECT e.status, e.mode, e.attempt, c.adapter_id, t.callback_token_hash, c.lease_ms
		FROM executions e
		JOIN capabilities c ON c.name = e.capability
		JOIN execution_attempts t ON t.execution_id = e.id AND t.n = $2
		WHERE e.id = $1`, id, n).Scan(&a.Status, &a.Mode, &a.Current, &a.AdapterID, &a.TokenHash, &leaseMS)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read attempt %d of %s: %w", n, id, err)
	}
	a.Lease = time.Duration(leaseMS) * time.Millisecond
	return &a, nil
}

// ErrNotRunning means the attempt is no longer the running one, or its lease or the execution's
// deadline has passed.
var ErrNotRunning = errors.New("attempt is not running under a live lease")

// LeaseRenew extends the running attempt's lease to now+lease, but never past the execution's
// deadline, if neither the lease nor the deadline has passed — all on the database's clock. It
// returns when the lease granted ends, and how long that is from now as the database measured it
// (less than lease near the deadline): the interval an adapter on another clock can go by.
func (s *Store) LeaseRenew(ctx context.Context, id string, n int32, lease time.Duration) (until time.Time, granted time.Duration, err error) {
	var secs float64
	// The attempt's row counts the renewal for the timeline, in the same statement.
	err = s.pool.QueryRow(ctx, `
		WITH e AS (
			UPDATE executions SET lease_expires_at = least(now() + make_interval(secs => $3), deadline_at), updated_at = now()
			WHERE id = $1 AND attempt = $2 AND status = 'running' AND lease_expires_at > now() AND deadline_at > now()
			RETURNING id, lease_expires_at, extract(epoch FROM lease_expires_at - now())::float8 AS secs
		), t AS (
			UPDATE execution_attempts SET renewals = renewals + 1, last_renewed_at = now()
			WHERE execution_id = (SELECT id FROM e) AND n = $2
		)
		SELECT lease_expires_at, secs FROM e`, id, n, lease.Seconds()).Scan(&until, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, 0, ErrNotRunning
	}
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("renew lease of %s: %w", id, err)
	}
	return until, time.Duration(secs * float64(time.Second)), nil
}

// ProgressSet stores the running attempt's progress.
func (s *Store) ProgressSet(ctx context.Context, id string, n int32, progress []byte) error {
	tag, err := s.pool.Exec(ctx, `
		UPDATE executions SET progress = $3, updated_at = now()
		WHERE id = $1 AND attempt = $2 AND status = 'running'`, id, n, progress)
	if err != nil {
		return fmt.Errorf("store progress of %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotRunning
	}
	return nil
}

// AttemptLateOutcomeSet records, for audit, an outcome the adapter reported for attempt n after
// the attempt had ended. Only the first one is kept. It changes nothing else: a late outcome is
// never applied.
func (s *Store) AttemptLateOutcomeSet(ctx context.Context, id string, n int32, outcome string) error {
	if _, err := s.pool.Exec(ctx, `
		UPDATE execution_attempts SET late_outcome = $3, late_at = now()
		WHERE execution_id = $1 AND n = $2 AND late_outcome IS NULL`, id, n, outcome); err != nil {
		return fmt.Errorf("record late outcome of attempt %d of %s: %w", n, id, err)
	}
	return nil
}
