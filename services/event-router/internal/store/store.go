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

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// The event statuses the statements test and set, named by the lifecycle (execution.EventTransitions
// says which move each statement makes).
var (
	pendingSQL   = execution.Literal(execution.EventPending)
	deliveredSQL = execution.Literal(execution.EventDelivered)
	deadSQL      = execution.Literal(execution.EventDead)
)

// ErrNotFound means no such event.
var ErrNotFound = errors.New("event not found")

// Store is the router's data access.
type Store struct {
	pool    *pgxpool.Pool
	records *batch.Batcher[record, bool]
}

// recordBatchSize bounds one batch of delivery records; two batches may run at once, so that a
// batch waiting on its commit does not hold up the next.
const recordBatchSize = 64

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store {
	s := &Store{pool: pool}
	s.records = batch.New(s.recordBatch, batch.Options{Name: "delivery record", MaxSize: recordBatchSize, Concurrency: 2})
	return s
}

// Pool returns the pool, for LISTEN.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Unrelayed is an event to publish.
type Unrelayed struct {
	ID            string
	ApplicationID string
	ClaimedUntil  time.Time
	// CreatedAt is when the event was written (the database's clock): for the relay-lag metric.
	CreatedAt time.Time
	// ExecutionID is the event's execution; Traceparent and Tracestate its trace context, which
	// the relay's notice continues. Empty: none.
	ExecutionID             string
	Traceparent, Tracestate string
}

// EventClaimUnrelayed reserves up to limit events not yet published to the broker.
func (s *Store) EventClaimUnrelayed(ctx context.Context, limit int, ttl time.Duration) ([]Unrelayed, error) {
	pub, _, _, err := s.EventClaimForRelay(ctx, limit, ttl, 0, 0)
	return pub, err
}

// earlierPendingSQL selects an event of the same execution as the event aliased ev that comes
// before it and is still pending (neither delivered nor dead): the ordering rule's condition for
// holding ev back. It is an index probe on (execution_id, sequence). A dead event holds nothing
// back, so a consumer that refused one event for good still gets the ones after it.
//
// The event itself is left out by id: a statement that locks ev reads its newest version, and a
// progress report that replaced it (the next sequence) since the statement's snapshot leaves its
// older version, still pending at the sequence before, in that snapshot — the relay parked the
// event behind itself until the recovery pass.
func earlierPendingSQL(ev string) string {
	return `SELECT 1 FROM integration_events p
		WHERE p.execution_id = ` + ev + `.execution_id AND p.sequence < ` + ev + `.sequence AND p.delivery_status = ` + pendingSQL + `
			AND p.id <> ` + ev + `.id`
}

// relayClaimSQL is EventClaimForRelay's statement: $1 limit, $2 ttl, $3 local, $4 deliveryTTL
// (seconds). It answers the claimed events, then one tally row (id NULL) with the number parked.
var relayClaimSQL = `
		WITH candidate AS (
			-- Whether it can be delivered here is read from the row this locks, its newest version,
			-- never from the statement's snapshot: a notice's delivery claim committed between the
			-- two was overwritten, and the event delivered twice (docs/decisions.md "One claim per
			-- event").
			SELECT id, created_at, EXISTS (` + earlierPendingSQL("t") + `) AS held,
				delivery_status = ` + pendingSQL + `
					AND (delivery_claimed_until IS NULL OR delivery_claimed_until < now())
					AND (attempts = 0 OR next_attempt_at IS NULL OR next_attempt_at <= now()) AS deliverable
			FROM integration_events t
			WHERE relayed_at IS NULL AND NOT held AND (relay_claimed_until IS NULL OR relay_claimed_until < now())
			ORDER BY created_at
			LIMIT $1
			FOR UPDATE SKIP LOCKED
		), parked AS (
			-- Held: set aside, out of the unrelayed index this scan walks, until DeliveryRecord or
			-- EventUnholdReleased lets it go.
			UPDATE integration_events e SET held = true FROM candidate c WHERE e.id = c.id AND c.held
			RETURNING e.id
		), ranked AS (
			SELECT id, COALESCE(row_number() OVER (ORDER BY created_at) <= $3 AND deliverable, false) AS here
			FROM candidate WHERE NOT held
		), marked AS (
			UPDATE integration_events e SET
				relay_claimed_until = CASE WHEN r.here THEN now() + make_interval(secs => $4) ELSE now() + make_interval(secs => $2) END,
				relayed_at = CASE WHEN r.here THEN now() END,
				delivery_claimed_until = CASE WHEN r.here THEN now() + make_interval(secs => $4) ELSE e.delivery_claimed_until END
			FROM ranked r
			WHERE e.id = r.id
			-- The payload handed is the locked row's: the join below reads the snapshot's, which a
			-- progress report committed meanwhile has replaced (its last report never delivered).
			RETURNING e.id, e.application_id, r.here, e.relay_claimed_until, e.delivery_claimed_until,
				e.type, e.created_at, e.attempts, CASE WHEN r.here THEN e.payload END AS payload
		)
		SELECT m.id, m.application_id, m.here, m.relay_claimed_until, m.delivery_claimed_until, m.type, m.created_at, m.attempts,
			m.payload, a.consumer_kind, a.consumer_endpoint, a.consumer_grpc_plaintext, a.consumer_grpc_ca,
			CASE WHEN m.here THEN a.signing_secret_enc END,
			CASE WHEN m.here AND a.signing_secret_prev_until > now() THEN a.signing_secret_prev_enc END,
			x.created_at, e.execution_id::text, coalesce(e.traceparent, ''), coalesce(e.tracestate, ''), 0::bigint
		FROM marked m JOIN integration_events e ON e.id = m.id JOIN applications a ON a.id = m.application_id
			JOIN executions x ON x.id = e.execution_id
		UNION ALL
		-- The tally: how many held events this scan set aside, so the caller knows the batch was full.
		SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, count(*) FROM parked`

// EventClaimForRelay reserves up to limit events not yet published to the broker, and of them
// claims up to local — the oldest that are pending, due and under no live delivery claim — for
// delivery in process, in the same statement: each of those is marked relayed and claimed for
// delivery for deliveryTTL (as DeliveryClaim claims it), and comes back with what its delivery
// needs. The others come back to be published, under the relay's claim for ttl. So an event
// handed in process costs no statement of its own before its attempt: the relay's claim is its
// delivery claim. An event handed in process whose replica dies is relayed and pending: its claim
// expires and EventReleaseHandoffs gives it back to the relay. A handed event carries the mark of
// its hand-off — relayed, with relay_claimed_until its delivery claim's end — until its attempt
// is recorded or its claim released.
//
// Only an event none of whose execution's earlier events is pending is claimed (the ordering
// rule, docs/decisions.md "Progress events"): the others stay unrelayed and are set aside as held
// (parked counts them), out of the unrelayed index this scan walks, so that a long wait behind a
// predecessor in retry backoff costs each scan nothing — the scan walked every held event before
// (50,000 of them: 200,000 buffers, 0.1–0.2 s a pass). The record that delivers or kills their
// predecessor lets them go and wakes the relay (DeliveryRecord); EventUnholdReleased catches a
// race between the two.
func (s *Store) EventClaimForRelay(ctx context.Context, limit int, ttl time.Duration, local int, deliveryTTL time.Duration) (
	pub []Unrelayed, here []*Delivery, parked int, err error,
) {
	rows, err := s.pool.Query(ctx, relayClaimSQL, limit, ttl.Seconds(), local, deliveryTTL.Seconds())
	if err != nil {
		return nil, nil, 0, fmt.Errorf("claim unrelayed events: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var d Delivery
		var id, appID, typ, execID, traceparent, tracestate *string
		var isHere, plaintext *bool
		var relayClaim, deliveryClaim, createdAt, execCreatedAt *time.Time
		var attempts *int32
		var held int64
		if err := rows.Scan(&id, &appID, &isHere, &relayClaim, &deliveryClaim, &typ, &createdAt,
			&attempts, &d.Payload, &d.ConsumerKind, &d.Endpoint, &plaintext, &d.GRPCCA, &d.SealedSecret, &d.PrevSealedSecret, &execCreatedAt,
			&execID, &traceparent, &tracestate, &held); err != nil {
			return nil, nil, 0, fmt.Errorf("claim unrelayed events: %w", err)
		}
		if id == nil { // the tally row
			parked = int(held)
			continue
		}
		d.GRPCPlaintext = *plaintext
		d.EventID, d.ApplicationID, d.Type, d.CreatedAt, d.Attempts, d.ExecutionCreatedAt = *id, *appID, *typ, *createdAt, *attempts, *execCreatedAt
		d.ExecutionID, d.Traceparent, d.Tracestate = *execID, *traceparent, *tracestate
		if !*isHere {
			pub = append(pub, Unrelayed{ID: d.EventID, ApplicationID: d.ApplicationID, ClaimedUntil: *relayClaim, CreatedAt: d.CreatedAt,
				ExecutionID: d.ExecutionID, Traceparent: d.Traceparent, Tracestate: d.Tracestate})
			continue
		}
		d.Status = "pending"
		d.Claim = *deliveryClaim
		here = append(here, &d)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("claim unrelayed events: %w", err)
	}
	return pub, here, parked, nil
}

// DeliveryUnclaim gives events claimed for delivery in process and not attempted (their
// deliverer stopped first, or could not publish their deferred notice) back to the relay: their
// claim ends and they are unrelayed, so that a relay — this replica's or another's — publishes
// them at once. An event whose claim is no longer the one given is left alone.
func (s *Store) DeliveryUnclaim(ctx context.Context, ids []string, claims []time.Time) error {
	if _, err := s.pool.Exec(ctx, `
		UPDATE integration_events e SET delivery_claimed_until = NULL, relayed_at = NULL, relay_claimed_until = NULL
		FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, claim)
		WHERE e.id = u.id AND e.delivery_status = `+pendingSQL+` AND e.delivery_claimed_until = u.claim`, ids, claims); err != nil {
		return fmt.Errorf("unclaim %d events: %w", len(ids), err)
	}
	return nil
}

// EventReleaseStale makes pending events whose notice should have come back more than staleAfter
// ago — after their next attempt was due or after they were last relayed, whichever is later (so
// an event relayed again is not released again until a fresh notice had its time) — unrelayed
// again, so that the relay publishes a fresh notice. A notice can be lost for
// good when the deliverer's own retries run out (the database unreachable for longer than the
// events route's port-level budget) and it is dead-lettered; without this the event would stay
// pending forever. An event under a live delivery claim is being delivered and is left alone; a
// notice that was only late makes a duplicate, which the delivery claim makes harmless.
func (s *Store) EventReleaseStale(ctx context.Context, staleAfter time.Duration) (int64, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE integration_events SET relayed_at = NULL, relay_claimed_until = NULL
		WHERE delivery_status = `+pendingSQL+` AND relayed_at IS NOT NULL
			AND greatest(coalesce(next_attempt_at, relayed_at), relayed_at) < now() - make_interval(secs => $1)
			AND (delivery_claimed_until IS NULL OR delivery_claimed_until < now())`, staleAfter.Seconds())
	if err != nil {
		return 0, fmt.Errorf("release stale events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// EventReleaseHandoffs makes the events handed to an in-process deliverer that never recorded
// nor released them — its replica died: the hand-off's mark (EventClaimForRelay) and the delivery
// claim both past — unrelayed again, so that a relay publishes or hands them at once, rather than
// after the stale-notice window.
func (s *Store) EventReleaseHandoffs(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE integration_events SET relayed_at = NULL, relay_claimed_until = NULL
		WHERE relayed_at IS NOT NULL AND relay_claimed_until IS NOT NULL AND relay_claimed_until < now()
			AND delivery_status = `+pendingSQL+`
			AND (delivery_claimed_until IS NULL OR delivery_claimed_until < now())`)
	if err != nil {
		return 0, fmt.Errorf("release lost hand-offs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// EventUnholdReleased lets go of the events EventClaimForRelay set aside as held whose earlier
// events are no longer pending, for the relay to claim. DeliveryRecord lets an event's successors
// go when it delivers or kills it; this catches the one it misses: a relay that read the
// predecessor pending before the record committed and set the successor aside after it. It reads
// only the held events (integration_events_held_idx).
func (s *Store) EventUnholdReleased(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE integration_events t SET held = false
		WHERE held AND NOT EXISTS (`+earlierPendingSQL("t")+`)`)
	if err != nil {
		return 0, fmt.Errorf("let go of released held events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeadNotice is what the database says about an event whose notice is in the events route's DLQ.
type DeadNotice struct {
	EventID string
	// Status is the event's delivery status: pending, delivered or dead.
	Status string
	// Released is set when EventReleaseDeadNoticed made the event unrelayed, so that the relay
	// publishes a fresh notice.
	Released bool
}

// EventReleaseDeadNoticed looks up the events whose notices were dead-lettered (ids; unknown ids
// are left out of the answer) and makes each one that is still pending unrelayed again, so that
// the relay publishes a fresh notice at once — unless it was relayed, or its next attempt was
// due, less than minAge ago, or a live delivery claim holds it (it is being delivered). minAge is
// the events route's port-level budget: a notice younger than that cannot have spent it, so the
// dead letter is of an earlier notice and a fresh one is already on its way; and an event in
// delivery backoff (next_attempt_at ahead) has a live notice deferred until that time, so it is
// not released until the notice had a budget past it — the same condition as EventReleaseStale.
// Without the next_attempt_at part, every recovery pass released an event on its 1m…6h schedule
// again, as long as its old dead letter stayed in the DLQ: one notice more per pass. The dead letter is the evidence that the notice
// is gone, so this does not wait for the stale-notice window; a notice that was in fact alive
// makes a duplicate, which the delivery claim absorbs.
func (s *Store) EventReleaseDeadNoticed(ctx context.Context, ids []string, minAge time.Duration) ([]DeadNotice, error) {
	rows, err := s.pool.Query(ctx, `
		WITH ev AS (
			SELECT id, delivery_status FROM integration_events WHERE id = ANY($1::uuid[])
		), released AS (
			UPDATE integration_events e SET relayed_at = NULL, relay_claimed_until = NULL
			FROM ev
			WHERE e.id = ev.id AND ev.delivery_status = `+pendingSQL+`
				AND e.relayed_at IS NOT NULL
				AND greatest(coalesce(e.next_attempt_at, e.relayed_at), e.relayed_at) < now() - make_interval(secs => $2)
				AND (e.delivery_claimed_until IS NULL OR e.delivery_claimed_until < now())
			RETURNING e.id
		)
		SELECT ev.id::text, ev.delivery_status, ev.id IN (SELECT id FROM released) FROM ev`, ids, minAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("release events of dead-lettered notices: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadNotice, error) {
		var n DeadNotice
		err := r.Scan(&n.EventID, &n.Status, &n.Released)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("release events of dead-lettered notices: %w", err)
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
	Type          string
	CreatedAt     time.Time
	Payload       []byte
	Status        string
	Attempts      int32
	ConsumerKind  *string
	Endpoint      *string
	// GRPCPlaintext and GRPCCA are a gRPC consumer's transport: without TLS (where the gateway
	// allowed it at registration), or verified against the CA bundle GRPCCA (PEM; nil: the
	// system roots).
	GRPCPlaintext bool
	GRPCCA        *string
	SealedSecret  []byte
	// PrevSealedSecret is the application's previous signing secret while its overlap lasts
	// (signing_secret_prev_until in the future), nil otherwise.
	PrevSealedSecret []byte
	// ExecutionCreatedAt is when the event's execution was accepted (the database's clock), read
	// in the claim's own statement: for the accept → delivered metric.
	ExecutionCreatedAt time.Time
	// ExecutionID is the event's execution; Traceparent and Tracestate its trace context (the
	// execution's, copied by settlement; a hand-off's relay span, set by the relay), which the
	// delivery continues when no notice brought one. Empty: none.
	ExecutionID             string
	Traceparent, Tracestate string
	// Wait is how long until the event's next attempt is due, when it is pending but not yet.
	Wait time.Duration
	// ClaimWait is how long another delivery's claim on the event still runs, if one does.
	// The event is claimed by this call only when both are zero.
	ClaimWait time.Duration
	// Claim identifies this call's claim (its expiry, as the database wrote it) when it claimed
	// the event: DeliveryRecord and DeliveryRelease act only while it still holds.
	Claim time.Time
	// Held is set when an earlier event of the same execution is still pending (the ordering
	// rule): DeliveryClaim did not claim the event but gave it back to the relay (unrelayed),
	// which claims it once its predecessors are delivered or dead. Its notice is done with.
	Held bool
}

// DeliveryClaim reads an event with its application's consumer and, if it is pending and due,
// claims it for ttl (one attempt's length, with a margin): until the claim is recorded, released
// or expired, no other notice of the event is delivered. A pending event that is not due, or
// claimed by another delivery, comes back unclaimed with Wait or ClaimWait set; a delivered or
// dead one comes back as it is. Times are the
// database's, which wrote next_attempt_at.
//
// After a redelivery (attempts reset to 0) next_attempt_at is ignored: the redelivered event is
// due at once.
//
// An event with an earlier event of its execution still pending (one redelivered after it was
// relayed) is not claimed: it is made unrelayed, so that the relay claims it after its
// predecessors, and comes back Held.
func (s *Store) DeliveryClaim(ctx context.Context, eventID string, ttl time.Duration) (*Delivery, error) {
	var d Delivery
	var wait, claimWait float64
	var claim *time.Time
	var behind bool // ev.held, read with ev.*: d.Held says whether the statement gave the event back
	// One statement (one round trip, one commit): read the event under its row lock, and claim
	// it in the same statement if it is pending, due and unclaimed.
	err := s.pool.QueryRow(ctx, `
		WITH ev AS (
			SELECT e.id, e.application_id, e.type, e.created_at, e.payload, e.delivery_status, e.attempts,
				a.consumer_kind, a.consumer_endpoint, a.consumer_grpc_plaintext, a.consumer_grpc_ca, a.signing_secret_enc,
				CASE WHEN a.signing_secret_prev_until > now() THEN a.signing_secret_prev_enc END AS prev_secret,
				COALESCE(extract(epoch FROM
					CASE WHEN e.attempts > 0 THEN e.next_attempt_at END - now()), 0)::float8 AS wait,
				COALESCE(extract(epoch FROM e.delivery_claimed_until - now()), 0)::float8 AS claim_wait,
				x.created_at AS execution_created_at,
				EXISTS (`+earlierPendingSQL("e")+`) AS held,
				e.execution_id::text AS execution_id, coalesce(e.traceparent, '') AS traceparent,
				coalesce(e.tracestate, '') AS tracestate
			FROM integration_events e JOIN applications a ON a.id = e.application_id
				JOIN executions x ON x.id = e.execution_id
			WHERE e.id = $1
			FOR UPDATE OF e
		), claimed AS (
			-- Not held: claimed for one attempt. Held: given back to the relay instead.
			UPDATE integration_events e SET
				delivery_claimed_until = CASE WHEN ev.held THEN e.delivery_claimed_until ELSE now() + make_interval(secs => $2) END,
				relayed_at = CASE WHEN ev.held THEN NULL ELSE e.relayed_at END,
				relay_claimed_until = CASE WHEN ev.held THEN NULL ELSE e.relay_claimed_until END
			FROM ev
			WHERE e.id = ev.id AND ev.delivery_status = `+pendingSQL+` AND ev.claim_wait <= 0 AND (ev.held OR ev.wait <= 0)
			RETURNING ev.held, e.delivery_claimed_until
		)
		SELECT ev.*, (SELECT delivery_claimed_until FROM claimed WHERE NOT held),
			COALESCE((SELECT held FROM claimed), false) FROM ev`, eventID, ttl.Seconds()).
		Scan(&d.EventID, &d.ApplicationID, &d.Type, &d.CreatedAt, &d.Payload,
			&d.Status, &d.Attempts, &d.ConsumerKind, &d.Endpoint, &d.GRPCPlaintext, &d.GRPCCA, &d.SealedSecret, &d.PrevSealedSecret,
			&wait, &claimWait, &d.ExecutionCreatedAt, &behind, &d.ExecutionID, &d.Traceparent, &d.Tracestate, &claim, &d.Held)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read and claim event %s: %w", eventID, err)
	}
	if d.Status != "pending" || d.Held {
		return &d, nil
	}
	d.Wait = max(time.Duration(wait*float64(time.Second)), 0)
	d.ClaimWait = max(time.Duration(claimWait*float64(time.Second)), 0)
	switch {
	case claim != nil:
		d.Claim = *claim
	case d.Wait == 0 && d.ClaimWait == 0:
		// Not claimed, yet due within a rounding of a nanosecond: come back in a moment.
		d.Wait = time.Millisecond
	}
	return &d, nil
}

// DeliveryRelease gives up a claim without recording an attempt (the deliverer was stopped
// mid-attempt), so that the notice the broker hands out again need not wait for it to expire. A
// claim that is no longer this delivery's (it expired and another took the event) is left alone.
func (s *Store) DeliveryRelease(ctx context.Context, eventID string, claim time.Time) error {
	if _, err := s.pool.Exec(ctx, `
		UPDATE integration_events SET delivery_claimed_until = NULL,
			relay_claimed_until = CASE WHEN relayed_at IS NOT NULL THEN NULL ELSE relay_claimed_until END
		WHERE id = $1 AND delivery_status = `+pendingSQL+` AND delivery_claimed_until = $2`,
		eventID, claim); err != nil {
		return fmt.Errorf("release event %s: %w", eventID, err)
	}
	return nil
}

// Attempt is one delivery attempt's record.
type Attempt struct {
	// StatusCode is the webhook's HTTP status, or the gRPC code a gRPC consumer answered; 0 when
	// there was none (a transport error), stored as NULL.
	StatusCode int
	// Err is the failed attempt's category (webhook.Category*), shown to the tenant as is: never
	// raw network text.
	Err      string
	Duration time.Duration
	// ResponseBody is the start of the consumer's answer, already truncated and cleaned.
	ResponseBody string
	// Outcome is the event's status afterwards: pending (will be retried), delivered or dead.
	Outcome string
	// NextIn is, for a pending outcome, how long after now the next attempt is due.
	NextIn time.Duration
	// Claim and Attempts are the claim the attempt was made under and the event's attempt count
	// when it was claimed: the outcome applies only if both still hold.
	Claim    time.Time
	Attempts int32
}

// DeliveryRecord records one attempt in the event's history and, if the event is still as the
// attempt found it — pending, at the same attempt count, under the same claim — applies its
// outcome to the event and ends the claim, in one statement (one round trip, one commit).
// Concurrent records are coalesced (pkg/batch) into one statement and one commit for the whole
// batch; each caller still gets its own answer and its own error. The attempt's number follows the
// event's whole history (max(n)+1), so that the attempts before a redelivery, which resets the
// event's count, are kept.
//
// It reports whether the outcome was applied. It is not when another delivery settled the event
// meanwhile, or a redelivery reset it (the attempt belongs to the old budget: counting it against
// the fresh one could end that one early, or kill the event while its redelivery waits), or the
// claim expired and another delivery took it; the attempt is still recorded in the history.
func (s *Store) DeliveryRecord(ctx context.Context, eventID string, a Attempt) (bool, error) {
	return s.records.Do(ctx, record{eventID: eventID, a: a})
}

// record is one DeliveryRecord request.
type record struct {
	eventID string
	a       Attempt
}

// RecordStats are the delivery-record batcher's counts (batches and records run).
func (s *Store) RecordStats() batch.Stats { return s.records.Stats() }

// deliveryRecordSQL applies and records a batch of attempts given as parallel arrays, in request
// order (ord). The UPDATE answers the ord of each request it applied, so two records of one event
// in a batch (a stale claim's beside a live one) are each answered for themselves; the INSERT
// numbers the attempts of one event after its history, in request order. Only the applied ords
// are read back. $10 is the relay's NOTIFY channel.
var deliveryRecordSQL = `
	WITH req AS (
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::float8[], $5::int[], $6::timestamptz[],
			$7::int[], $8::bigint[], $9::text[]) WITH ORDINALITY
			AS r(event_id, outcome, err, next_in, attempts, claim, status_code, duration_ms, body, ord)
	), upd AS (
		UPDATE integration_events e
		SET attempts = e.attempts + 1, delivery_status = req.outcome, last_error = nullif(req.err, ''),
			delivered_at = CASE WHEN req.outcome = ` + deliveredSQL + ` THEN now() END,
			dead_at = CASE WHEN req.outcome = ` + deadSQL + ` THEN now() END,
			next_attempt_at = CASE WHEN req.outcome = ` + pendingSQL + ` THEN now() + make_interval(secs => req.next_in) END,
			delivery_claimed_until = NULL,
			relay_claimed_until = CASE WHEN e.relayed_at IS NOT NULL THEN NULL ELSE e.relay_claimed_until END
		FROM req
		WHERE e.id = req.event_id AND e.delivery_status = ` + pendingSQL + ` AND e.attempts = req.attempts
			AND e.delivery_claimed_until = req.claim
		RETURNING req.ord, e.execution_id, e.sequence, e.delivery_status
	), unheld AS (
		-- An event delivered or dead lets the next event of its execution go (the ordering rule):
		-- the ones the relay set aside as held go back into its scan (those still behind another
		-- pending event it sets aside again).
		UPDATE integration_events n SET held = false FROM upd
		WHERE upd.delivery_status <> ` + pendingSQL + ` AND n.execution_id = upd.execution_id AND n.sequence > upd.sequence
			AND n.held
		RETURNING n.execution_id
	), successors AS (
		-- And wake the relay at commit for the next event, which waits unrelayed.
		SELECT pg_notify($10::text, upd.execution_id::text) FROM upd
		WHERE upd.delivery_status <> ` + pendingSQL + ` AND (upd.execution_id IN (SELECT execution_id FROM unheld) OR EXISTS (
			SELECT 1 FROM integration_events n
			WHERE n.execution_id = upd.execution_id AND n.sequence > upd.sequence
				AND n.delivery_status = ` + pendingSQL + ` AND n.relayed_at IS NULL))
	), ins AS (
		INSERT INTO event_deliveries (event_id, n, status_code, error, duration_ms, response_body)
		SELECT req.event_id,
			COALESCE((SELECT max(d.n) FROM event_deliveries d WHERE d.event_id = req.event_id), 0)
				+ row_number() OVER (PARTITION BY req.event_id ORDER BY req.ord),
			req.status_code, nullif(req.err, ''), req.duration_ms, nullif(req.body, '')
		FROM req
	)
	SELECT ord, (SELECT count(*) FROM successors) FROM upd`

// recordBatch runs deliveryRecordSQL for reqs. A batch that fails for one of its rows (say two
// replicas numbering one event's attempt alike) is run again row by row, so that only that row's
// caller gets the error (a lost connection fails each row again, and so every caller).
func (s *Store) recordBatch(ctx context.Context, reqs []record) ([]bool, []error, error) {
	applied, err := s.recordRows(ctx, reqs)
	if err == nil || len(reqs) == 1 {
		return applied, nil, err
	}
	applied = make([]bool, len(reqs))
	errs := make([]error, len(reqs))
	for i := range reqs {
		one, err := s.recordRows(ctx, reqs[i:i+1])
		if err != nil {
			errs[i] = err
			continue
		}
		applied[i] = one[0]
	}
	return applied, errs, nil
}

func (s *Store) recordRows(ctx context.Context, reqs []record) ([]bool, error) {
	n := len(reqs)
	ids, outcomes, errs, bodies := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	nextIn := make([]float64, n)
	attempts := make([]int32, n)
	claims := make([]time.Time, n)
	codes := make([]*int32, n)
	millis := make([]int64, n)
	for i, r := range reqs {
		ids[i], outcomes[i], errs[i], bodies[i] = r.eventID, r.a.Outcome, r.a.Err, r.a.ResponseBody
		nextIn[i], attempts[i], claims[i], millis[i] = r.a.NextIn.Seconds(), r.a.Attempts, r.a.Claim, r.a.Duration.Milliseconds()
		if r.a.StatusCode != 0 {
			c := int32(r.a.StatusCode)
			codes[i] = &c
		}
	}
	rows, err := s.pool.Query(ctx, deliveryRecordSQL, ids, outcomes, errs, nextIn, attempts, claims, codes, millis, bodies,
		execution.EventsNotifyChannel)
	if err != nil {
		return nil, fmt.Errorf("record delivery of %d events: %w", n, err)
	}
	ords, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int64, error) {
		var ord, notified int64
		err := r.Scan(&ord, &notified)
		return ord, err
	})
	if err != nil {
		return nil, fmt.Errorf("record delivery of %d events: %w", n, err)
	}
	applied := make([]bool, n)
	for _, o := range ords {
		applied[o-1] = true
	}
	return applied, nil
}

// EventUnrelay makes events handed to an in-process deliverer but not delivered by it (it was
// stopped first) unrelayed again, so that a relay — this replica's or another's — publishes their
// notices at once rather than after the stale-notice window. An event under a live delivery claim,
// or no longer pending, is left alone.
func (s *Store) EventUnrelay(ctx context.Context, ids []string) error {
	if _, err := s.pool.Exec(ctx, `
		UPDATE integration_events SET relayed_at = NULL, relay_claimed_until = NULL
		WHERE id = ANY($1::uuid[]) AND delivery_status = `+pendingSQL+` AND relayed_at IS NOT NULL
			AND (delivery_claimed_until IS NULL OR delivery_claimed_until < now())`, ids); err != nil {
		return fmt.Errorf("unrelay %d events: %w", len(ids), err)
	}
	return nil
}
