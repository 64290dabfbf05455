// Package store is the SQL the settlement service owns: the compare-and-set that writes an
// execution's final outcome and the insertion of its completion event, in one statement.
package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// Outcome is what a settler asks for.
type Outcome struct {
	ExecutionID string
	Attempt     int32
	FromStatus  execution.Status // the status the settler read
	Status      execution.Status // succeeded, failed or cancelled
	Result      []byte           // JSON object, for succeeded
	Failure     execution.Failure
	// AttemptOutcome closes the attempt's row; empty means Status (the sweeper's timeout is the
	// one outcome that differs from the execution's status).
	AttemptOutcome execution.AttemptOutcome
}

// Conflict says why a settlement changed nothing.
type Conflict struct {
	// Current status and attempt of the execution.
	Status  execution.Status
	Attempt int32
}

// ErrNotFound means no execution has the id.
var ErrNotFound = errors.New("execution not found")

// ConflictError is returned when the compare-and-set found the execution in another state.
type ConflictError struct{ Conflict }

func (e *ConflictError) Error() string {
	return fmt.Sprintf("execution is %s at attempt %d", e.Status, e.Attempt)
}

// Settled is the result of a winning settlement.
type Settled struct {
	Execution *execution.Row
	EventID   string
}

// Store settles executions.
type Store struct {
	pool    *pgxpool.Pool
	batcher *batch.Batcher[settleRequest, settleAnswered]
	// lockTimeout bounds a batch's lock waits (batchLockTimeout; tests lengthen it).
	lockTimeout time.Duration
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store {
	s := &Store{pool: pool, lockTimeout: batchLockTimeout}
	s.batcher = batch.New(s.settleBatch, batch.Options{Name: "settlement", MaxSize: settleBatchMax, Concurrency: settleBatchConcurrency})
	return s
}

// ExecutionSettle writes the outcome if and only if the execution is still in o.FromStatus at
// o.Attempt; then, in the same statement, it closes the attempt, drops a waiting dispatch record
// (from pending) and inserts the completion event. A losing writer gets a *ConflictError and
// changes nothing. Concurrent calls (and AttemptFail's) are batched: one transaction, one
// round trip, one statement each (settleBatch).
func (s *Store) ExecutionSettle(ctx context.Context, o Outcome) (*Settled, error) {
	r := settleRequest{settle: &o}
	a, err := s.batcher.Do(ctx, r)
	if errors.Is(err, errLockWait) {
		a, err = s.settleOne(ctx, r) // its execution is locked elsewhere: wait for it alone
	}
	return a.settled, err
}

// querier is a pool, a transaction or a savepoint.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// returned are the settled row's columns the caller's answer needs (Row.Proto without the
// payload) that it does not already hold: no payload, no result (the request has it).
const returned = `s.application_id, s.capability, s.mode, s.max_attempts, s.idempotency_key, s.progress,
	s.deadline_at, s.created_at, s.updated_at, s.settled_at`

// completedBodySQL is the completion event's body, built from the settled row s, for the event
// id and type given (SQL expressions).
func completedBodySQL(id, typ string) string {
	return execution.EventBodySQL(id, typ, "s.settled_at", execution.CompletedDataSQL("s"))
}

// settleSQL is a settlement in one statement. cur locks the execution and reads its current
// status and attempt (FOR UPDATE waits for a concurrent settler and then sees what it wrote, so
// a loser's conflict answer names the winner's status); s is the compare-and-set; the attempt's
// close, the dispatch record's deletion, the event and the relay's wake-up (pg_notify, delivered
// at commit) happen only if s wrote. No row back: no such execution.
//
// $1 id, $2 attempt, $3 from status, $4 status, $5 result, $6..$9 failure class, reason, code,
// message, $10 the attempt's outcome, $11 event id, $12 event type, $13 notify channel.
var settleSQL = `
	WITH cur AS (
		SELECT id, status, attempt FROM executions WHERE id = $1 FOR UPDATE
	), s AS (
		UPDATE executions e
		SET status = $4, result = $5, failure_class = $6, failure_reason = $7, failure_code = $8,
			failure_message = $9, lease_expires_at = NULL, settled_at = now(), updated_at = now(),
			event_seq = e.event_seq + 1
		FROM cur
		WHERE e.id = cur.id AND cur.attempt = $2 AND cur.status = $3
		RETURNING e.*
	), att AS (
		UPDATE execution_attempts a SET ended_at = now(), outcome = $10,
			failure_class = coalesce($6, a.failure_class), failure_code = coalesce($8, a.failure_code),
			failure_message = coalesce($9, a.failure_message)
		FROM s
		WHERE a.execution_id = s.id AND a.n = $2 AND a.ended_at IS NULL
	), dis AS (
		-- The next attempt will not start: its waiting dispatch record goes too. One already
		-- published finds the execution settled and is acknowledged without effect.
		DELETE FROM dispatches d USING s WHERE d.execution_id = s.id AND $3::text = ` + execution.Literal(execution.StatusPending) + `
	), ev AS (
		-- The event carries the execution's trace context (its accept's), which the event-router's
		-- relay and delivery continue.
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, next_attempt_at,
			traceparent, tracestate, sequence)
		SELECT $11::uuid, s.application_id, s.id, $12::text, ` + completedBodySQL("$11::uuid", "$12::text") + `, now(),
			s.traceparent, s.tracestate, s.event_seq
		FROM s
		RETURNING id
	), notified AS (
		SELECT pg_notify($13::text, id::text) FROM ev
	)
	SELECT cur.status, cur.attempt, s.id IS NOT NULL, ` + returned + `, (SELECT count(*) FROM notified)
	FROM cur LEFT JOIN s ON true`

// settleArgs are settleSQL's arguments.
func settleArgs(o Outcome, eventID uuid.UUID) []any {
	f := o.Failure
	return []any{o.ExecutionID, o.Attempt, o.FromStatus, o.Status, o.Result,
		nullable(f.Class), nullable(f.Reason), nullable(f.Code), nullable(f.Message),
		cmp.Or(o.AttemptOutcome, execution.AttemptOutcome(o.Status)), eventID, execution.EventTypeExecutionComplete, execution.EventsNotifyChannel}
}

// settled is a settleSQL or attemptFailSQL answer.
type settled struct {
	cur      Conflict // the execution as the statement found it
	won      bool
	row      execution.Row // the returned columns
	notified int64
}

// scanSettled reads the columns settleSQL selects; more are the statement's own, after them.
func scanSettled(r pgx.Row, more ...any) (settled, error) {
	var (
		a                                 settled
		application, capability, mode     *string
		maxAttempts                       *int32
		deadline, created, updated, setAt *time.Time
	)
	err := r.Scan(append([]any{&a.cur.Status, &a.cur.Attempt, &a.won, &application, &capability, &mode, &maxAttempts,
		&a.row.IdempotencyKey, &a.row.Progress, &deadline, &created, &updated, &setAt, &a.notified}, more...)...)
	if err != nil {
		return a, err
	}
	if a.won {
		a.row.ApplicationID, a.row.Capability, a.row.Mode, a.row.MaxAttempts = *application, *capability, *mode, *maxAttempts
		a.row.DeadlineAt, a.row.CreatedAt, a.row.UpdatedAt, a.row.SettledAt = *deadline, *created, *updated, setAt
	}
	return a, nil
}

func newEventID() (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.UUID{}, fmt.Errorf("event id: %w", err)
	}
	return id, nil
}

func settle(ctx context.Context, q querier, o Outcome) (*Settled, error) {
	eventID, err := newEventID()
	if err != nil {
		return nil, err
	}
	a, err := scanSettled(q.QueryRow(ctx, settleSQL, settleArgs(o, eventID)...))
	return settleAnswer(o, eventID, a, err)
}

// settleAnswer turns settleSQL's answer into ExecutionSettle's.
func settleAnswer(o Outcome, eventID uuid.UUID, a settled, err error) (*Settled, error) {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("settle execution %s: %w", o.ExecutionID, err)
	case !a.won:
		return nil, &ConflictError{a.cur}
	}
	row := a.row
	f := o.Failure
	row.ID, row.Status, row.Attempt, row.Result = o.ExecutionID, o.Status, o.Attempt, o.Result
	row.FailureClass, row.FailureReason, row.FailureCode, row.FailureMessage = nullable(f.Class), nullable(f.Reason), nullable(f.Code), nullable(f.Message)
	return &Settled{Execution: &row, EventID: eventID.String()}, nil
}

// AttemptFailure is a failed attempt to record.
type AttemptFailure struct {
	ExecutionID string
	Attempt     int32
	Failure     execution.Failure // class, code, message
	Retryable   bool
	RetryAfter  time.Duration
	// Scale shrinks the retry schedule's delays (and RetryAfter) for tests and demos
	// (config.Common.Scale).
	Scale func(time.Duration) time.Duration
	// Outcome closes the attempt's row: failed unless set (an expired lease is a timeout).
	Outcome execution.AttemptOutcome
	// ExhaustedReason, if set, is the failure reason when a retryable failure leaves no retry,
	// in place of retry_exhausted.attempt_limit or retry_exhausted.budget: the sweeper's
	// lease_expired.
	ExhaustedReason string
	// Policy is the execution's retry policy; AttemptFail reads it when nil (the sweeper claims
	// it with the execution).
	Policy *execution.RetryPolicy
}

// decision is a's retry decision (execution.Decide); a.Policy must be set.
func (a AttemptFailure) decision() execution.Decision {
	return execution.Decide(a.Attempt, *a.Policy, a.Retryable, a.RetryAfter, a.ExhaustedReason, a.Scale)
}

// AttemptFailed is what AttemptFail decided: a next attempt (NextAttemptAt set) or a settlement.
type AttemptFailed struct {
	Execution     *execution.Row
	NextAttemptAt *time.Time
	EventID       string
}

// AttemptFail records a failed attempt and what follows it, as execution.Decide decides from the
// execution's retry policy (read first): the next attempt's dispatch record, due after the
// decided delay, or — when the failure is permanent, the ceiling is reached or the next attempt
// would start past the deadline — the failed settlement with its event. The due time and the
// deadline check are the database's: now() plus the delay, compared in SQL. Concurrent calls
// (and ExecutionSettle's) are batched, as ExecutionSettle says.
func (s *Store) AttemptFail(ctx context.Context, a AttemptFailure) (*AttemptFailed, error) {
	if a.Policy == nil {
		p, err := retryPolicy(ctx, s.pool, a.ExecutionID)
		if err != nil {
			return nil, err
		}
		a.Policy = p
	}
	r := settleRequest{fail: &a}
	out, err := s.batcher.Do(ctx, r)
	if errors.Is(err, errLockWait) {
		out, err = s.settleOne(ctx, r) // its execution is locked elsewhere: wait for it alone
	}
	return out.failed, err
}

// policyColumns are what retryPolicy and the sweeper's claim read of an execution e and its
// capability c: the retry policy.
const policyColumns = `e.max_attempts, c.retry_delays_ms`

// retryPolicy reads an execution's retry policy. The ceiling is fixed at acceptance; the
// schedule is the capability's as it is now, as the next attempt's due time always was.
func retryPolicy(ctx context.Context, q querier, id string) (*execution.RetryPolicy, error) {
	var (
		p  execution.RetryPolicy
		ms []int64
	)
	err := q.QueryRow(ctx, `SELECT `+policyColumns+`
		FROM executions e JOIN capabilities c ON c.name = e.capability WHERE e.id = $1`, id).Scan(&p.MaxAttempts, &ms)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("read the retry policy of %s: %w", id, err)
	}
	p.Schedule = execution.ScheduleFromMillis(ms)
	return &p, nil
}

// attemptFailSQL records the retry decision in one statement. cur locks the execution (and reads
// the latest committed version, as in settleSQL); d is the decision for the running attempt $2 —
// Decide's exhausted reason, or the budget's if the next attempt, due the delay after now(), would
// start past the deadline, or NULL for a next attempt; s writes it (back to pending, or failed
// and settled); then the attempt's close, and either the next attempt's dispatch record or the
// completion event and the relay's wake-up.
//
// $1 id, $2 attempt, $3 the decided exhausted reason (NULL: a next attempt if the deadline allows),
// $4 the delay in seconds, $5 the reason if the deadline does not allow it, $6..$8 failure class,
// code, message, $9 the attempt's outcome, $10 event id, $11 event type, $12 notify channel.
// retried is the attempt-fail statement's test that it retried (Retry) rather than exhausted.
var retried = "s.status = " + execution.Retry.ToSQL()

var attemptFailSQL = `
	WITH cur AS (
		SELECT e.id, e.status, e.attempt, e.deadline_at
		FROM executions e
		WHERE e.id = $1
		FOR UPDATE
	), d AS (
		SELECT id, CASE
			WHEN $3::text IS NOT NULL THEN $3::text
			WHEN now() + make_interval(secs => $4::float8) > deadline_at THEN $5::text
		END AS reason
		FROM cur
		WHERE ` + execution.Retry.FromSQL("status") + ` AND attempt = $2
	), s AS (
		UPDATE executions e
		SET status = CASE WHEN d.reason IS NULL THEN ` + execution.Retry.ToSQL() + ` ELSE ` + execution.Exhaust.ToSQL() + ` END,
			result = CASE WHEN d.reason IS NULL THEN e.result END,
			failure_class = $6, failure_reason = d.reason, failure_code = $7, failure_message = $8,
			lease_expires_at = NULL, updated_at = now(),
			settled_at = CASE WHEN d.reason IS NOT NULL THEN now() END,
			event_seq = e.event_seq + CASE WHEN d.reason IS NOT NULL THEN 1 ELSE 0 END
		FROM d
		WHERE e.id = d.id
		RETURNING e.*
	), att AS (
		UPDATE execution_attempts a SET ended_at = now(), outcome = $9,
			failure_class = CASE WHEN ` + retried + ` THEN $6 ELSE coalesce($6, a.failure_class) END,
			failure_code = CASE WHEN ` + retried + ` THEN $7 ELSE coalesce($7, a.failure_code) END,
			failure_message = CASE WHEN ` + retried + ` THEN $8 ELSE coalesce($8, a.failure_message) END
		FROM s
		WHERE a.execution_id = s.id AND a.n = $2 AND (a.ended_at IS NULL OR ` + retried + `)
	), dis AS (
		INSERT INTO dispatches (execution_id, attempt, due_at)
		SELECT s.id, $2 + 1, now() + make_interval(secs => $4::float8) FROM s WHERE ` + retried + `
		RETURNING due_at
	), ev AS (
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, next_attempt_at,
			traceparent, tracestate, sequence)
		SELECT $10::uuid, s.application_id, s.id, $11::text, ` + completedBodySQL("$10::uuid", "$11::text") + `, now(),
			s.traceparent, s.tracestate, s.event_seq
		FROM s
		WHERE NOT (` + retried + `)
		RETURNING id
	), notified AS (
		SELECT pg_notify($12::text, id::text) FROM ev
	)
	SELECT cur.status, cur.attempt, s.id IS NOT NULL, ` + returned + `, (SELECT count(*) FROM notified),
		s.status, s.failure_reason, dis.due_at
	FROM cur LEFT JOIN s ON true LEFT JOIN dis ON true`

// attemptFailArgs are attemptFailSQL's arguments.
func attemptFailArgs(a AttemptFailure, eventID uuid.UUID) []any {
	f, d := a.Failure, a.decision()
	return []any{a.ExecutionID, a.Attempt, nullable(d.Exhausted), d.Delay.Seconds(), d.Budget,
		nullable(f.Class), nullable(f.Code), nullable(f.Message),
		cmp.Or(a.Outcome, execution.AttemptFailed), eventID, execution.EventTypeExecutionComplete, execution.EventsNotifyChannel}
}

// attemptFail records a's retry decision. It is the only place that writes one: the FailAttempt
// call and the sweeper both come here.
func attemptFail(ctx context.Context, q querier, a AttemptFailure) (*AttemptFailed, error) {
	eventID, err := newEventID()
	if err != nil {
		return nil, err
	}
	var (
		status *execution.Status
		reason *string
		next   *time.Time
	)
	ans, err := scanSettled(q.QueryRow(ctx, attemptFailSQL, attemptFailArgs(a, eventID)...), &status, &reason, &next)
	return attemptFailAnswer(a, eventID, ans, status, reason, next, err)
}

// attemptFailAnswer turns attemptFailSQL's answer into AttemptFail's.
func attemptFailAnswer(a AttemptFailure, eventID uuid.UUID, ans settled, status *execution.Status, reason *string, next *time.Time, err error) (*AttemptFailed, error) {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("record failed attempt %d of %s: %w", a.Attempt, a.ExecutionID, err)
	case !ans.won:
		return nil, &ConflictError{ans.cur}
	}
	row := ans.row
	f := a.Failure
	row.ID, row.Status, row.Attempt = a.ExecutionID, *status, a.Attempt
	row.FailureClass, row.FailureReason, row.FailureCode, row.FailureMessage = nullable(f.Class), reason, nullable(f.Code), nullable(f.Message)
	if *status == execution.StatusPending {
		return &AttemptFailed{Execution: &row, NextAttemptAt: next}, nil
	}
	return &AttemptFailed{Execution: &row, EventID: eventID.String()}, nil
}

// Why the sweeper ended an attempt.
const (
	SweptLeaseExpired   = "lease_expired"
	SweptDeadlinePassed = "deadline_passed"
	// SweptStranded is a pending execution past its deadline that nothing will start any more:
	// no dispatch record waits for it (its message was dead-lettered, e.g. during a database
	// outage).
	SweptStranded = "stranded"
)

// Swept is one running execution the sweeper ended the attempt of.
type Swept struct {
	ExecutionID string
	Attempt     int32
	// Cause is SweptLeaseExpired or SweptDeadlinePassed.
	Cause string
	// Result is the retry decision: a next attempt or a failed settlement. Nil when Err is set.
	Result *AttemptFailed
	// Err, if set, says why this execution could not be handled; its changes were rolled back and
	// it is left for a later pass.
	Err error
}

// ExecutionSweep claims up to limit running executions whose lease expired or whose deadline
// passed (FOR UPDATE SKIP LOCKED, so that several sweepers share the work without meeting) and
// ends each one's attempt as a timeout through the same retry decision as AttemptFail, in one
// transaction:
//   - an expired lease is a retryable timeout: the next attempt is scheduled if the ceiling and
//     the budget allow; otherwise the execution settles failed with reason lease_expired;
//   - a deadline that passed while the attempt ran settles failed with retry_exhausted.budget;
//   - a sync execution, whose lease is its sync deadline and which has one attempt, settles
//     failed with lease_expired.
//
// Each execution is handled in a savepoint of its own, so that one that cannot be handled is
// reported in its Swept.Err and does not hold back the others.
//
// A lease or deadline counts as passed only grace after it: an adapter call is cut at the lease
// (or the sync deadline), and an outcome that arrived just in time is still on its way to
// settlement; sweeping it in between would fail work the provider did.
func (s *Store) ExecutionSweep(ctx context.Context, limit int, grace time.Duration, scale func(time.Duration) time.Duration) ([]Swept, error) {
	var out []Swept
	err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT e.id::text, e.attempt, e.mode, e.deadline_at < now() - make_interval(secs => $2), `+policyColumns+`
			FROM executions e JOIN capabilities c ON c.name = e.capability
			WHERE `+execution.Sweep.FromSQL("e.status")+` AND (e.lease_expires_at < now() - make_interval(secs => $2)
				OR e.deadline_at < now() - make_interval(secs => $2))
			LIMIT $1
			FOR UPDATE OF e SKIP LOCKED`, limit, grace.Seconds())
		if err != nil {
			return fmt.Errorf("claim expired executions: %w", err)
		}
		type claimed struct {
			id           string
			attempt      int32
			mode         string
			pastDeadline bool
			policy       execution.RetryPolicy
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
			var (
				c  claimed
				ms []int64
			)
			err := r.Scan(&c.id, &c.attempt, &c.mode, &c.pastDeadline, &c.policy.MaxAttempts, &ms)
			c.policy.Schedule = execution.ScheduleFromMillis(ms)
			return c, err
		})
		if err != nil {
			return fmt.Errorf("claim expired executions: %w", err)
		}
		for _, c := range list {
			a := AttemptFailure{ExecutionID: c.id, Attempt: c.attempt, Retryable: true, Scale: scale, Policy: &c.policy,
				Outcome: execution.AttemptTimeout, ExhaustedReason: execution.ReasonLeaseExpired,
				Failure: execution.Failure{Class: execution.ClassTimeout,
					Message: "the lease expired without a renewal or an outcome from the adapter"}}
			sw := Swept{ExecutionID: c.id, Attempt: c.attempt, Cause: SweptLeaseExpired}
			if c.pastDeadline && c.mode != execution.ModeSync {
				sw.Cause = SweptDeadlinePassed
				a.ExhaustedReason = execution.ReasonBudget
				a.Failure.Message = "the execution's deadline passed while the attempt was running"
			}
			sw.Result, sw.Err = sweepOne(ctx, tx, a)
			out = append(out, sw)
		}
		return nil
	})
	return out, err
}

// ExecutionSweepStranded settles failed, with reason retry_exhausted.budget and its completion
// event, up to limit pending executions whose deadline passed grace ago and for which no
// dispatch record waits: their next attempt can no longer start in time (its message, if any,
// is in a dead-letter queue or about to be skipped as obsolete), and without this they would
// never settle.
func (s *Store) ExecutionSweepStranded(ctx context.Context, limit int, grace time.Duration) ([]Swept, error) {
	var out []Swept
	err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT id::text, attempt, coalesce(failure_class, '')
			FROM executions e
			WHERE `+execution.Strand.FromSQL("status")+` AND deadline_at < now() - make_interval(secs => $2)
				AND NOT EXISTS (SELECT 1 FROM dispatches d WHERE d.execution_id = e.id)
			LIMIT $1
			FOR UPDATE SKIP LOCKED`, limit, grace.Seconds())
		if err != nil {
			return fmt.Errorf("claim stranded executions: %w", err)
		}
		type claimed struct {
			id      string
			attempt int32
			class   string
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
			var c claimed
			err := r.Scan(&c.id, &c.attempt, &c.class)
			return c, err
		})
		if err != nil {
			return fmt.Errorf("claim stranded executions: %w", err)
		}
		for _, c := range list {
			class := c.class
			if class == "" {
				class = execution.ClassTimeout
			}
			sw := Swept{ExecutionID: c.id, Attempt: c.attempt, Cause: SweptStranded}
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				settled, err := settle(ctx, sp, Outcome{ExecutionID: c.id, Attempt: c.attempt,
					FromStatus: execution.StatusPending, Status: execution.StatusFailed,
					Failure: execution.Failure{Class: class, Reason: execution.ReasonBudget,
						Message: "the deadline passed before the next attempt could start"}})
				if err == nil {
					sw.Result = &AttemptFailed{Execution: settled.Execution, EventID: settled.EventID}
				}
				return err
			})
			if err != nil {
				sw.Err = fmt.Errorf("sweep stranded %s: %w", c.id, err)
			}
			out = append(out, sw)
		}
		return nil
	})
	return out, err
}

// sweepOne runs the retry decision for one claimed execution in a savepoint.
func sweepOne(ctx context.Context, tx pgx.Tx, a AttemptFailure) (*AttemptFailed, error) {
	var out *AttemptFailed
	err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		var err error
		out, err = attemptFail(ctx, sp, a)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sweep attempt %d of %s: %w", a.Attempt, a.ExecutionID, err)
	}
	return out, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
