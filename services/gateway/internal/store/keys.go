package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/db"
)

// KeyRecord is what authentication needs of a stored API key.
type KeyRecord struct {
	ID            string
	ApplicationID string
	// Hash is the stored SHA-256 of the whole key, for the caller's constant-time comparison.
	Hash    []byte
	Revoked bool
	// expiry, judged by the database's clock when the record was read: the key is valid for
	// validFor after read (a monotonic time of this host), or for ever if !expires.
	expires  bool
	validFor time.Duration
	read     time.Time
}

// Expired reports whether the key's expiry has passed: the database's now() told how long it had
// left when the record was read, and this host's monotonic clock counts from there, so a skew
// between the two clocks plays no part.
func (k *KeyRecord) Expired() bool {
	return k.expires && time.Since(k.read) >= k.validFor
}

// KeyForGenerated finds the key a generated token names: by its id, or — for a catalog that
// declared a generated key by its SHA-256, whose id the database cannot know — by its hash among
// the chosen keys. One statement either way.
func (s *Store) KeyForGenerated(ctx context.Context, id string, hash []byte) (*KeyRecord, error) {
	return s.lookupKey(ctx, id, hash)
}

// KeyForChosen finds a key an operator chose (a catalog key not in the generated format) by the
// SHA-256 of the whole token.
func (s *Store) KeyForChosen(ctx context.Context, hash []byte) (*KeyRecord, error) {
	return s.lookupKey(ctx, "", hash)
}

// lookupKey finds the key with id (if not "") or else the chosen key with hash. A record is
// cached under the name it was found by ("id:" or "hash:"), which RevokeKey removes both of; a
// miss is remembered by hash for missTTL. Concurrent misses for one token share one read, and a
// key in use is read again ahead of its expiry (flight.go).
func (s *Store) lookupKey(ctx context.Context, id string, hash []byte) (*KeyRecord, error) {
	if s.keys == nil {
		return s.readKey(ctx, id, hash, 0)
	}
	byID, byHash := "id:"+id, "hash:"+string(hash)
	// The cache generation names every flight: a lookup that starts after a revocation or
	// creation must not join a read that began before it and be handed what that read found.
	s.keysMu.Lock()
	gen := s.keysGen
	s.keysMu.Unlock()
	flight := func(name string) string { return fmt.Sprintf("key:%d:%s", gen, name) }
	// A hit refreshes the entry it found, under the entry's name, whatever token found it: tokens
	// that share a key id but not its secret (forged: the checksum is not a secret) start no
	// read of their own.
	if id != "" {
		if k, ok := s.keys.Get(byID); ok {
			hash := k.Hash
			s.refreshAhead(flight(byID), k.read, func(ctx context.Context) (any, error) { return s.readKey(ctx, id, hash, gen) })
			return k, nil
		}
	}
	if k, ok := s.keys.Get(byHash); ok {
		s.refreshAhead(flight(byHash), k.read, func(ctx context.Context) (any, error) { return s.readKey(ctx, "", hash, gen) })
		return k, nil
	}
	if _, ok := s.keyMisses.Get(string(hash)); ok {
		return nil, ErrNotFound
	}
	// A miss: one read per token (two tokens with one id and different secrets read alike, but a
	// generated-format token may also match a chosen key by its hash).
	k, err := s.coalesce(ctx, flight(byID+"\x00"+byHash), func(ctx context.Context) (any, error) { return s.readKey(ctx, id, hash, gen) })
	if err != nil {
		return nil, err
	}
	return k.(*KeyRecord), nil
}

// readKey reads the key with id (if not "") or else the chosen key with hash from Postgres, and
// caches what it found (or that it found nothing) unless the cache's generation has moved from
// gen — a revocation or creation since the lookup began.
func (s *Store) readKey(ctx context.Context, id string, hash []byte, gen uint64) (*KeyRecord, error) {
	k := KeyRecord{read: time.Now()}
	var left float64
	err := s.pool.QueryRow(ctx, `
		SELECT id, application_id, hash, revoked_at IS NOT NULL, expires_at IS NOT NULL,
			coalesce(extract(epoch FROM expires_at - now()), 0)::float8
		FROM api_keys
		WHERE id = $1 OR (kind = 'chosen' AND hash = $2)
		ORDER BY id = $1 DESC LIMIT 1`, id, hash).Scan(&k.ID, &k.ApplicationID, &k.Hash, &k.Revoked, &k.expires, &left)
	found := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("look up API key: %w", err)
	}
	k.validFor = time.Duration(left * float64(time.Second))
	if s.afterKeyRead != nil {
		s.afterKeyRead()
	}
	if s.keys != nil {
		s.keysMu.Lock()
		// A revocation or creation since the read began may have made what was read stale.
		if s.keysGen == gen {
			switch {
			case !found:
				s.keyMisses.Add(string(hash), struct{}{})
			case id != "" && k.ID == id:
				s.keys.Add("id:"+id, &k)
			default:
				s.keys.Add("hash:"+string(hash), &k)
			}
		}
		s.keysMu.Unlock()
	}
	if !found {
		return nil, ErrNotFound
	}
	return &k, nil
}

// forgetKey drops every cache entry that can hold the key with id and hash, and keeps lookups
// already in flight from caching what they read.
func (s *Store) forgetKey(id string, hash []byte) {
	if s.keys == nil {
		return
	}
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	s.keysGen++
	s.keys.Remove("id:" + id)
	s.keys.Remove("hash:" + string(hash))
	s.keyMisses.Remove(string(hash))
}

// NewKey is a key to create through the operator API.
type NewKey struct {
	ApplicationID string
	Description   string
	CreatedBy     string
	// At most one of ExpiresIn (from the database's now()) and ExpiresAt; neither: no expiry.
	ExpiresIn time.Duration
	ExpiresAt *time.Time
	// Audit (nil: none) is written in the creation's transaction, with the new key's id added to
	// its detail.
	Audit *Audit
}

// KeyInfo is a key as listings show it: never its secret or hash.
type KeyInfo struct {
	ID            string `json:"id"`
	ApplicationID string `json:"application"`
	// Prefix is igk_<id> for a generated key; empty for a key an operator chose, none of whose
	// characters are shown.
	Prefix      string     `json:"prefix"`
	Kind        string     `json:"kind"`
	Source      string     `json:"source"`
	Description string     `json:"description"`
	CreatedBy   string     `json:"created_by"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
	LastUsedAt  *time.Time `json:"last_used_at"`
	// Status is active, expired or revoked, by the database's clock.
	Status string `json:"status"`
}

// ErrExpiryNotInFuture means a new key's expiry has already passed.
var ErrExpiryNotInFuture = errors.New("expiry is not in the future")

const keyColumns = `id, application_id, CASE WHEN kind = 'generated' THEN 'igk_' || id ELSE '' END, kind, source,
	description, created_by, created_at, expires_at, revoked_at, last_used_at,
	CASE WHEN revoked_at IS NOT NULL THEN 'revoked' WHEN expires_at <= now() THEN 'expired' ELSE 'active' END`

func scanKey(row pgx.Row) (KeyInfo, error) {
	var k KeyInfo
	err := row.Scan(&k.ID, &k.ApplicationID, &k.Prefix, &k.Kind, &k.Source, &k.Description, &k.CreatedBy,
		&k.CreatedAt, &k.ExpiresAt, &k.RevokedAt, &k.LastUsedAt, &k.Status)
	return k, err
}

// CreateKey generates a key for an application and stores its hash. The token it returns is the
// only time the key is seen in clear. ErrNotFound: no such application; ErrExpiryNotInFuture.
func (s *Store) CreateKey(ctx context.Context, nk NewKey) (KeyInfo, string, error) {
	key, err := apikey.Generate()
	if err != nil {
		return KeyInfo{}, "", err
	}
	var expiresIn any
	if nk.ExpiresIn > 0 {
		expiresIn = nk.ExpiresIn.Seconds()
	}
	var info KeyInfo
	err = db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		info, err = scanKey(tx.QueryRow(ctx, `
		INSERT INTO api_keys (id, application_id, kind, hash, source, description, created_by, created_at, expires_at)
		SELECT $1, a.id, 'generated', $3, 'api', $4, $5, now(),
			coalesce($6::timestamptz, now() + make_interval(secs => $7::float8))
		FROM applications a
		WHERE a.id = $2 AND coalesce($6::timestamptz, now() + make_interval(secs => $7::float8), 'infinity') > now()
		RETURNING `+keyColumns, key.ID, nk.ApplicationID, apikey.Hash(key.Token), nk.Description, nk.CreatedBy,
			nk.ExpiresAt, expiresIn))
		if err != nil || nk.Audit == nil {
			return err
		}
		return auditInsert(ctx, tx, nk.Audit.With("key_id", info.ID))
	})
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM applications WHERE id = $1)`, nk.ApplicationID).Scan(&exists); err != nil {
			return KeyInfo{}, "", fmt.Errorf("create API key: %w", err)
		}
		if !exists {
			return KeyInfo{}, "", ErrNotFound
		}
		return KeyInfo{}, "", ErrExpiryNotInFuture
	}
	if err != nil {
		return KeyInfo{}, "", fmt.Errorf("create API key: %w", err)
	}
	// The key works on this replica at once, even if its hash was just looked up and missed.
	s.forgetKey(info.ID, apikey.Hash(key.Token))
	return info, key.Token, nil
}

// ListKeys lists an application's keys, oldest first. ErrNotFound: no such application.
func (s *Store) ListKeys(ctx context.Context, appID string) ([]KeyInfo, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM applications WHERE id = $1)`, appID).Scan(&exists); err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	if !exists {
		return nil, ErrNotFound
	}
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE application_id = $1 ORDER BY created_at, id`, appID)
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	defer rows.Close()
	out := []KeyInfo{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list API keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	return out, nil
}

// CatalogKeyStrength lists, in order, the applications whose catalog key still authenticates
// (neither revoked nor expired) and is either recorded weak by `catalog apply` (api_keys.weak) or
// was never seen in clear — declared by its hash, or applied before migration 00021 — so that
// nothing says whether it is strong. One read, at the gateway's start.
func (s *Store) CatalogKeyStrength(ctx context.Context) (weak, unjudged []string, err error) {
	rows, err := s.pool.Query(ctx, `
		SELECT application_id, weak IS NOT NULL FROM api_keys
		WHERE source = 'catalog' AND weak IS NOT FALSE AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
		ORDER BY application_id`)
	if err != nil {
		return nil, nil, fmt.Errorf("read the catalog keys' strength: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var app string
		var judged bool
		if err := rows.Scan(&app, &judged); err != nil {
			return nil, nil, fmt.Errorf("read the catalog keys' strength: %w", err)
		}
		if judged {
			weak = append(weak, app)
		} else {
			unjudged = append(unjudged, app)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read the catalog keys' strength: %w", err)
	}
	return weak, unjudged, nil
}

// RevokeKey revokes an application's key; revoking a revoked key changes nothing. This replica
// forgets it at once; the others within the cache TTL. A catalog key's hash in
// applications.api_key_hash, which gateways of the release before migration 00009 read, is
// overwritten in the same statement with one no token has, so that the key stays dead through a
// rolling upgrade, a rollback or a migrate down. ErrNotFound: no such key of that application.
// a (nil: none) is written in the same transaction, saying whether the key was revoked already.
func (s *Store) RevokeKey(ctx context.Context, appID, id string, a *Audit) (KeyInfo, error) {
	unusable, err := apikey.UnusableHash()
	if err != nil {
		return KeyInfo{}, fmt.Errorf("revoke API key: %w", err)
	}
	var info KeyInfo
	var hash []byte
	var already bool
	err = db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		// already is read from the row before the update: a CTE's UPDATE RETURNING shows the new row.
		// The CTE before locks the row and so reads its newest version (k reads before, so before
		// runs first): read from the statement's snapshot, a revocation that k waited for was not
		// seen, and two racing revocations were both audited as the first.
		err := tx.QueryRow(ctx, `
		WITH before AS (
			SELECT revoked_at IS NOT NULL AS already FROM api_keys WHERE application_id = $1 AND id = $2
			FOR UPDATE
		), k AS (
			UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
			FROM before
			WHERE application_id = $1 AND id = $2
			RETURNING api_keys.*
		), legacy AS (
			UPDATE applications a SET api_key_hash = $3, updated_at = now()
			FROM k
			WHERE a.id = k.application_id AND k.source = 'catalog' AND a.api_key_hash = k.hash
		)
		SELECT `+keyColumns+`, hash, before.already FROM k, before`, appID, id, unusable).Scan(&info.ID, &info.ApplicationID, &info.Prefix,
			&info.Kind, &info.Source, &info.Description, &info.CreatedBy, &info.CreatedAt, &info.ExpiresAt,
			&info.RevokedAt, &info.LastUsedAt, &info.Status, &hash, &already)
		if err != nil || a == nil {
			return err
		}
		return auditInsert(ctx, tx, a.With("already_revoked", already))
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyInfo{}, ErrNotFound
	}
	if err != nil {
		return KeyInfo{}, fmt.Errorf("revoke API key: %w", err)
	}
	s.forgetKey(info.ID, hash)
	return info, nil
}

// lastUsed records keys' last use off the accept path: Touch only queues a key id, at most once
// per interval per key on this replica, and RunLastUsed writes the queued ids in batches.
type lastUsed struct {
	queue chan string
	mu    sync.Mutex // makes Touch's look-then-add one step
	// sent holds the ids queued within the interval: bounded (past cacheSize the least recently
	// queued go, and may be queued again early) and expiring on its own, off the accept path.
	sent *expirable.LRU[string, struct{}]
}

// lastUsedQueue bounds the ids waiting to be written; past it a use goes unrecorded until the
// next interval, rather than slowing an accept.
const lastUsedQueue = 1024

// lastUsedFinalWrite bounds the write of the uses still queued at shutdown.
const lastUsedFinalWrite = 2 * time.Second

// WithLastUsed makes Touch record keys' use at most once per interval (> 0) per key (see
// RunLastUsed).
func (s *Store) WithLastUsed(interval time.Duration) *Store {
	s.lastUsed = &lastUsed{
		queue: make(chan string, lastUsedQueue),
		sent:  expirable.NewLRU[string, struct{}](cacheSize, nil, interval),
	}
	return s
}

// Touch notes that key id was just used. It never blocks and never reads the database.
func (s *Store) Touch(id string) {
	l := s.lastUsed
	if l == nil {
		return
	}
	l.mu.Lock()
	if _, ok := l.sent.Peek(id); ok { // Peek, unlike Contains, judges the entry's expiry
		l.mu.Unlock()
		return
	}
	l.sent.Add(id, struct{}{})
	l.mu.Unlock()
	select {
	case l.queue <- id:
	default:
		l.forget([]string{id})
	}
}

// forget lets the next use of ids be queued again (their write failed or was dropped).
func (l *lastUsed) forget(ids []string) {
	for _, id := range ids {
		l.sent.Remove(id)
	}
}

// RunLastUsed writes the keys Touch queued, with the database's now(), until ctx ends; then it
// writes what is still queued once more, within lastUsedFinalWrite, so that a shutdown loses no
// use already queued. A failed write is logged and not retried; the key's next use queues it
// again.
func (s *Store) RunLastUsed(ctx context.Context, logger *zap.Logger) error {
	l := s.lastUsed
	if l == nil {
		return nil
	}
	for {
		var batch []string
		select {
		case <-ctx.Done():
			s.finalLastUsed(ctx, logger, nil)
			return nil
		case id := <-l.queue:
			batch = append(batch, id)
		}
	drain:
		for len(batch) < 500 {
			select {
			case id := <-l.queue:
				batch = append(batch, id)
			default:
				break drain
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.writeLastUsed(wctx, batch)
		cancel()
		if err != nil && ctx.Err() != nil {
			// Shutting down: the batch goes with the final write.
			s.finalLastUsed(ctx, logger, batch)
			return nil
		}
		if err != nil {
			l.forget(batch)
			logger.Warn("record API keys' last use", zap.Int("keys", len(batch)), zap.Error(err))
		}
	}
}

// finalLastUsed writes batch and every id still queued, once, on a context that outlives the
// ended ctx by at most lastUsedFinalWrite.
func (s *Store) finalLastUsed(ctx context.Context, logger *zap.Logger, batch []string) {
drain:
	for {
		select {
		case id := <-s.lastUsed.queue:
			batch = append(batch, id)
		default:
			break drain
		}
	}
	if len(batch) == 0 {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lastUsedFinalWrite)
	defer cancel()
	if err := s.writeLastUsed(wctx, batch); err != nil {
		logger.Warn("record API keys' last use at shutdown", zap.Int("keys", len(batch)), zap.Error(err))
	}
}

func (s *Store) writeLastUsed(ctx context.Context, ids []string) error {
	_, err := s.pool.Exec(ctx, `UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1)`, ids)
	return err
}
