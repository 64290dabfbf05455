package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// AuditOperator is the actor of an action taken with the admin token.
const AuditOperator = "operator"

// AuditEntry is one console_audit row.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string
	Action string
	Target string
	// Detail is a small JSON object (counts, filters), never a payload.
	Detail []byte
}

// AuditAppend records an action taken through the console. detail must marshal to a JSON object
// (nil: {}).
func (s *Store) AuditAppend(ctx context.Context, actor, action, target string, detail map[string]any) error {
	if detail == nil {
		detail = map[string]any{}
	}
	raw, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("audit %s: detail: %w", action, err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO console_audit (actor, action, target, detail) VALUES ($1, $2, $3, $4)`,
		actor, action, target, raw); err != nil {
		return fmt.Errorf("audit %s: %w", action, err)
	}
	return nil
}

// AuditList lists the audit entries of actor (AnyApplication: everyone's), newest first, before
// the id before (0: from the newest).
func (s *Store) AuditList(ctx context.Context, actor string, before int64, limit int) ([]AuditEntry, error) {
	w := &where{}
	if actor != AnyApplication {
		w.add("actor = ?", actor)
	}
	if before > 0 {
		w.add("id < ?", before)
	}
	cond := w.clause()
	limitParam := w.param(limit)
	rows, err := s.pool.Query(ctx, `SELECT id, at, actor, action, target, detail FROM console_audit `+cond+`
		ORDER BY id DESC LIMIT `+limitParam, w.args...)
	if err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Target, &e.Detail)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	return list, nil
}
