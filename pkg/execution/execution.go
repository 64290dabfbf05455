// Package execution is the execution's model: its lifecycle (lifecycle.go: every transition the
// services apply, named, with its source and target statuses and its guard, and the event's
// own), the statuses, modes, reasons and classes as stored, and the read model of a row — its
// columns, how to scan one, and how it reads as the API's Execution message. The stores apply
// the transitions in their SQL through From/ToSQL; docs/architecture.md says which statement
// applies which.
package execution

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
)

// Status is an execution's status as stored (executions.status).
type Status string

// The execution's statuses.
const (
	StatusPending   Status = "pending"
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Mode values as stored.
const (
	ModeAsync = "async"
	ModeSync  = "sync"
)

// AttemptOutcome is how an attempt ended, as stored (execution_attempts.outcome and
// late_outcome).
type AttemptOutcome string

// The attempt's outcomes: the adapter's answer, its acceptance of async work, a timeout, a
// cancellation.
const (
	AttemptSucceeded AttemptOutcome = "succeeded"
	AttemptFailed    AttemptOutcome = "failed"
	AttemptCancelled AttemptOutcome = "cancelled"
	AttemptAccepted  AttemptOutcome = "accepted"
	AttemptTimeout   AttemptOutcome = "timeout"
)

// Failure reasons (docs/architecture.md §4).
const (
	ReasonAdapterPermanent     = "adapter.permanent"
	ReasonAttemptLimit         = "retry_exhausted.attempt_limit"
	ReasonBudget               = "retry_exhausted.budget"
	ReasonLeaseExpired         = "lease_expired"
	ReasonCancelled            = "cancelled"
	ClassTransient             = "transient"
	ClassPermanent             = "permanent"
	ClassTimeout               = "timeout"
	ClassUnavailable           = "unavailable"
	ClassProtocol              = "protocol"
	EventTypeExecutionComplete = "execution.completed"
	// EventTypeExecutionProgress is a progress report's event, for capabilities that declare
	// progress_events.
	EventTypeExecutionProgress = "execution.progress"
)

// EventsNotifyChannel is the Postgres NOTIFY channel on which a settlement or a progress report
// announces a new event, and a delivery an event whose successor may now go, waking the event
// router's relay.
const EventsNotifyChannel = "integration_events"

var statusToProto = map[Status]executionv1.ExecutionStatus{
	StatusPending:   executionv1.ExecutionStatus_EXECUTION_STATUS_PENDING,
	StatusRunning:   executionv1.ExecutionStatus_EXECUTION_STATUS_RUNNING,
	StatusSucceeded: executionv1.ExecutionStatus_EXECUTION_STATUS_SUCCEEDED,
	StatusFailed:    executionv1.ExecutionStatus_EXECUTION_STATUS_FAILED,
	StatusCancelled: executionv1.ExecutionStatus_EXECUTION_STATUS_CANCELLED,
}

// StatusToProto maps a stored status to the API enum.
func StatusToProto(s Status) executionv1.ExecutionStatus { return statusToProto[s] }

// StatusFromProto maps the API enum to a stored status ("" for UNSPECIFIED or unknown).
func StatusFromProto(s executionv1.ExecutionStatus) Status {
	for k, v := range statusToProto {
		if v == s {
			return k
		}
	}
	return ""
}

// IsFinal reports whether s is settled.
func (s Status) IsFinal() bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusCancelled
}

// ModeToProto maps a stored mode to the API enum.
func ModeToProto(m string) executionv1.Mode {
	switch m {
	case ModeAsync:
		return executionv1.Mode_MODE_ASYNC
	case ModeSync:
		return executionv1.Mode_MODE_SYNC
	}
	return executionv1.Mode_MODE_UNSPECIFIED
}

// Columns is the column list Scan expects, in order.
const Columns = `id, application_id, capability, mode, status, attempt, max_attempts, payload, result,
	failure_class, failure_reason, failure_code, failure_message, idempotency_key, progress,
	deadline_at, lease_expires_at, created_at, updated_at, settled_at`

// Row is one executions row.
type Row struct {
	ID             string
	ApplicationID  string
	Capability     string
	Mode           string
	Status         Status
	Attempt        int32
	MaxAttempts    int32
	Payload        []byte
	Result         []byte
	FailureClass   *string
	FailureReason  *string
	FailureCode    *string
	FailureMessage *string
	IdempotencyKey *string
	Progress       []byte
	DeadlineAt     time.Time
	LeaseExpiresAt *time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
	SettledAt      *time.Time
}

// Scan reads a row selected with Columns.
func Scan(row pgx.Row) (*Row, error) {
	var r Row
	err := row.Scan(&r.ID, &r.ApplicationID, &r.Capability, &r.Mode, &r.Status, &r.Attempt, &r.MaxAttempts,
		&r.Payload, &r.Result, &r.FailureClass, &r.FailureReason, &r.FailureCode, &r.FailureMessage,
		&r.IdempotencyKey, &r.Progress, &r.DeadlineAt, &r.LeaseExpiresAt, &r.CreatedAt, &r.UpdatedAt, &r.SettledAt)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// AttemptRow is one execution_attempts row.
type AttemptRow struct {
	N              int32
	StartedAt      time.Time
	EndedAt        *time.Time
	Outcome        *AttemptOutcome
	FailureClass   *string
	FailureCode    *string
	FailureMessage *string
	// LateOutcome (succeeded or failed) is what the adapter reported after the attempt had
	// ended, at LateAt: recorded for audit, never applied.
	LateOutcome *AttemptOutcome
	LateAt      *time.Time
}

// AttemptColumns is the column list ScanAttempt expects.
const AttemptColumns = `n, started_at, ended_at, outcome, failure_class, failure_code, failure_message, late_outcome, late_at`

// ScanAttempt reads a row selected with AttemptColumns.
func ScanAttempt(row pgx.Row) (AttemptRow, error) {
	var a AttemptRow
	err := row.Scan(&a.N, &a.StartedAt, &a.EndedAt, &a.Outcome, &a.FailureClass, &a.FailureCode, &a.FailureMessage,
		&a.LateOutcome, &a.LateAt)
	return a, err
}

// Proto renders the row as the API message. withPayload includes the request payload.
func (r *Row) Proto(withPayload bool) (*executionv1.Execution, error) {
	e := &executionv1.Execution{
		Id:              r.ID,
		ApplicationId:   r.ApplicationID,
		Capability:      r.Capability,
		Mode:            ModeToProto(r.Mode),
		Status:          StatusToProto(r.Status),
		Attempt:         r.Attempt,
		MaxAttempts:     r.MaxAttempts,
		IdempotencyKey:  deref(r.IdempotencyKey),
		DeadlineTime:    timestamppb.New(r.DeadlineAt),
		CreateTime:      timestamppb.New(r.CreatedAt),
		UpdateTime:      timestamppb.New(r.UpdatedAt),
		LeaseExpireTime: ts(r.LeaseExpiresAt),
		SettleTime:      ts(r.SettledAt),
	}
	var err error
	if withPayload {
		if e.Payload, err = Struct(r.Payload); err != nil {
			return nil, fmt.Errorf("execution %s payload: %w", r.ID, err)
		}
	}
	if e.Result, err = Struct(r.Result); err != nil {
		return nil, fmt.Errorf("execution %s result: %w", r.ID, err)
	}
	if e.Progress, err = Struct(r.Progress); err != nil {
		return nil, fmt.Errorf("execution %s progress: %w", r.ID, err)
	}
	if r.FailureClass != nil || r.FailureReason != nil {
		e.Failure = &executionv1.Failure{
			Class: deref(r.FailureClass), Reason: deref(r.FailureReason),
			Code: deref(r.FailureCode), Message: deref(r.FailureMessage),
		}
	}
	return e, nil
}

// Proto renders the attempt as the API message.
func (a AttemptRow) Proto() *executionv1.Attempt {
	p := &executionv1.Attempt{Number: a.N, StartTime: timestamppb.New(a.StartedAt), EndTime: ts(a.EndedAt), Outcome: deref(a.Outcome),
		LateOutcome: deref(a.LateOutcome), LateTime: ts(a.LateAt)}
	if a.FailureClass != nil {
		p.Failure = &executionv1.Failure{Class: deref(a.FailureClass), Code: deref(a.FailureCode), Message: deref(a.FailureMessage)}
	}
	return p
}

// Struct decodes a JSON object column; nil for SQL NULL.
func Struct(raw []byte) (*structpb.Struct, error) {
	if raw == nil {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return structpb.NewStruct(m)
}

// JSON encodes a Struct for a jsonb column; nil stays NULL.
func JSON(s *structpb.Struct) ([]byte, error) {
	if s == nil {
		return nil, nil
	}
	return s.MarshalJSON()
}

func ts(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func deref[S ~string](s *S) string {
	if s == nil {
		return ""
	}
	return string(*s)
}

// Failure is a failure as stored: class, reason, the adapter's code and message.
type Failure struct {
	Class   string
	Reason  string
	Code    string
	Message string
}

// FailureFromProto converts the API message; nil gives the zero Failure.
func FailureFromProto(f *executionv1.Failure) Failure {
	return Failure{Class: f.GetClass(), Reason: f.GetReason(), Code: f.GetCode(), Message: f.GetMessage()}
}

// Proto converts to the API message.
func (f Failure) Proto() *executionv1.Failure {
	return &executionv1.Failure{Class: f.Class, Reason: f.Reason, Code: f.Code, Message: f.Message}
}
