// Package store is the SQL the gateway owns: authentication lookups, accepting executions with
// their first dispatch record, reading them back, and registering consumers.
package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"

	"github.com/integrations-platform/integrations/pkg/batch"
	"github.com/integrations-platform/integrations/pkg/execution"
)

// Sentinel errors of the store boundary.
var (
	ErrNotFound          = errors.New("not found")
	ErrIdempotencyReused = errors.New("idempotency key reused with a different request")
)

// Store is the gateway's data access.
type Store struct {
	pool *pgxpool.Pool
	// Found values, kept for a short time (nil: no cache). A record is cached only under the
	// name it was found by: "id:"+key id (a generated key found by its id) or "hash:"+hash (a key
	// found by its hash), so that a revocation knows every entry that can hold it.
	keys         *expirable.LRU[string, *KeyRecord]
	capabilities *expirable.LRU[string, *cachedCapability] // name → capability
	ttl          time.Duration                             // the caches' time to live
	// flights coalesces concurrent reads of one entry, and refreshes entries in use ahead of
	// their expiry (flight.go).
	flights singleflight.Group
	// keyMisses holds the hashes of tokens no key matched, for missTTL (nil: no cache), so that
	// a client repeating an unknown key reaches Postgres at most once per missTTL; its own LRU,
	// so that a flood of misses cannot evict found keys.
	keyMisses *expirable.LRU[string, struct{}]
	// keysMu orders cache writes of lookups against revocations: a lookup caches what it read
	// only if keysGen has not moved since it started reading, so a lookup in flight during a
	// revocation cannot put the unrevoked record back.
	keysMu   sync.Mutex
	keysGen  uint64
	lastUsed *lastUsed // nil: keys' use is not recorded
	// afterKeyRead, if set (by tests), runs between a key lookup's read and its cache write.
	afterKeyRead func()
	accepts      *batch.Batcher[NewExecution, *accepted] // async accepts (accept.go)
}

// missTTL is how long an unknown key's hash is remembered: long enough to spare Postgres a client
// repeating an unknown key, short enough that a key made on another replica (or declared by a
// catalog apply) soon works here.
const missTTL = time.Second

// cacheSize bounds each cache; past it the least recently used entries go.
const cacheSize = 10000

// New returns a Store on pool, reading API keys and capabilities afresh on every call.
func New(pool *pgxpool.Pool) *Store {
	s := &Store{pool: pool}
	s.accepts = newAcceptBatcher(s)
	return s
}

// WithCache keeps the API keys (with their revoked and expiry state) and capabilities found for
// ttl (0: not at all), so the accept path does not read them on every call; a catalog change or a
// key revoked through another replica then takes effect within ttl. Unknown API keys are
// remembered for at most missTTL; capabilities not found are not remembered.
func (s *Store) WithCache(ttl time.Duration) *Store {
	if ttl > 0 { // expirable.NewLRU takes 0 as "never expire"
		s.keys = expirable.NewLRU[string, *KeyRecord](cacheSize, nil, ttl)
		s.keyMisses = expirable.NewLRU[string, struct{}](cacheSize, nil, min(ttl, missTTL))
		s.capabilities = expirable.NewLRU[string, *cachedCapability](cacheSize, nil, ttl)
		s.ttl = ttl
	}
	return s
}

// Capability is what the gateway needs to know of a capability.
type Capability struct {
	Name            string
	AdapterEndpoint string
	AdapterID       string // the adapter's catalog id: the audience of the platform's token
	Modes           []string
	MaxAttempts     int32
	AsyncBudget     time.Duration
	SyncTimeout     time.Duration
}

// AllowsMode reports whether the capability may be invoked in mode.
func (c *Capability) AllowsMode(mode string) bool {
	for _, m := range c.Modes {
		if m == mode {
			return true
		}
	}
	return false
}

// cachedCapability is a capability as cached, with when it was read.
type cachedCapability struct {
	c    *Capability
	read time.Time
}

// CapabilityGet reads a capability with its adapter's endpoint.
// The result is shared with other callers when cached: it must not be modified.
func (s *Store) CapabilityGet(ctx context.Context, name string) (*Capability, error) {
	if s.capabilities == nil {
		return s.readCapability(ctx, name)
	}
	fetch := func(ctx context.Context) (any, error) { return s.readCapability(ctx, name) }
	flight := "capability:" + name
	if e, ok := s.capabilities.Get(name); ok {
		s.refreshAhead(flight, e.read, fetch)
		return e.c, nil
	}
	c, err := s.coalesce(ctx, flight, fetch)
	if err != nil {
		return nil, err
	}
	return c.(*Capability), nil
}

// readCapability reads a capability from Postgres, caching it if found.
func (s *Store) readCapability(ctx context.Context, name string) (*Capability, error) {
	read := time.Now()
	var c Capability
	var budgetMS, syncMS int64
	err := s.pool.QueryRow(ctx, `
		SELECT c.name, a.id, a.endpoint, c.modes, c.max_attempts, c.async_budget_ms, c.sync_timeout_ms
		FROM capabilities c JOIN adapters a ON a.id = c.adapter_id
		WHERE c.name = $1`, name).Scan(&c.Name, &c.AdapterID, &c.AdapterEndpoint, &c.Modes, &c.MaxAttempts, &budgetMS, &syncMS)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read capability %s: %w", name, err)
	}
	c.AsyncBudget = time.Duration(budgetMS) * time.Millisecond
	c.SyncTimeout = time.Duration(syncMS) * time.Millisecond
	if s.capabilities != nil {
		s.capabilities.Add(name, &cachedCapability{c: &c, read: read})
	}
	return &c, nil
}

// NewExecution is an execution to accept.
type NewExecution struct {
	ID             string
	ApplicationID  string
	Capability     string
	Mode           string
	MaxAttempts    int32
	Payload        []byte
	RequestHash    []byte
	IdempotencyKey string
	// Budget is how long the execution may take: its deadline is the database's now() plus
	// Budget, like every due time, deadline and lease, so that the hosts' clocks play no part.
	// For a sync execution, attempt 1's lease ends at the same deadline.
	Budget time.Duration
	// For sync executions, which start attempt 1 at once:
	CallbackTokenHash []byte
	// Traceparent and Tracestate are the W3C trace context of the accept (pkg/telemetry), the
	// trace the execution's later hops continue; empty for none.
	Traceparent, Tracestate string
}

// ExecutionAccept commits a new execution and its first step atomically: for async, the execution
// pending at attempt 0 and the dispatch record of attempt 1, in one statement shared with the
// accepts running at the same moment (accept.go); for sync, the execution running at attempt 1
// and that attempt's row, in one statement. With an idempotency key already used by the
// application, it returns the original execution (created=false) if the request is the same,
// ErrIdempotencyReused if not, and writes nothing.
func (s *Store) ExecutionAccept(ctx context.Context, n NewExecution) (row *execution.Row, created bool, err error) {
	if n.Mode == execution.ModeSync {
		return s.acceptSync(ctx, n)
	}
	return s.acceptAsync(ctx, n)
}

// SyncWithdraw takes back the accept of sync execution id whose one attempt's adapter call
// provably sent nothing (the adapter could not be reached): it deletes the execution, and with it
// (ON DELETE CASCADE) its attempt row, in one statement — but only while it is still running at
// attempt 1, so that a cancellation or the sweeper that settled it meanwhile keeps its outcome
// (withdrawn=false, nothing changed). Nothing else is written: no attempt was spent and no
// completion event exists, and a retry of the call with the same Idempotency-Key finds no
// execution and starts afresh.
func (s *Store) SyncWithdraw(ctx context.Context, id string) (withdrawn bool, err error) {
	tag, err := s.pool.Exec(ctx, `
		DELETE FROM executions
		WHERE id = $1 AND mode = $2 AND status = $3 AND attempt = 1`,
		id, execution.ModeSync, execution.Withdraw.From[0])
	if err != nil {
		return false, fmt.Errorf("withdraw sync execution: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

func (s *Store) idempotentReplay(ctx context.Context, tx pgx.Tx, n NewExecution, out **execution.Row) error {
	var hash []byte
	err := tx.QueryRow(ctx, `SELECT request_hash FROM executions WHERE application_id = $1 AND idempotency_key = $2`,
		n.ApplicationID, n.IdempotencyKey).Scan(&hash)
	if err != nil {
		return fmt.Errorf("read execution of idempotency key: %w", err)
	}
	if !bytes.Equal(hash, n.RequestHash) {
		return ErrIdempotencyReused
	}
	row, err := execution.Scan(tx.QueryRow(ctx, `SELECT `+execution.Columns+`
		FROM executions WHERE application_id = $1 AND idempotency_key = $2`, n.ApplicationID, n.IdempotencyKey))
	if err != nil {
		return fmt.Errorf("read execution of idempotency key: %w", err)
	}
	*out = row
	return nil
}

// ExecutionGet reads one of the application's executions (AnyApplication: any application's,
// the operator's cancel) with its attempts.
func (s *Store) ExecutionGet(ctx context.Context, applicationID, id string) (*execution.Row, []execution.AttemptRow, error) {
	row, err := execution.Scan(s.pool.QueryRow(ctx, `SELECT `+execution.Columns+`
		FROM executions WHERE id = $1 AND ($2 = '' OR application_id = $2)`, id, applicationID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read execution %s: %w", id, err)
	}
	attempts, err := s.Attempts(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return row, attempts, nil
}

// Attempts reads an execution's attempts, oldest first (the caller has checked whose it is).
func (s *Store) Attempts(ctx context.Context, id string) ([]execution.AttemptRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+execution.AttemptColumns+`
		FROM execution_attempts WHERE execution_id = $1 ORDER BY n`, id)
	if err != nil {
		return nil, fmt.Errorf("read attempts of %s: %w", id, err)
	}
	attempts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (execution.AttemptRow, error) {
		return execution.ScanAttempt(r)
	})
	if err != nil {
		return nil, fmt.Errorf("read attempts of %s: %w", id, err)
	}
	return attempts, nil
}

// ListFilter narrows ExecutionList.
type ListFilter struct {
	Status     execution.Status
	Capability string
	// CreatedAfter (inclusive) and CreatedBefore (exclusive) bound created_at when set.
	CreatedAfter, CreatedBefore *time.Time
	// Query matches the execution with this id (when it is one) or those whose idempotency key
	// starts with it.
	Query string
	// Before is the id to continue after (exclusive), from the previous page.
	Before string
	Limit  int
}

// ExecutionList lists the application's executions, newest first; AnyApplication lists every
// application's (the operator's view).
func (s *Store) ExecutionList(ctx context.Context, applicationID string, f ListFilter) ([]*execution.Row, error) {
	query, args := executionListQuery(applicationID, f)
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*execution.Row, error) { return execution.Scan(r) })
	if err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	return list, nil
}

// executionListQuery is ExecutionList's statement for the filters f has: the page boundary is
// an index condition on executions_application_id_id_idx whatever plan Postgres caches.
func executionListQuery(applicationID string, f ListFilter) (string, []any) {
	w := &where{}
	if applicationID != AnyApplication {
		w.add("application_id = ?", applicationID)
	}
	if f.Status != "" {
		w.add("status = ?", f.Status)
	}
	if f.Capability != "" {
		w.add("capability = ?", f.Capability)
	}
	if f.CreatedAfter != nil {
		w.add("created_at >= ?", *f.CreatedAfter)
	}
	if f.CreatedBefore != nil {
		w.add("created_at < ?", *f.CreatedBefore)
	}
	if f.Query != "" {
		// An id is matched exactly (the primary key); the key by prefix, its LIKE wildcards
		// escaped so that "a_b" means those three characters.
		if uuid.Validate(f.Query) == nil {
			w.add("(id = ?::uuid OR idempotency_key = "+w.param(f.Query)+")", f.Query)
		} else {
			w.add("idempotency_key LIKE ? ESCAPE '\\'", likePrefix(f.Query))
		}
	}
	if f.Before != "" {
		w.add("id < ?::uuid", f.Before)
	}
	limit := w.param(f.Limit)
	return `SELECT ` + listColumns + `
		FROM executions
		` + w.clause() + `
		ORDER BY id DESC
		LIMIT ` + limit, w.args
}

// likePrefix is a LIKE pattern matching the texts that start with s.
func likePrefix(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s) + "%"
}

// ConsumerSetWebhook registers the application's webhook. The signing secret is kept if the
// application has one (re-registering a URL must not break verification); sealedNew is stored
// otherwise. It returns the sealed secret in force.
func (s *Store) ConsumerSetWebhook(ctx context.Context, applicationID, url string, sealedNew []byte) ([]byte, error) {
	return s.consumerSet(ctx, applicationID, "webhook", url, false, nil, sealedNew)
}

// listColumns are execution.Columns without the JSON documents (payload, result, progress, up to
// a MiB each), read as NULL: list items leave them out, so a page is bounded by its item count
// and the database does not read them either.
var listColumns = strings.NewReplacer(
	"payload, result,", "NULL::jsonb, NULL::jsonb,",
	"progress,", "NULL::jsonb,",
).Replace(execution.Columns)
