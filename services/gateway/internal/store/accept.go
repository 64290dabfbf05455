package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// Accept batching: concurrent async accepts go to Postgres together, one multi-row statement and
// one commit per batch (pkg/batch: a lone accept runs at once; those arriving while batches run
// go in the next). Up to acceptBatchSize a batch, acceptBatches at once, so that accepts hold
// at most that many of the pool's connections between them.
const (
	acceptBatchSize = 64
	acceptBatches   = 4
)

// accepted is what a batch answers for one new execution: the columns Postgres set (the rest is
// what the caller sent); nil when the idempotency key was already used (the caller replays).
type accepted struct {
	deadlineAt, createdAt, updatedAt time.Time
}

func newAcceptBatcher(s *Store) *batch.Batcher[NewExecution, *accepted] {
	return batch.New(s.acceptBatch, batch.Options{Name: "accept", MaxSize: acceptBatchSize, Concurrency: acceptBatches})
}

// acceptAsync accepts one async execution through the batcher: the new row, or (created=false)
// the execution its idempotency key already names.
func (s *Store) acceptAsync(ctx context.Context, n NewExecution) (*execution.Row, bool, error) {
	a, err := s.accepts.Do(ctx, n)
	if err != nil {
		return nil, false, err
	}
	if a == nil {
		var row *execution.Row
		err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error { return s.idempotentReplay(ctx, tx, n, &row) })
		return row, false, err
	}
	var key *string
	if n.IdempotencyKey != "" {
		key = &n.IdempotencyKey
	}
	return &execution.Row{
		ID: n.ID, ApplicationID: n.ApplicationID, Capability: n.Capability, Mode: n.Mode,
		Status: execution.Accept.To[0], Attempt: 0, MaxAttempts: n.MaxAttempts, Payload: n.Payload,
		IdempotencyKey: key, DeadlineAt: a.deadlineAt, CreatedAt: a.createdAt, UpdatedAt: a.updatedAt,
	}, true, nil
}

// acceptBatch inserts a batch of async executions, each pending at attempt 0 with the dispatch
// record of attempt 1, in one statement over arrays (one round trip, one commit). A row whose
// idempotency key is taken — by an earlier execution or an earlier row of the same batch — is
// skipped and answered nil. An error one row can cause alone (a constraint, a value Postgres
// refuses) re-runs the batch row by row, so that only that row's caller gets it; any other error
// (the connection, the server) is every caller's.
func (s *Store) acceptBatch(ctx context.Context, ns []NewExecution) ([]*accepted, []error, error) {
	out, err := s.insertExecutions(ctx, ns)
	if err == nil {
		return out, nil, nil
	}
	if len(ns) == 1 || !db.IsRowError(err) {
		return nil, nil, err
	}
	out = make([]*accepted, len(ns))
	errs := make([]error, len(ns))
	for i := range ns {
		one, err := s.insertExecutions(ctx, ns[i:i+1])
		if err != nil {
			errs[i] = err
			continue
		}
		out[i] = one[0]
	}
	return out, errs, nil
}

func (s *Store) insertExecutions(ctx context.Context, ns []NewExecution) ([]*accepted, error) {
	ids := make([]string, len(ns))
	apps := make([]string, len(ns))
	caps := make([]string, len(ns))
	modes := make([]string, len(ns))
	maxAttempts := make([]int32, len(ns))
	payloads := make([]string, len(ns))
	hashes := make([][]byte, len(ns))
	keys := make([]*string, len(ns))
	budgets := make([]float64, len(ns))
	// Each row keeps its own request's trace context: a batch has no span of its own (see
	// docs/decisions.md, Tracing).
	parents := make([]string, len(ns))
	states := make([]string, len(ns))
	for i, n := range ns {
		ids[i], apps[i], caps[i], modes[i], maxAttempts[i] = n.ID, n.ApplicationID, n.Capability, n.Mode, n.MaxAttempts
		payloads[i], hashes[i], budgets[i] = string(n.Payload), n.RequestHash, n.Budget.Seconds()
		parents[i], states[i] = n.Traceparent, n.Tracestate
		if n.IdempotencyKey != "" {
			keys[i] = &ns[i].IdempotencyKey
		}
	}
	rows, err := s.pool.Query(ctx, `
		WITH e AS (
			INSERT INTO executions (id, application_id, capability, mode, status, attempt, max_attempts,
				payload, request_hash, idempotency_key, deadline_at, traceparent, tracestate)
			SELECT id, app, cap, mode, $10, 0, max_attempts, payload::jsonb, hash, key,
				now() + make_interval(secs => budget), nullif(tp, ''), nullif(ts, '')
			FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[], $7::bytea[],
				$8::text[], $9::float8[], $11::text[], $12::text[])
				WITH ORDINALITY AS t(id, app, cap, mode, max_attempts, payload, hash, key, budget, tp, ts, ord)
			ORDER BY app, key, ord -- two batches take their keys' locks in one order: no deadlock
			ON CONFLICT (application_id, idempotency_key) DO NOTHING
			RETURNING id, deadline_at, created_at, updated_at
		), d AS (
			INSERT INTO dispatches (execution_id, attempt, due_at) SELECT id, 1, now() FROM e
		)
		SELECT id::text, deadline_at, created_at, updated_at FROM e`,
		ids, apps, caps, modes, maxAttempts, payloads, hashes, keys, budgets, execution.Accept.To[0], parents, states)
	if err != nil {
		return nil, fmt.Errorf("insert %d executions and their dispatches: %w", len(ns), err)
	}
	byID := make(map[string]*accepted, len(ns))
	for rows.Next() {
		var id string
		a := &accepted{}
		if err := rows.Scan(&id, &a.deadlineAt, &a.createdAt, &a.updatedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read accepted executions: %w", err)
		}
		byID[id] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("insert %d executions and their dispatches: %w", len(ns), err)
	}
	out := make([]*accepted, len(ns))
	for i := range ns {
		out[i] = byID[ids[i]]
	}
	return out, nil
}

// acceptSync commits a sync execution running at attempt 1 and that attempt's row in one
// statement, or (created=false) replays the execution its idempotency key names.
func (s *Store) acceptSync(ctx context.Context, n NewExecution) (row *execution.Row, created bool, err error) {
	var key *string
	if n.IdempotencyKey != "" {
		key = &n.IdempotencyKey
	}
	row, err = execution.Scan(s.pool.QueryRow(ctx, `
		WITH e AS (
			INSERT INTO executions (id, application_id, capability, mode, status, attempt, max_attempts,
				payload, request_hash, idempotency_key, deadline_at, lease_expires_at, traceparent, tracestate)
			VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8, $9,
				now() + make_interval(secs => $10), now() + make_interval(secs => $10), nullif($12, ''), nullif($13, ''))
			ON CONFLICT (application_id, idempotency_key) DO NOTHING
			RETURNING `+execution.Columns+`
		), a AS (
			INSERT INTO execution_attempts (execution_id, n, callback_token_hash) SELECT id, 1, $11 FROM e
		)
		SELECT `+execution.Columns+` FROM e`,
		n.ID, n.ApplicationID, n.Capability, n.Mode, execution.AcceptSync.To[0], n.MaxAttempts,
		n.Payload, n.RequestHash, key, n.Budget.Seconds(), n.CallbackTokenHash, n.Traceparent, n.Tracestate))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		err = db.WithTx(ctx, s.pool, func(tx pgx.Tx) error { return s.idempotentReplay(ctx, tx, n, &row) })
		return row, false, err
	case err != nil:
		return nil, false, fmt.Errorf("insert sync execution and its attempt: %w", err)
	}
	return row, true, nil
}
