// Package store is the SQL the event router owns: claiming unrelayed events, and reading and
// recording deliveries.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/integrations-platform/integrations/pkg/db"
)

// ErrNotFound means no such event.
var ErrNotFound = errors.New("event not found")

// Store is the router's data access.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool returns the pool, for LISTEN.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Unrelayed is an event to publish.
type Unrelayed struct {
	ID            string
	ApplicationID string
	ClaimedUntil  time.Time
}

// EventClaimUnrelayed reserves up to limit events not yet published to the broker.
func (s *Store) EventClaimUnrelayed(ctx context.Context, limit int, ttl time.Duration) ([]Unrelayed, error) {
	rows, err := s.pool.Query(ctx, `
		UPDATE integration_events e SET relay_claimed_until = now() + make_interval(secs => $2)
		FROM (
			SELECT id FROM integration_events
			WHERE relayed_at IS NULL AND (relay_claimed_until IS NULL OR relay_claimed_until < now())
			ORDER BY created_at
			LIMIT $1
			FOR UPDATE SKIP LOCKED
		) todo
		WHERE e.id = todo.id
		RETURNING e.id, e.application_id, e.relay_claimed_until`, limit, ttl.Seconds())
	if err != nil {
		return nil, fmt.Errorf("claim unrelayed events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Unrelayed, error) {
		var u Unrelayed
		err := r.Scan(&u.ID, &u.ApplicationID, &u.ClaimedUntil)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim unrelayed events: %w", err)
	}
	return out, nil
}

// EventMarkRelayed records that the broker confirmed the events.
func (s *Store) EventMarkRelayed(ctx context.Context, ids []string, claimedUntil time.Time) error {
	if _, err := s.pool.Exec(ctx, `
		UPDATE integration_events SET relayed_at = now(), relay_claimed_until = NULL
		WHERE id = ANY($1::uuid[]) AND relay_claimed_until = $2`, ids, claimedUntil); err != nil {
		return fmt.Errorf("mark events relayed: %w", err)
	}
	return nil
}

// Delivery is an event with where it goes.
type Delivery struct {
	EventID       string
	ApplicationID string
	Payload       []byte
	Status        string
	Attempts      int32
	ConsumerKind  *string
	Endpoint      *string
	SealedSecret  []byte
}

// DeliveryGet reads an event with its application's consumer.
func (s *Store) DeliveryGet(ctx context.Context, eventID string) (*Delivery, error) {
	var d Delivery
	err := s.pool.QueryRow(ctx, `
		SELECT e.id, e.application_id, e.payload, e.delivery_status, e.attempts,
			a.consumer_kind, a.consumer_endpoint, a.signing_secret_enc
		FROM integration_events e JOIN applications a ON a.id = e.application_id
		WHERE e.id = $1`, eventID).Scan(&d.EventID, &d.ApplicationID, &d.Payload, &d.Status, &d.Attempts,
		&d.ConsumerKind, &d.Endpoint, &d.SealedSecret)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read event %s: %w", eventID, err)
	}
	return &d, nil
}

// Attempt is one delivery attempt's record.
type Attempt struct {
	StatusCode int
	Err        string
	Duration   time.Duration
	// Outcome is the event's status afterwards: pending (will be retried), delivered or dead.
	Outcome string
}

// DeliveryRecord records one attempt and the event's resulting state in one transaction.
func (s *Store) DeliveryRecord(ctx context.Context, eventID string, a Attempt) error {
	return db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		var n int32
		err := tx.QueryRow(ctx, `
			UPDATE integration_events
			SET attempts = attempts + 1, delivery_status = $2, last_error = nullif($3, ''),
				delivered_at = CASE WHEN $2 = 'delivered' THEN now() END,
				dead_at = CASE WHEN $2 = 'dead' THEN now() END
			WHERE id = $1 AND delivery_status = 'pending'
			RETURNING attempts`, eventID, a.Outcome, a.Err).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // delivered or dead meanwhile by another copy
		}
		if err != nil {
			return fmt.Errorf("record delivery of %s: %w", eventID, err)
		}
		var code *int
		if a.StatusCode != 0 {
			code = &a.StatusCode
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO event_deliveries (event_id, n, status_code, error, duration_ms) VALUES ($1, $2, $3, nullif($4, ''), $5)`,
			eventID, n, code, a.Err, a.Duration.Milliseconds()); err != nil {
			return fmt.Errorf("record delivery %d of %s: %w", n, eventID, err)
		}
		return nil
	})
}
