package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Audit roles: who took an action. An application's id can be any word, "operator" included, so
// the role — not the actor's name — tells the admin token's actions from an application's.
const (
	AuditRoleApplication = "application"
	AuditRoleOperator    = "operator"
)

// AuditOperator is the actor name of an action taken with the admin token.
const AuditOperator = "operator"

// AuditActor is who took an action: an application (ID its id) or the operator.
type AuditActor struct {
	Role string
	ID   string
}

// Audit surfaces: through which an action was taken. The same action — a cancellation, a
// redelivery — is audited once, where it is carried out, whichever surface asked for it.
const (
	AuditViaConsole = "console"
	AuditViaAPI     = "api"
)

// Audit is an audit entry to write: who took which action on what, through which surface.
type Audit struct {
	Who    AuditActor
	Via    string
	Action string
	// Target is what the action was taken on: an execution or event id, a route, an application.
	Target string
	// Detail is a small JSON object (counts, ids, filters), never a payload, a key or a token.
	Detail map[string]any
}

// With is a with key set to v in its detail (a copy: a's own detail is left as it was).
func (a Audit) With(key string, v any) Audit {
	d := make(map[string]any, len(a.Detail)+1)
	for k, x := range a.Detail {
		d[k] = x
	}
	d[key] = v
	a.Detail = d
	return a
}

// AuditEntry is one console_audit row.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Role   string
	Actor  string
	Via    string
	Action string
	Target string
	// Detail is a small JSON object (counts, filters), never a payload.
	Detail []byte
}

// execer is a pool or a transaction: an audit entry is written in the transaction of the action
// it records where the action is one.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// AuditAppend writes an audit entry on its own, for an action that is not one transaction of
// this store (a settlement, a broker call, a sign-in).
func (s *Store) AuditAppend(ctx context.Context, a Audit) error {
	return auditInsert(ctx, s.pool, a)
}

func auditInsert(ctx context.Context, q execer, a Audit) error {
	detail := a.Detail
	if detail == nil {
		detail = map[string]any{}
	}
	raw, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("audit %s: detail: %w", a.Action, err)
	}
	if _, err := q.Exec(ctx, `INSERT INTO console_audit (role, actor, via, action, target, detail) VALUES ($1, $2, $3, $4, $5, $6)`,
		a.Who.Role, a.Who.ID, a.Via, a.Action, a.Target, raw); err != nil {
		return fmt.Errorf("audit %s: %w", a.Action, err)
	}
	return nil
}

// AuditList lists audit entries newest first, before the id before (0: from the newest): the
// operator's (who.Role AuditRoleOperator) list is everyone's, an application's its own.
func (s *Store) AuditList(ctx context.Context, who AuditActor, before int64, limit int) ([]AuditEntry, error) {
	w := &where{}
	if who.Role != AuditRoleOperator {
		w.add("role = ?", AuditRoleApplication)
		w.add("actor = ?", who.ID)
	}
	if before > 0 {
		w.add("id < ?", before)
	}
	cond := w.clause()
	limitParam := w.param(limit)
	rows, err := s.pool.Query(ctx, `SELECT id, at, role, actor, via, action, target, detail FROM console_audit `+cond+`
		ORDER BY id DESC LIMIT `+limitParam, w.args...)
	if err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.At, &e.Role, &e.Actor, &e.Via, &e.Action, &e.Target, &e.Detail)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	return list, nil
}

// ConsoleSessionEnd records that the console session id was signed out of, so that its cookie —
// valid by its seal until expires — is refused from now on, wherever it was copied to. Rows of
// sessions past their expiry are dropped on the way: their cookies are refused anyway.
func (s *Store) ConsoleSessionEnd(ctx context.Context, id string, expires time.Time) error {
	if _, err := s.pool.Exec(ctx, `
		WITH gone AS (DELETE FROM console_sessions_ended WHERE expires_at < now())
		INSERT INTO console_sessions_ended (id, expires_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`,
		id, expires); err != nil {
		return fmt.Errorf("end console session: %w", err)
	}
	return nil
}

// ConsoleSessionEnded tells whether the console session id was signed out of.
func (s *Store) ConsoleSessionEnded(ctx context.Context, id string) (bool, error) {
	var one int
	err := s.pool.QueryRow(ctx, `SELECT 1 FROM console_sessions_ended WHERE id = $1`, id).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read console session: %w", err)
	}
	return true, nil
}
