package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// Event is an integration_events row as the events API shows it.
type Event struct {
	ID            string
	ApplicationID string
	Type          string
	ExecutionID   string
	// Data is the event body's "data" object (JSON), nil if the body has none.
	Data          []byte
	CreatedAt     time.Time
	Status        execution.EventStatus
	Attempts      int32
	NextAttemptAt *time.Time
	LastError     *string
	DeliveredAt   *time.Time
	DeadAt        *time.Time
	// Sequence is the event's place among its execution's events (data.sequence).
	Sequence int32
}

// eventColumns are the columns scanEvent reads, in order.
const eventColumns = `id::text, type, execution_id::text, payload->'data', created_at, delivery_status, attempts,
	next_attempt_at, last_error, delivered_at, dead_at, sequence, application_id`

// eventListColumns are eventColumns with the event's data less its "result" (an execution's
// result, up to a MiB): list items leave it out, GetEvent has it. The rest of data (status,
// failure, bounded texts) stays, so that a list still tells what each event says.
var eventListColumns = strings.Replace(eventColumns, "payload->'data'", "(payload->'data') - 'result'", 1)

func scanEvent(r pgx.Row) (*Event, error) {
	var e Event
	err := r.Scan(&e.ID, &e.Type, &e.ExecutionID, &e.Data, &e.CreatedAt, &e.Status, &e.Attempts,
		&e.NextAttemptAt, &e.LastError, &e.DeliveredAt, &e.DeadAt, &e.Sequence, &e.ApplicationID)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// Delivery is one event_deliveries row.
type Delivery struct {
	N            int32
	At           time.Time
	StatusCode   *int32
	Error        *string
	Duration     time.Duration
	ResponseBody *string
}

// EventFilter narrows EventList.
type EventFilter struct {
	Status      execution.EventStatus
	ExecutionID string
	// Since (inclusive) and Until (exclusive) bound created_at when set.
	Since, Until *time.Time
	// Before is the id to continue after (exclusive), from the previous page.
	Before string
	Limit  int
}

// EventList lists the application's events (AnyApplication: every application's, the
// operator's view), newest first (ids are UUIDv7, so id order is creation order).
func (s *Store) EventList(ctx context.Context, applicationID string, f EventFilter) ([]*Event, error) {
	query, args := eventListQuery(applicationID, f)
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Event, error) { return scanEvent(r) })
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return list, nil
}

// eventListQuery is EventList's statement for the filters f has: a status filter is an index
// condition on integration_events_application_id_status_id_idx, an execution filter on
// integration_events_execution_id_sequence_key, and the page boundary on either id index, whatever
// plan Postgres caches. The ORDER BY names the table's column: a bare "id" is the output column
// id::text, and sorting by the text left no index usable for the order (every list read and
// sorted all of the application's matching events).
func eventListQuery(applicationID string, f EventFilter) (string, []any) {
	w := &where{}
	if applicationID != AnyApplication {
		w.add("application_id = ?", applicationID)
	}
	if f.Status != "" {
		w.add("delivery_status = ?", f.Status)
	}
	if f.ExecutionID != "" {
		w.add("execution_id = ?::uuid", f.ExecutionID)
	}
	if f.Since != nil {
		w.add("created_at >= ?", *f.Since)
	}
	if f.Until != nil {
		w.add("created_at < ?", *f.Until)
	}
	if f.Before != "" {
		w.add("id < ?::uuid", f.Before)
	}
	limit := w.param(f.Limit)
	return `SELECT ` + eventListColumns + `
		FROM integration_events
		` + w.clause() + `
		ORDER BY integration_events.id DESC
		LIMIT ` + limit, w.args
}

// EventGet reads one of the application's events (AnyApplication: any application's) with its
// delivery attempts, oldest first.
func (s *Store) EventGet(ctx context.Context, applicationID, id string) (*Event, []Delivery, error) {
	e, err := scanEvent(s.pool.QueryRow(ctx, `SELECT `+eventColumns+`
		FROM integration_events WHERE id = $1 AND ($2 = '' OR application_id = $2)`, id, applicationID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read event %s: %w", id, err)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT n, at, status_code, error, duration_ms, response_body
		FROM event_deliveries WHERE event_id = $1 ORDER BY n`, id)
	if err != nil {
		return nil, nil, fmt.Errorf("read deliveries of %s: %w", id, err)
	}
	deliveries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		var ms int64
		err := r.Scan(&d.N, &d.At, &d.StatusCode, &d.Error, &ms, &d.ResponseBody)
		d.Duration = time.Duration(ms) * time.Millisecond
		return d, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read deliveries of %s: %w", id, err)
	}
	return e, deliveries, nil
}

// redeliverSet is the reset a redelivery makes: pending with a fresh attempt budget, and
// unrelayed, so that the event router's relay publishes a new notice of it. The relay claim is
// dropped too: a relay holding one from before would otherwise mark the event relayed after its
// own (earlier) notice, and the redelivery would publish nothing. A delivery claim is kept, so a
// new notice waits for an attempt in flight instead of racing it. Delivery history is kept: new
// attempts continue its numbering.
var redeliverSet = `
	SET delivery_status = ` + execution.EventRedeliver.ToSQL() + `, attempts = 0, next_attempt_at = NULL, last_error = NULL,
		delivered_at = NULL, dead_at = NULL, relayed_at = NULL, relay_claimed_until = NULL`

// EventRedeliver resets one of the application's events (AnyApplication: any application's) for
// delivery, whatever its state, and wakes the relay. a (nil: none) is written in the same
// transaction, with the event's execution, type and application added to its detail.
func (s *Store) EventRedeliver(ctx context.Context, applicationID, id string, a *Audit) (*Event, error) {
	var e *Event
	err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		e, err = scanEvent(tx.QueryRow(ctx, `UPDATE integration_events`+redeliverSet+`
			WHERE id = $1 AND ($2 = '' OR application_id = $2)
			RETURNING `+eventColumns, id, applicationID))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("redeliver event %s: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, execution.EventsNotifyChannel, id); err != nil {
			return fmt.Errorf("notify event relay: %w", err)
		}
		if a == nil {
			return nil
		}
		return auditInsert(ctx, tx, a.With("execution_id", e.ExecutionID).With("type", e.Type).With("application_id", e.ApplicationID))
	})
	return e, err
}

// EventRedrive resets every dead event of the application (AnyApplication: of every
// application; created at or after since, if set) for delivery, as EventRedeliver does for one, in one statement, wakes the relay if any was
// reset, and returns how many were. The NOTIFY payload is the same for every row, so Postgres
// sends it once per transaction. a (nil: none) is written in the same transaction, with the
// count added to its detail.
func (s *Store) EventRedrive(ctx context.Context, applicationID string, since *time.Time, a *Audit) (int64, error) {
	var n int64
	w := deadEventsWhere(applicationID, since)
	channel := w.param(execution.EventsNotifyChannel)
	err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
		WITH redriven AS (
			UPDATE integration_events`+redeliverSet+`
			WHERE `+w.String()+`
			RETURNING id
		)
		SELECT count(*) FROM (SELECT pg_notify(`+channel+`, 'redrive') FROM redriven) notified`,
			w.args...).Scan(&n)
		if err != nil {
			return fmt.Errorf("redrive dead events of %s: %w", applicationID, err)
		}
		if a == nil {
			return nil
		}
		return auditInsert(ctx, tx, a.With("count", n))
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// GRPCConsumer is a gRPC consumer as registered.
type GRPCConsumer struct {
	// Target is host:port.
	Target string
	// Plaintext: delivered without TLS (where the deployment allows it).
	Plaintext bool
	// CAPEM is the CA bundle the target's certificate must chain to; nil: the system roots.
	CAPEM *string
}

// ConsumerSetGRPC registers the application's gRPC EventConsumerService endpoint. Like
// ConsumerSetWebhook it keeps a signing secret the application has, or stores sealedNew, and
// returns the sealed secret in force: both kinds' deliveries are signed with it.
func (s *Store) ConsumerSetGRPC(ctx context.Context, applicationID string, c GRPCConsumer, sealedNew []byte) ([]byte, error) {
	return s.consumerSet(ctx, applicationID, "grpc", c.Target, c.Plaintext, c.CAPEM, sealedNew)
}

// consumerSet stores the consumer; a webhook's row has plaintext false and no CA.
func (s *Store) consumerSet(ctx context.Context, applicationID, kind, endpoint string, plaintext bool, caPEM *string, sealedNew []byte) ([]byte, error) {
	var sealed []byte
	err := s.pool.QueryRow(ctx, `
		UPDATE applications
		SET consumer_kind = $2, consumer_endpoint = $3,
			consumer_grpc_plaintext = $5, consumer_grpc_ca = $6,
			signing_secret_enc = coalesce(signing_secret_enc, $4), updated_at = now()
		WHERE id = $1
		RETURNING signing_secret_enc`, applicationID, kind, endpoint, sealedNew, plaintext, caPEM).Scan(&sealed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("set consumer of %s: %w", applicationID, err)
	}
	return sealed, nil
}

// SigningSecretRotate makes sealedNew the application's signing secret and keeps the one it
// replaces as the previous secret until overlap from now (the database's clock, which the event
// router compares against). It returns that deadline, or nil when the application had no secret
// to keep. A rotation during an overlap replaces the previous secret: only one is kept.
func (s *Store) SigningSecretRotate(ctx context.Context, applicationID string, sealedNew []byte, overlap time.Duration) (*time.Time, error) {
	var until *time.Time
	err := s.pool.QueryRow(ctx, `
		UPDATE applications
		SET signing_secret_prev_enc = signing_secret_enc,
			signing_secret_prev_until = CASE WHEN signing_secret_enc IS NOT NULL
				THEN now() + make_interval(secs => $3) END,
			signing_secret_enc = $2, updated_at = now()
		WHERE id = $1
		RETURNING signing_secret_prev_until`, applicationID, sealedNew, overlap.Seconds()).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("rotate signing secret of %s: %w", applicationID, err)
	}
	return until, nil
}

// EventRedriveCount counts the dead events of the application (AnyApplication: of every
// application; created at or after since, if set) that EventRedrive would reset: the preview an
// operator sees before redriving.
func (s *Store) EventRedriveCount(ctx context.Context, applicationID string, since *time.Time) (int64, error) {
	var n int64
	w := deadEventsWhere(applicationID, since)
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM integration_events WHERE `+w.String(), w.args...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count dead events of %s: %w", applicationID, err)
	}
	return n, nil
}

// deadEventsWhere is the condition of a redrive and of its preview: one SQL text per shape of
// filter (see where), so that each keeps its index condition. Every application's dead events
// (the operator's redrive) are found application by application on
// integration_events_application_id_status_id_idx: applications are few, events many, and a
// partial index of dead events would be chosen for an application's own dead list too.
func deadEventsWhere(applicationID string, since *time.Time) *where {
	w := &where{}
	if applicationID != AnyApplication {
		w.add("application_id = ?", applicationID)
	} else {
		w.conds = append(w.conds, "application_id IN (SELECT id FROM applications)")
	}
	w.add("delivery_status = ?", execution.EventDead)
	if since != nil {
		w.add("created_at >= ?", *since)
	}
	return w
}
