package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/integrations-platform/integrations/pkg/execution"
)

// AnyApplication is the applicationID with which ExecutionTimeline reads any application's
// execution: the operator's view.
const AnyApplication = ""

// ResponseStartLen is how much of a receiver's answer the timeline shows.
const ResponseStartLen = 256

// TimelineAttempt is an attempt as the timeline shows it: the attempt's row with its lease
// renewals and its progress reports (how many, and the last one's time).
type TimelineAttempt struct {
	execution.AttemptRow
	Renewals        int32
	LastRenewedAt   *time.Time
	ProgressReports int32
	LastProgressAt  *time.Time
}

// TimelineEvent is one of the execution's events with its delivery attempts, oldest first.
type TimelineEvent struct {
	ID        string
	Type      string
	CreatedAt time.Time
	Status    execution.EventStatus
	Sequence  int32
	// Progress is an execution.progress event's report (JSON), nil for other events.
	Progress   []byte
	Deliveries []Delivery
}

// Timeline is what the store keeps of one execution's history.
type Timeline struct {
	Execution *execution.Row
	Attempts  []TimelineAttempt
	Events    []TimelineEvent
}

// ExecutionTimeline reads one execution's history: its row, its attempts and its events with
// their deliveries, in three queries by execution id (the primary keys of executions and
// execution_attempts, integration_events' (execution_id, sequence) index, event_deliveries' primary
// key). applicationID restricts it to that application's executions (another's is ErrNotFound);
// AnyApplication reads any.
func (s *Store) ExecutionTimeline(ctx context.Context, applicationID, id string) (*Timeline, error) {
	row, err := execution.Scan(s.pool.QueryRow(ctx, `SELECT `+execution.Columns+`
		FROM executions WHERE id = $1 AND ($2 = '' OR application_id = $2)`, id, applicationID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read execution %s: %w", id, err)
	}
	tl := &Timeline{Execution: row}
	rows, err := s.pool.Query(ctx, `SELECT `+execution.AttemptColumns+`, renewals, last_renewed_at,
			progress_reports, last_progress_at
		FROM execution_attempts WHERE execution_id = $1 ORDER BY n`, id)
	if err != nil {
		return nil, fmt.Errorf("read attempts of %s: %w", id, err)
	}
	tl.Attempts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TimelineAttempt, error) {
		var a TimelineAttempt
		err := r.Scan(&a.N, &a.StartedAt, &a.EndedAt, &a.Outcome, &a.FailureClass, &a.FailureCode,
			&a.FailureMessage, &a.LateOutcome, &a.LateAt, &a.Renewals, &a.LastRenewedAt,
			&a.ProgressReports, &a.LastProgressAt)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("read attempts of %s: %w", id, err)
	}
	rows, err = s.pool.Query(ctx, `
		SELECT e.id::text, e.type, e.created_at, e.delivery_status, e.sequence,
			CASE WHEN e.type = $3 THEN e.payload->'data'->'progress' END,
			d.n, d.at, d.status_code, d.error, d.duration_ms, left(d.response_body, $2)
		FROM integration_events e
		LEFT JOIN event_deliveries d ON d.event_id = e.id
		WHERE e.execution_id = $1
		ORDER BY e.sequence, d.n`, id, ResponseStartLen, execution.EventTypeExecutionProgress)
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var ev TimelineEvent
		var n *int32
		var at *time.Time
		var ms *int64
		var d Delivery
		if err := rows.Scan(&ev.ID, &ev.Type, &ev.CreatedAt, &ev.Status, &ev.Sequence, &ev.Progress,
			&n, &at, &d.StatusCode, &d.Error, &ms, &d.ResponseBody); err != nil {
			return nil, fmt.Errorf("read events of %s: %w", id, err)
		}
		if len(tl.Events) == 0 || tl.Events[len(tl.Events)-1].ID != ev.ID {
			tl.Events = append(tl.Events, ev)
		}
		if n != nil {
			d.N, d.At, d.Duration = *n, *at, time.Duration(*ms)*time.Millisecond
			last := &tl.Events[len(tl.Events)-1]
			last.Deliveries = append(last.Deliveries, d)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read events of %s: %w", id, err)
	}
	return tl, nil
}
