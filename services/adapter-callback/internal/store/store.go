// Package store is the SQL the adapter-callback service owns: authenticating adapters, reading
// the attempt a callback names, renewing leases and storing progress.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/integrations-platform/integrations/pkg/execution"
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
	Status    execution.Status
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

// leaseRenewSQL is LeaseRenew's statement (Renew): $1 id, $2 attempt, $3 lease in seconds.
var leaseRenewSQL = `
		WITH e AS (
			UPDATE executions SET lease_expires_at = least(now() + make_interval(secs => $3), deadline_at), updated_at = now()
			WHERE id = $1 AND attempt = $2 AND ` + execution.Renew.FromSQL("status") + ` AND lease_expires_at > now() AND deadline_at > now()
			RETURNING id, lease_expires_at, extract(epoch FROM lease_expires_at - now())::float8 AS secs
		), t AS (
			UPDATE execution_attempts SET renewals = renewals + 1, last_renewed_at = now()
			WHERE execution_id = (SELECT id FROM e) AND n = $2
		)
		SELECT lease_expires_at, secs FROM e`

// LeaseRenew extends the running attempt's lease to now+lease, but never past the execution's
// deadline, if neither the lease nor the deadline has passed — all on the database's clock. It
// returns when the lease granted ends, and how long that is from now as the database measured it
// (less than lease near the deadline): the interval an adapter on another clock can go by.
func (s *Store) LeaseRenew(ctx context.Context, id string, n int32, lease time.Duration) (until time.Time, granted time.Duration, err error) {
	var secs float64
	// The attempt's row counts the renewal for the timeline, in the same statement.
	err = s.pool.QueryRow(ctx, leaseRenewSQL, id, n, lease.Seconds()).Scan(&until, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, 0, ErrNotRunning
	}
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("renew lease of %s: %w", id, err)
	}
	return until, time.Duration(secs * float64(time.Second)), nil
}

// ProgressEvent is the execution.progress event a progress report wrote or replaced.
type ProgressEvent struct {
	// ID is the event's id; empty when the report made no event (the capability does not declare
	// progress_events, or the execution is sync).
	ID string
	// Sequence is the event's place among its execution's events (data.sequence).
	Sequence int32
	// Replaced is set when the report took over an earlier progress event still waiting for
	// delivery (coalescing) rather than adding one.
	Replaced bool
}

// progressPayloadSQL is a progress event's body, built from the updated execution x for the event
// id given: its data the progress as reported ($3) and the event's sequence.
func progressPayloadSQL(id string) string {
	return execution.EventBodySQL(id, "$5::text", "x.updated_at", execution.ProgressDataSQL("x", "$3::jsonb"))
}

// progressSetSQL stores the running attempt's progress, counts the report on the attempt's row
// with its time (the timeline's progress entry), and, when the capability declares
// progress_events and the execution is async, writes its execution.progress event in the same
// statement — so the event exists if and only if the progress was stored.
//
// Coalescing (docs/decisions.md, "Progress events"): the execution's latest event, if it is a
// progress event that no one has claimed for delivery yet — pending, never attempted, not relayed
// nor under a relay or delivery claim — is replaced (its progress, and the new sequence number)
// rather than joined by another; the router holds an event back while an earlier one of its execution is pending, so
// while one progress event is being delivered, all reports meanwhile fold into the one waiting
// behind it. SKIP LOCKED: an event a relay is claiming at this moment is left to it, and the
// report makes a new event. The sequence comes from the execution's counter, advanced by this
// statement's update of the row whose lock orders all of the execution's event writers. The event
// carries the execution's trace context, as settlement's completion event does, so that its relay
// and delivery continue the execution's trace.
//
// $1 id, $2 attempt, $3 progress, $4 new event id, $5 event type, $6 notify channel.
var progressSetSQL = `
	WITH x AS (
		UPDATE executions e SET progress = $3, updated_at = now(),
			event_seq = e.event_seq + CASE WHEN c.progress_events AND e.mode = 'async' THEN 1 ELSE 0 END
		FROM capabilities c
		WHERE e.id = $1 AND e.attempt = $2 AND ` + execution.Progress.FromSQL("e.status") + ` AND c.name = e.capability
		RETURNING e.id, e.application_id, e.capability, e.attempt, e.event_seq, e.updated_at, e.traceparent, e.tracestate,
			c.progress_events AND e.mode = 'async' AS evented
	), counted AS (
		-- The timeline places the attempt's reports at their own time: a count and the last one's
		-- time on the attempt's row, not a row per report (migration 00018).
		UPDATE execution_attempts a SET progress_reports = a.progress_reports + 1, last_progress_at = x.updated_at
		FROM x
		WHERE a.execution_id = x.id AND a.n = $2
	), waiting AS (
		-- The execution's latest event (the counter's previous value: one index lookup, however
		-- long its history), if it is a progress event no one has claimed yet.
		SELECT ev.id FROM integration_events ev JOIN x ON ev.execution_id = x.id AND ev.sequence = x.event_seq - 1
		WHERE x.evented AND ev.type = $5 AND ` + execution.EventSuperseded.FromSQL("ev.delivery_status") + ` AND ev.attempts = 0
			AND ev.relayed_at IS NULL
			AND (ev.relay_claimed_until IS NULL OR ev.relay_claimed_until < now())
			AND (ev.delivery_claimed_until IS NULL OR ev.delivery_claimed_until < now())
			AND NOT EXISTS (SELECT 1 FROM event_deliveries d WHERE d.event_id = ev.id)
		FOR UPDATE OF ev SKIP LOCKED
	), upd AS (
		UPDATE integration_events ev SET sequence = x.event_seq, payload = ` + progressPayloadSQL("ev.id") + `
		FROM waiting w, x
		WHERE ev.id = w.id
		RETURNING ev.id, ev.sequence
	), ins AS (
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, next_attempt_at, sequence,
			traceparent, tracestate)
		SELECT $4::uuid, x.application_id, x.id, $5::text, ` + progressPayloadSQL("$4::uuid") + `, now(), x.event_seq,
			x.traceparent, x.tracestate
		FROM x
		WHERE x.evented AND NOT EXISTS (SELECT 1 FROM upd)
		RETURNING id, sequence
	), ev AS (
		SELECT id, sequence, true AS replaced FROM upd UNION ALL SELECT id, sequence, false FROM ins
	), notified AS (
		SELECT pg_notify($6::text, id::text) FROM ev
	)
	SELECT (SELECT id::text FROM ev), (SELECT sequence FROM ev), coalesce((SELECT replaced FROM ev), false),
		(SELECT count(*) FROM notified)
	FROM x`

// ProgressSet stores the running attempt's progress and, for an async execution of a capability
// that declares progress_events, writes or replaces its execution.progress event (progressSetSQL),
// waking the event router's relay at commit.
func (s *Store) ProgressSet(ctx context.Context, id string, n int32, progress []byte) (ProgressEvent, error) {
	eventID, err := uuid.NewV7()
	if err != nil {
		return ProgressEvent{}, fmt.Errorf("event id: %w", err)
	}
	var (
		ev       ProgressEvent
		evID     *string
		seq      *int32
		notified int64
	)
	err = s.pool.QueryRow(ctx, progressSetSQL, id, n, progress, eventID, execution.EventTypeExecutionProgress,
		execution.EventsNotifyChannel).Scan(&evID, &seq, &ev.Replaced, &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return ProgressEvent{}, ErrNotRunning
	}
	if err != nil {
		return ProgressEvent{}, fmt.Errorf("store progress of %s: %w", id, err)
	}
	if evID != nil {
		ev.ID, ev.Sequence = *evID, *seq
	}
	return ev, nil
}

// AttemptLateOutcomeSet records, for audit, an outcome the adapter reported for attempt n after
// the attempt had ended. Only the first one is kept. It changes nothing else: a late outcome is
// never applied.
func (s *Store) AttemptLateOutcomeSet(ctx context.Context, id string, n int32, outcome execution.AttemptOutcome) error {
	if _, err := s.pool.Exec(ctx, `
		UPDATE execution_attempts SET late_outcome = $3, late_at = now()
		WHERE execution_id = $1 AND n = $2 AND late_outcome IS NULL`, id, n, outcome); err != nil {
		return fmt.Errorf("record late outcome of attempt %d of %s: %w", n, id, err)
	}
	return nil
}
