package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

func TestKeysCreateListRevoke(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool)

	a, tokA, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp, Description: "ci", CreatedBy: "ops"})
	require.NoError(t, err)
	b, tokB, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp, ExpiresIn: time.Hour})
	require.NoError(t, err)
	for _, c := range []struct {
		info KeyInfo
		tok  string
	}{{a, tokA}, {b, tokB}} {
		k, err := apikey.Parse(c.tok)
		require.NoError(t, err, "the token is a generated key")
		require.Equal(t, k.ID, c.info.ID)
		require.Equal(t, apikey.Prefix+k.ID, c.info.Prefix)
		require.Equal(t, "active", c.info.Status)
		require.Equal(t, "api", c.info.Source)
		rec, err := st.KeyForGenerated(ctx, k.ID, apikey.Hash(c.tok))
		require.NoError(t, err)
		require.Equal(t, apikey.Hash(c.tok), rec.Hash)
		require.Equal(t, dbtest.TestApp, rec.ApplicationID)
		require.False(t, rec.Revoked)
		require.False(t, rec.Expired())
	}
	require.Nil(t, a.ExpiresAt)
	require.NotNil(t, b.ExpiresAt)
	require.InDelta(t, time.Hour.Seconds(), b.ExpiresAt.Sub(b.CreatedAt).Seconds(), 1)
	require.Equal(t, "ci", a.Description)
	require.Equal(t, "ops", a.CreatedBy)

	list, err := st.ListKeys(ctx, dbtest.TestApp)
	require.NoError(t, err)
	require.Len(t, list, 3, "the catalog key and both API keys: several keys per application")
	ids := []string{list[0].ID, list[1].ID, list[2].ID}
	require.Contains(t, ids, a.ID)
	require.Contains(t, ids, b.ID)
	for _, k := range list {
		if k.Source == "catalog" {
			require.Equal(t, "chosen", k.Kind)
			require.Empty(t, k.Prefix, "nothing of a chosen key is shown")
		}
	}

	revoked, err := st.RevokeKey(ctx, dbtest.TestApp, a.ID, nil)
	require.NoError(t, err)
	require.Equal(t, "revoked", revoked.Status)
	require.NotNil(t, revoked.RevokedAt)
	again, err := st.RevokeKey(ctx, dbtest.TestApp, a.ID, nil)
	require.NoError(t, err)
	require.Equal(t, revoked.RevokedAt, again.RevokedAt, "revoking twice keeps the first time")
	rec, err := st.KeyForGenerated(ctx, a.ID, apikey.Hash(tokA))
	require.NoError(t, err)
	require.True(t, rec.Revoked)
	rec, err = st.KeyForGenerated(ctx, b.ID, apikey.Hash(tokB))
	require.NoError(t, err)
	require.False(t, rec.Revoked, "the other key still works: a rotation overlaps")

	_, err = st.RevokeKey(ctx, "other-app", b.ID, nil)
	require.ErrorIs(t, err, ErrNotFound, "a key is revoked only through its own application")
	_, err = st.RevokeKey(ctx, dbtest.TestApp, "nope", nil)
	require.ErrorIs(t, err, ErrNotFound)
	_, _, err = st.CreateKey(ctx, NewKey{ApplicationID: "nope"})
	require.ErrorIs(t, err, ErrNotFound)
	_, err = st.ListKeys(ctx, "nope")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = st.KeyForGenerated(ctx, "AAAAAAAAAAAA", apikey.Hash("x"))
	require.ErrorIs(t, err, ErrNotFound)
}

func TestRevokeForgetsTheKeyOnThisReplicaAtOnce(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	here := New(s.Pool).WithCache(time.Hour)
	there := New(s.Pool).WithCache(time.Hour)

	info, tok, err := here.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)
	for _, st := range []*Store{here, there} {
		rec, err := st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
		require.NoError(t, err)
		require.False(t, rec.Revoked)
	}
	_, err = here.RevokeKey(ctx, dbtest.TestApp, info.ID, nil)
	require.NoError(t, err)
	rec, err := here.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
	require.NoError(t, err)
	require.True(t, rec.Revoked, "the replica that revoked forgets its cached entry")
	rec, err = there.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
	require.NoError(t, err)
	require.False(t, rec.Revoked, "another replica keeps its cached entry until the TTL: the bound the docs state")
}

// Expiry is judged by the database's clock: the host's plays no part.
func TestKeyExpiryFollowsTheDatabaseClock(t *testing.T) {
	t.Parallel()
	base := dbtest.NewSchema(t)
	base.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()

	insert := func(s *dbtest.Schema, expiresAt string) (string, string) {
		k, err := apikey.Generate()
		require.NoError(t, err)
		_, err = s.Pool.Exec(ctx, `INSERT INTO api_keys (id, application_id, kind, hash, source, expires_at)
			VALUES ($1, 'app', 'generated', $2, 'api', `+expiresAt+`)`, k.ID, apikey.Hash(k.Token))
		require.NoError(t, err)
		return k.ID, k.Token
	}
	ahead := base.WithClockSkew(t, 2*time.Hour)
	st := New(ahead.Pool)
	// Half an hour left by the host's clock, expired by the database's.
	id, tok := insert(ahead, `pg_catalog.now() + interval '30 minutes'`)
	rec, err := st.KeyForGenerated(ctx, id, apikey.Hash(tok))
	require.NoError(t, err)
	require.True(t, rec.Expired())
	list, err := st.ListKeys(ctx, dbtest.TestApp)
	require.NoError(t, err)
	for _, k := range list {
		if k.ID == id {
			require.Equal(t, "expired", k.Status)
		}
	}
	// The host thinks the expiry is ahead; the database knows it has passed.
	_, _, err = st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp, ExpiresAt: new(time.Now().Add(time.Hour))})
	require.ErrorIs(t, err, ErrExpiryNotInFuture)
	n := 0
	require.NoError(t, ahead.Pool.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE source = 'api'`).Scan(&n))
	require.Equal(t, 1, n, "nothing written")
	info, _, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp, ExpiresIn: time.Minute})
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(2*time.Hour+time.Minute), *info.ExpiresAt, 10*time.Second,
		"expires_in counts from the database's now()")

	behind := base.WithClockSkew(t, -2*time.Hour)
	st = New(behind.Pool)
	// Expired half an hour ago by the host's clock, still valid by the database's.
	id, tok = insert(behind, `pg_catalog.now() - interval '30 minutes'`)
	rec, err = st.KeyForGenerated(ctx, id, apikey.Hash(tok))
	require.NoError(t, err)
	require.False(t, rec.Expired())
}

func TestACachedKeyExpiresOnTime(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool).WithCache(time.Hour)

	info, tok, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp, ExpiresIn: 300 * time.Millisecond})
	require.NoError(t, err)
	rec, err := st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
	require.NoError(t, err)
	require.False(t, rec.Expired())
	require.Eventually(t, func() bool {
		rec, err := st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
		return err == nil && rec.Expired()
	}, 10*time.Second, 10*time.Millisecond, "the cached record expires when the key does, not when the cache entry does")
}

func TestChosenCatalogKeys(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	ctx := context.Background()

	// A key from before migration 00009 becomes the application's catalog key.
	_, err := db.MigrateDownTo(ctx, s.URL, 8) // the schema before 00009_api_keys
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `INSERT INTO applications (id, name, api_key_hash) VALUES ('old', 'old', sha256('an-old-operator-key'))`)
	require.NoError(t, err)
	_, err = db.Migrate(ctx, s.URL)
	require.NoError(t, err)
	st := New(s.Pool)
	rec, err := st.KeyForChosen(ctx, apikey.Hash("an-old-operator-key"))
	require.NoError(t, err)
	require.Equal(t, "old", rec.ApplicationID)
	require.Regexp(t, `^chosen_[0-9a-f]{12}$`, rec.ID)

	// A generated key a catalog declared by its SHA-256 is found by its hash.
	k, err := apikey.Generate()
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `INSERT INTO api_keys (id, application_id, kind, hash, source) VALUES ('chosen_0123456789ab', 'old', 'chosen', $1, 'catalog')
		ON CONFLICT (application_id) WHERE source = 'catalog' DO UPDATE SET hash = excluded.hash`, apikey.Hash(k.Token))
	require.NoError(t, err)
	rec, err = st.KeyForGenerated(ctx, k.ID, apikey.Hash(k.Token))
	require.NoError(t, err)
	require.Equal(t, "old", rec.ApplicationID)
	_, err = st.KeyForChosen(ctx, apikey.Hash("an-old-operator-key"))
	require.ErrorIs(t, err, ErrNotFound)
}

func TestLastUsedIsRecordedAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx, cancel := context.WithCancel(context.Background())
	st := New(s.Pool).WithLastUsed(time.Hour)
	done := make(chan error)
	go func() { done <- st.RunLastUsed(ctx, zaptest.NewLogger(t)) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	info, _, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)
	require.Nil(t, info.LastUsedAt)
	lastUsed := func() *time.Time {
		var t0 *time.Time
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT last_used_at FROM api_keys WHERE id = $1`, info.ID).Scan(&t0))
		return t0
	}
	st.Touch(info.ID)
	require.Eventually(t, func() bool { return lastUsed() != nil }, 10*time.Second, 10*time.Millisecond)
	first := *lastUsed()

	// Within the interval further uses are not queued at all.
	for range 100 {
		st.Touch(info.ID)
	}
	require.Empty(t, st.lastUsed.queue, "nothing queued within the interval")
	require.Equal(t, first, *lastUsed())

	// Past the interval (forced here) the next use is recorded again.
	st.lastUsed.forget([]string{info.ID})
	st.Touch(info.ID)
	require.Eventually(t, func() bool { return lastUsed().After(first) }, 10*time.Second, 10*time.Millisecond)
}

// A revocation is at once on the revoking replica for every kind of key, whatever name its record
// was cached under.
func TestRevokeForgetsEveryCachedKindAtOnce(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool).WithCache(time.Hour)

	// A chosen catalog key, cached by its hash.
	rec, err := st.KeyForChosen(ctx, apikey.Hash(dbtest.TestAPIKey))
	require.NoError(t, err)
	require.False(t, rec.Revoked)
	_, err = st.RevokeKey(ctx, dbtest.TestApp, rec.ID, nil)
	require.NoError(t, err)
	rec, err = st.KeyForChosen(ctx, apikey.Hash(dbtest.TestAPIKey))
	require.NoError(t, err)
	require.True(t, rec.Revoked, "a chosen key cached by its hash is forgotten by the revoking replica")

	// A generated key the catalog declared only by its SHA-256: found through its token's id,
	// which is not its row's.
	k, err := apikey.Generate()
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET hash = $1, revoked_at = NULL WHERE source = 'catalog'`, apikey.Hash(k.Token))
	require.NoError(t, err)
	rec, err = st.KeyForGenerated(ctx, k.ID, apikey.Hash(k.Token))
	require.NoError(t, err)
	require.False(t, rec.Revoked)
	require.NotEqual(t, k.ID, rec.ID)
	_, err = st.RevokeKey(ctx, dbtest.TestApp, rec.ID, nil)
	require.NoError(t, err)
	rec, err = st.KeyForGenerated(ctx, k.ID, apikey.Hash(k.Token))
	require.NoError(t, err)
	require.True(t, rec.Revoked, "a catalog key found by a generated token's hash is forgotten by the revoking replica")
}

// A lookup that read the key before a revocation and caches after it must not put the unrevoked
// record back.
func TestALookupInFlightDoesNotUndoARevocation(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool).WithCache(time.Hour)
	info, tok, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)

	st.afterKeyRead = func() {
		st.afterKeyRead = nil // one lookup only: the revocation happens while it is in flight
		_, err := st.RevokeKey(ctx, dbtest.TestApp, info.ID, nil)
		require.NoError(t, err)
	}
	rec, err := st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
	require.NoError(t, err)
	require.False(t, rec.Revoked, "the lookup read before the revocation")
	rec, err = st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
	require.NoError(t, err)
	require.True(t, rec.Revoked, "the stale read was not cached")
}

// A lookup that starts after a revocation does not join a read that began before it: on the
// revoking replica a revocation takes effect at once.
func TestALookupAfterARevocationDoesNotShareAnEarlierRead(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool).WithCache(time.Hour)
	info, tok, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)

	held := holdRead(st, 1) // the first read is held until the revocation is done
	inRead, release := held.inRead, held.release
	first := make(chan *KeyRecord, 1)
	go func() {
		rec, err := st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
		assert.NoError(t, err)
		first <- rec
	}()
	<-inRead
	_, err = st.RevokeKey(ctx, dbtest.TestApp, info.ID, nil)
	require.NoError(t, err)
	second := make(chan *KeyRecord, 1)
	go func() {
		rec, err := st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
		assert.NoError(t, err)
		second <- rec
	}()
	select {
	case rec := <-second:
		require.True(t, rec.Revoked, "a lookup after the revocation was handed a read from before it")
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a lookup after the revocation waited on the read that began before it")
	}
	close(release)
	require.False(t, (<-first).Revoked, "the held read saw the key before its revocation")
}

// A revoked catalog key stays dead for gateways that read applications.api_key_hash (the release
// before migration 00009, a rollback, a migrate down), and a catalog apply does not revive it.
func TestARevokedCatalogKeyStaysDeadInTheLegacyColumn(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool)
	legacy := func() []byte {
		var h []byte
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT api_key_hash FROM applications WHERE id = $1`, dbtest.TestApp).Scan(&h))
		return h
	}
	require.Equal(t, apikey.Hash(dbtest.TestAPIKey), legacy())

	// An API key's revocation leaves the column alone.
	info, _, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)
	_, err = st.RevokeKey(ctx, dbtest.TestApp, info.ID, nil)
	require.NoError(t, err)
	require.Equal(t, apikey.Hash(dbtest.TestAPIKey), legacy())

	rec, err := st.KeyForChosen(ctx, apikey.Hash(dbtest.TestAPIKey))
	require.NoError(t, err)
	_, err = st.RevokeKey(ctx, dbtest.TestApp, rec.ID, nil)
	require.NoError(t, err)
	dead := legacy()
	require.Len(t, dead, 32)
	require.NotEqual(t, apikey.Hash(dbtest.TestAPIKey), dead, "the revoked key's hash is gone from the column")

	s.ApplyCatalog(t, dbtest.TestCatalog)
	require.NotEqual(t, apikey.Hash(dbtest.TestAPIKey), legacy(), "applying the catalog again does not write the revoked hash back")
	rec, err = st.KeyForChosen(ctx, apikey.Hash(dbtest.TestAPIKey))
	require.NoError(t, err)
	require.True(t, rec.Revoked, "and the key stays revoked")

	_, err = db.MigrateDownTo(ctx, s.URL, 8) // the schema before 00009_api_keys
	require.NoError(t, err)
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM applications WHERE api_key_hash = $1`, apikey.Hash(dbtest.TestAPIKey)).Scan(&n))
	require.Zero(t, n, "after a migrate down no application authenticates with the revoked key")
}

// An unknown key's hash is remembered for about a second, so made-up keys do not each reach
// Postgres; a key created on this replica works at once all the same.
func TestUnknownKeysAreRememberedBriefly(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool).WithCache(time.Hour)

	const chosen = "a-key-declared-a-moment-later"
	_, err := st.KeyForChosen(ctx, apikey.Hash(chosen))
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET hash = $1 WHERE source = 'catalog'`, apikey.Hash(chosen))
	require.NoError(t, err)
	_, err = st.KeyForChosen(ctx, apikey.Hash(chosen))
	require.ErrorIs(t, err, ErrNotFound, "the miss is remembered: Postgres is not asked again at once")
	require.Eventually(t, func() bool {
		_, err := st.KeyForChosen(ctx, apikey.Hash(chosen))
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "the miss is forgotten after missTTL")

	// A key created here is usable at once within the miss window: CreateKey forgets any miss
	// of its hash and keeps a lookup in flight from caching one.
	gen := st.keysGen
	info, tok, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)
	require.Greater(t, st.keysGen, gen)
	rec, err := st.KeyForGenerated(ctx, info.ID, apikey.Hash(tok))
	require.NoError(t, err)
	require.Equal(t, info.ID, rec.ID)

	// A miss read before a creation is not cached after it.
	const late = "a-key-missed-while-a-key-is-created"
	st.afterKeyRead = func() {
		st.afterKeyRead = nil
		_, _, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
		require.NoError(t, err)
	}
	_, err = st.KeyForChosen(ctx, apikey.Hash(late))
	require.ErrorIs(t, err, ErrNotFound)
	require.False(t, st.keyMisses.Contains(string(apikey.Hash(late))))

	require.LessOrEqual(t, missTTL, time.Second)
	fresh := New(s.Pool)
	require.Nil(t, fresh.keyMisses, "without a cache nothing is remembered")
}

// Uses still queued when RunLastUsed's context ends are written once before it returns.
func TestLastUsedQueuedAtShutdownIsWritten(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog)
	ctx := context.Background()
	st := New(s.Pool).WithLastUsed(time.Hour)
	info, _, err := st.CreateKey(ctx, NewKey{ApplicationID: dbtest.TestApp})
	require.NoError(t, err)
	st.Touch(info.ID)
	require.Len(t, st.lastUsed.queue, 1)

	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, st.RunLastUsed(ended, zaptest.NewLogger(t)))
	var at *time.Time
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT last_used_at FROM api_keys WHERE id = $1`, info.ID).Scan(&at))
	require.NotNil(t, at, "the use queued at shutdown was written")
}

// The record of what was queued forgets on its own after the interval, and stays bounded.
func TestLastUsedDedupExpiresAndIsBounded(t *testing.T) {
	t.Parallel()
	st := &Store{}
	st.WithLastUsed(100 * time.Millisecond)
	st.Touch("AAAAAAAAAAAA")
	st.Touch("AAAAAAAAAAAA")
	require.Len(t, st.lastUsed.queue, 1, "queued once within the interval")
	require.Eventually(t, func() bool { return st.lastUsed.sent.Len() == 0 }, 10*time.Second, 10*time.Millisecond,
		"entries expire without a further Touch")
	st.Touch("AAAAAAAAAAAA")
	require.Len(t, st.lastUsed.queue, 2, "queued again past the interval")

	for i := range cacheSize + 10 {
		st.lastUsed.sent.Add(fmt.Sprint(i), struct{}{})
	}
	require.Equal(t, cacheSize, st.lastUsed.sent.Len(), "bounded")
}

func TestWeakCatalogKeysListsTheKeysThatStillAuthenticate(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	ctx := context.Background()
	st := New(s.Pool)
	strong, err := apikey.Generate()
	require.NoError(t, err)

	s.ApplyCatalog(t, dbtest.TestCatalog) // its api_key is 23 typed characters
	s.ApplyCatalog(t, "applications:\n  - id: app-strong\n    api_key: "+strong.Token+"\n  - id: app-weak\n    api_key: weak-but-16-chars-long\n")
	// A key given by its hash has no verdict, whatever it is.
	s.ApplyCatalog(t, fmt.Sprintf("applications:\n  - id: app-hashed\n    api_key_sha256: %x\n", apikey.Hash("short-and-hashed-key")))
	weak, unjudged, err := st.CatalogKeyStrength(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{dbtest.TestApp, "app-weak"}, weak)
	require.Equal(t, []string{"app-hashed"}, unjudged, "the one declared by its hash")

	// A revoked weak key authenticates no one: the gateway need not refuse to start over it.
	keys, err := st.ListKeys(ctx, "app-weak")
	require.NoError(t, err)
	require.Len(t, keys, 1)
	_, err = st.RevokeKey(ctx, "app-weak", keys[0].ID, nil)
	require.NoError(t, err)
	// Nor an expired one.
	_, err = s.Pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE application_id = $1`, dbtest.TestApp)
	require.NoError(t, err)
	weak, _, err = st.CatalogKeyStrength(ctx)
	require.NoError(t, err)
	require.Empty(t, weak)
}
