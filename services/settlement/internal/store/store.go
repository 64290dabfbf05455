// Package store is the SQL the settlement service owns: the compare-and-set that writes an
// execution's final outcome and the insertion of its completion event, in one transaction.
package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// Outcome is what a settler asks for.
type Outcome struct {
	ExecutionID string
	Attempt     int32
	FromStatus  string // the status the settler read
	Status      string // succeeded, failed or cancelled
	Result      []byte // JSON object, for succeeded
	Failure     execution.Failure
	// AttemptOutcome closes the attempt's row; empty means Status (the sweeper's timeout is the
	// one outcome that differs from the execution's status).
	AttemptOutcome string
}

// Conflict says why a settlement changed nothing.
type Conflict struct {
	// Current status and attempt of the execution.
	Status  string
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
	pool *pgxpool.Pool
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// ExecutionSettle writes the outcome if and only if the execution is still in o.FromStatus at
// o.Attempt; then, in the same transaction, it closes the attempt and inserts the completion
// event. A losing writer gets a *ConflictError and changes nothing.
func (s *Store) ExecutionSettle(ctx context.Context, o Outcome) (*Settled, error) {
	var out *Settled
	err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = settle(ctx, tx, o)
		return err
	})
	return out, err
}

func settle(ctx context.Context, tx pgx.Tx, o Outcome) (*Settled, error) {
	f := o.Failure
	row, err := execution.Scan(tx.QueryRow(ctx, `
		UPDATE executions
		SET status = $4, result = $5, failure_class = $6, failure_reason = $7, failure_code = $8,
			failure_message = $9, lease_expires_at = NULL, settled_at = now(), updated_at = now()
		WHERE id = $1 AND attempt = $2 AND status = $3
		RETURNING `+execution.Columns,
		o.ExecutionID, o.Attempt, o.FromStatus, o.Status, o.Result,
		nullable(f.Class), nullable(f.Reason), nullable(f.Code), nullable(f.Message)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, conflict(ctx, tx, o.ExecutionID)
	}
	if err != nil {
		return nil, fmt.Errorf("settle execution %s: %w", o.ExecutionID, err)
	}
	eventID, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("event id: %w", err)
	}
	payload, err := eventPayload(eventID.String(), row)
	if err != nil {
		return nil, err
	}
	// The rest of the settlement in one round trip (pgx pipelines a batch): close the attempt,
	// drop a waiting dispatch, insert the completion event, wake the event relay at commit.
	b := &pgx.Batch{}
	b.Queue(`
		UPDATE execution_attempts SET ended_at = now(), outcome = $3,
			failure_class = coalesce($4, failure_class), failure_code = coalesce($5, failure_code),
			failure_message = coalesce($6, failure_message)
		WHERE execution_id = $1 AND n = $2 AND ended_at IS NULL`,
		o.ExecutionID, o.Attempt, cmp.Or(o.AttemptOutcome, o.Status), nullable(f.Class), nullable(f.Code), nullable(f.Message))
	if o.FromStatus == execution.StatusPending {
		// The next attempt will not start: its waiting dispatch record goes too. One already
		// published finds the execution settled and is acknowledged without effect.
		b.Queue(`DELETE FROM dispatches WHERE execution_id = $1`, o.ExecutionID)
	}
	b.Queue(`
		INSERT INTO integration_events (id, application_id, execution_id, type, payload, next_attempt_at)
		VALUES ($1, $2, $3, $4, $5, now())`,
		eventID, row.ApplicationID, row.ID, execution.EventTypeExecutionComplete, payload)
	b.Queue(`SELECT pg_notify($1, $2)`, execution.EventsNotifyChannel, eventID.String())
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("close attempt %d, record the completion event of %s: %w", o.Attempt, o.ExecutionID, err)
	}
	return &Settled{Execution: row, EventID: eventID.String()}, nil
}

// AttemptFailure is a failed attempt to record.
type AttemptFailure struct {
	ExecutionID string
	Attempt     int32
	Failure     execution.Failure // class, code, message
	Retryable   bool
	RetryAfter  time.Duration
	// Scale shrinks the retry schedule's delays (and RetryAfter) for tests and demos.
	Scale func(time.Duration) time.Duration
	// Outcome closes the attempt's row: "failed" unless set (an expired lease is "timeout").
	Outcome string
	// ExhaustedReason, if set, is the failure reason when a retryable failure leaves no retry,
	// in place of retry_exhausted.attempt_limit or retry_exhausted.budget: the sweeper's
	// lease_expired.
	ExhaustedReason string
}

// AttemptFailed is what AttemptFail decided: a next attempt (NextAttemptAt set) or a settlement.
type AttemptFailed struct {
	Execution     *execution.Row
	NextAttemptAt *time.Time
	EventID       string
}

// AttemptFail records a failed attempt and decides what follows, in one transaction: the next
// attempt's dispatch record, due after the capability's retry delay for this attempt (or the
// adapter's retry_after if later), or — when the failure is permanent, the ceiling is reached or
// the next attempt would start past the deadline — the failed settlement with its event. The due
// time and the deadline check are the database's: now() plus the delay, compared in SQL.
func (s *Store) AttemptFail(ctx context.Context, a AttemptFailure) (*AttemptFailed, error) {
	var out *AttemptFailed
	err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = attemptFail(ctx, tx, a)
		return err
	})
	return out, err
}

// attemptFail is the retry decision, within tx. It is the only place that decides between a next
// attempt and a failed settlement: the FailAttempt call and the sweeper both come here.
func attemptFail(ctx context.Context, tx pgx.Tx, a AttemptFailure) (*AttemptFailed, error) {
	var (
		status              string
		attempt, maxAttempt int32
		delaysMS            []int64
	)
	err := tx.QueryRow(ctx, `
		SELECT e.status, e.attempt, e.max_attempts, c.retry_delays_ms
		FROM executions e JOIN capabilities c ON c.name = e.capability
		WHERE e.id = $1
		FOR UPDATE OF e`, a.ExecutionID).Scan(&status, &attempt, &maxAttempt, &delaysMS)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read execution %s: %w", a.ExecutionID, err)
	}
	if status != execution.StatusRunning || attempt != a.Attempt {
		return nil, &ConflictError{Conflict{Status: status, Attempt: attempt}}
	}
	outcome := cmp.Or(a.Outcome, execution.StatusFailed)
	f := a.Failure
	delay := a.Scale(time.Duration(delaysMS[min(int(a.Attempt), len(delaysMS))-1]) * time.Millisecond)
	if hint := a.Scale(a.RetryAfter); hint > delay {
		delay = hint
	}
	switch {
	case !a.Retryable:
		f.Reason = execution.ReasonAdapterPermanent
	case a.Attempt >= maxAttempt:
		f.Reason = cmp.Or(a.ExhaustedReason, execution.ReasonAttemptLimit)
	}
	var row *execution.Row
	if f.Reason == "" {
		// The next attempt is due delay after the database's now(), and it must start by the
		// deadline the database wrote: both are computed and compared here, in SQL, so that the
		// clocks of the hosts running settlement play no part. No row back means the budget does
		// not allow it.
		row, err = execution.Scan(tx.QueryRow(ctx, `
			UPDATE executions
			SET status = 'pending', failure_class = $2, failure_reason = NULL, failure_code = $3,
				failure_message = $4, lease_expires_at = NULL, updated_at = now()
			WHERE id = $1 AND now() + make_interval(secs => $5) <= deadline_at
			RETURNING `+execution.Columns, a.ExecutionID, nullable(f.Class), nullable(f.Code), nullable(f.Message), delay.Seconds()))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			f.Reason = cmp.Or(a.ExhaustedReason, execution.ReasonBudget)
		case err != nil:
			return nil, fmt.Errorf("return execution %s to pending: %w", a.ExecutionID, err)
		}
	}
	if f.Reason != "" {
		settled, err := settle(ctx, tx, Outcome{ExecutionID: a.ExecutionID, Attempt: a.Attempt,
			FromStatus: execution.StatusRunning, Status: execution.StatusFailed, Failure: f, AttemptOutcome: outcome})
		if err != nil {
			return nil, err
		}
		return &AttemptFailed{Execution: settled.Execution, EventID: settled.EventID}, nil
	}
	if _, err := tx.Exec(ctx, `
		UPDATE execution_attempts SET ended_at = now(), outcome = $3, failure_class = $4,
			failure_code = $5, failure_message = $6
		WHERE execution_id = $1 AND n = $2`,
		a.ExecutionID, a.Attempt, outcome, nullable(f.Class), nullable(f.Code), nullable(f.Message)); err != nil {
		return nil, fmt.Errorf("close attempt %d: %w", a.Attempt, err)
	}
	var next time.Time
	if err := tx.QueryRow(ctx, `
		INSERT INTO dispatches (execution_id, attempt, due_at) VALUES ($1, $2, now() + make_interval(secs => $3))
		RETURNING due_at`,
		a.ExecutionID, a.Attempt+1, delay.Seconds()).Scan(&next); err != nil {
		return nil, fmt.Errorf("schedule attempt %d: %w", a.Attempt+1, err)
	}
	return &AttemptFailed{Execution: row, NextAttemptAt: &next}, nil
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
			SELECT id::text, attempt, mode, deadline_at < now() - make_interval(secs => $2)
			FROM executions
			WHERE status = 'running' AND (lease_expires_at < now() - make_interval(secs => $2)
				OR deadline_at < now() - make_interval(secs => $2))
			LIMIT $1
			FOR UPDATE SKIP LOCKED`, limit, grace.Seconds())
		if err != nil {
			return fmt.Errorf("claim expired executions: %w", err)
		}
		type claimed struct {
			id           string
			attempt      int32
			mode         string
			pastDeadline bool
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
			var c claimed
			err := r.Scan(&c.id, &c.attempt, &c.mode, &c.pastDeadline)
			return c, err
		})
		if err != nil {
			return fmt.Errorf("claim expired executions: %w", err)
		}
		for _, c := range list {
			a := AttemptFailure{ExecutionID: c.id, Attempt: c.attempt, Retryable: true, Scale: scale,
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
			WHERE status = 'pending' AND deadline_at < now() - make_interval(secs => $2)
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

func conflict(ctx context.Context, tx pgx.Tx, id string) error {
	var c Conflict
	err := tx.QueryRow(ctx, `SELECT status, attempt FROM executions WHERE id = $1`, id).Scan(&c.Status, &c.Attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("read execution %s after a lost settlement: %w", id, err)
	}
	return &ConflictError{c}
}

// eventPayload is the completion event's body, as delivered to the application's consumer.
func eventPayload(eventID string, r *execution.Row) ([]byte, error) {
	type failure struct {
		Class   string `json:"class,omitempty"`
		Reason  string `json:"reason,omitempty"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message,omitempty"`
	}
	data := map[string]any{
		"execution_id": r.ID,
		"capability":   r.Capability,
		"mode":         r.Mode,
		"status":       r.Status,
		"attempt":      r.Attempt,
	}
	if r.IdempotencyKey != nil {
		data["idempotency_key"] = *r.IdempotencyKey
	}
	if r.Result != nil {
		data["result"] = json.RawMessage(r.Result)
	}
	if r.FailureReason != nil || r.FailureClass != nil {
		data["failure"] = failure{Class: str(r.FailureClass), Reason: str(r.FailureReason), Code: str(r.FailureCode), Message: str(r.FailureMessage)}
	}
	body, err := json.Marshal(map[string]any{
		"id":        eventID,
		"type":      execution.EventTypeExecutionComplete,
		"timestamp": r.SettledAt.UTC().Format(time.RFC3339Nano),
		"data":      data,
	})
	if err != nil {
		return nil, fmt.Errorf("encode completion event: %w", err)
	}
	return body, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
