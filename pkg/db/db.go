// Package db holds the Postgres plumbing every service shares: the pool, the one transaction
// helper, migrations, and error classification. The SQL itself lives with the service that owns
// it.
package db

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/integrations-platform/integrations/migrations"
)

// Option adjusts a pool's configuration.
type Option func(*pgxpool.Config)

// MaxConns sets the pool's size; 0 keeps what the URL says (pool_max_conns) or pgx's default
// (the larger of 4 and the number of CPUs).
func MaxConns(n int) Option {
	return func(c *pgxpool.Config) {
		if n > 0 {
			c.MaxConns = int32(n)
		}
	}
}

// AsyncCommit makes the pool's commits return before their WAL reaches the disk
// (synchronous_commit=off): a Postgres crash may lose the last few hundred milliseconds of them,
// never half of one. It is for bookkeeping whose loss can only cause a duplicate message — a claim,
// or the record that a message was published — never for an outcome: the platform tolerates
// duplicates everywhere (every consumer compares state before acting), so such a write need not
// wait for an fsync. Any later durable commit flushes it too.
func AsyncCommit() Option {
	return func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
}

// DefaultHealthCheckPeriod is how often the pool checks its idle connections unless the URL says
// otherwise (pool_health_check_period): often enough that connections a restart or a failover
// cut are replaced within seconds, not pgx's minute.
const DefaultHealthCheckPeriod = 5 * time.Second

// Open returns a pool for url and checks that the database answers.
//
// The pool never hands out a connection it can tell is dead: on every acquire it peeks at the
// socket (no round trip, see alive), and a connection whose backend has gone — its FATAL
// error or the end of the stream is waiting there — is discarded and the next one taken, a fresh
// one if every idle one is dead. So a burst of terminated backends costs reconnects, not failed
// statements. pgx itself pings a connection idle for over a second before handing it out, which
// also catches a peer that vanished without closing; the health check replaces idle connections
// every DefaultHealthCheckPeriod, or the URL's pool_health_check_period.
func Open(ctx context.Context, url string, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if !strings.Contains(url, "pool_health_check_period") {
		cfg.HealthCheckPeriod = DefaultHealthCheckPeriod
	}
	cfg.PrepareConn = alive
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

// rollbackTimeout bounds the rollback of a transaction whose function failed.
const rollbackTimeout = 5 * time.Second

// WithTx runs fn in a transaction, committing if it returns nil and rolling back otherwise.
//
// A BEGIN that fails on a dead connection is tried once more on another: nothing of fn ran, and
// BEGIN itself changes nothing, so the retry is safe whatever the error says was sent. A
// connection lost later, inside fn or at COMMIT, is not retried here: fn may have side effects
// in memory, and a lost COMMIT may have committed. Such an error is a connection error
// (IsConnectionError), which the caller sees as UNAVAILABLE: retry.
func WithTx(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil && IsConnectionError(err) && ctx.Err() == nil {
		tx, err = pool.Begin(ctx)
	}
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	// Roll back without the caller's context (a cancelled request must not leave the connection
	// to be returned mid-transaction), bounded so that a hung connection cannot hold the caller.
	// After a commit the rollback is a no-op.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}

// Migrate applies every pending migration of migrations.FS to the database at url, in the schema
// its search_path names. It uses goose: versioned, transactional, with a version table, so
// several replicas starting at once apply each migration once (goose takes a session lock).
func Migrate(ctx context.Context, url string) ([]*goose.MigrationResult, error) {
	return withProvider(url, "apply migrations", func(p *goose.Provider) ([]*goose.MigrationResult, error) { return p.Up(ctx) })
}

// MigrateDown rolls back the most recent migration.
func MigrateDown(ctx context.Context, url string) (*goose.MigrationResult, error) {
	return withProvider(url, "roll back migration", func(p *goose.Provider) (*goose.MigrationResult, error) { return p.Down(ctx) })
}

// MigrateDownTo rolls back every migration after version: a test of what a migration does to
// the rows of the schema before it.
func MigrateDownTo(ctx context.Context, url string, version int64) ([]*goose.MigrationResult, error) {
	return withProvider(url, fmt.Sprintf("roll back migrations after %d", version), func(p *goose.Provider) ([]*goose.MigrationResult, error) {
		return p.DownTo(ctx, version)
	})
}

// MigrationStatus lists every migration and whether it is applied.
func MigrationStatus(ctx context.Context, url string) ([]*goose.MigrationStatus, error) {
	return withProvider(url, "migration status", func(p *goose.Provider) ([]*goose.MigrationStatus, error) { return p.Status(ctx) })
}

// withProvider runs fn with a migration provider for the database at url, closed after it; fn's
// error says what it was doing.
func withProvider[T any](url, what string, fn func(*goose.Provider) (T, error)) (T, error) {
	provider, closeDB, err := newProvider(url)
	if err != nil {
		var zero T
		return zero, err
	}
	defer closeDB()
	res, err := fn(provider)
	if err != nil {
		return res, fmt.Errorf("%s: %w", what, err)
	}
	return res, nil
}

// SchemaPending returns the migrations built into this binary that the database at url has not
// reached: none when its version is at least the newest one here (a newer schema, from a newer
// release, counts as ready, so that a rolled-back image starts against it). It applies no
// migration; goose creates its (empty) version table if there is none yet, so the role needs the
// right to — the services' own role has it. A database without migrations has every one pending.
func SchemaPending(ctx context.Context, url string) (current int64, pending []string, err error) {
	provider, closeDB, err := newProvider(url)
	if err != nil {
		return 0, nil, err
	}
	defer closeDB()
	current, err = provider.GetDBVersion(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("read the schema version: %w", err)
	}
	for _, src := range provider.ListSources() {
		if src.Version > current {
			pending = append(pending, path.Base(src.Path))
		}
	}
	return current, pending, nil
}

func newProvider(url string) (*goose.Provider, func(), error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database url: %w", err)
	}
	sqlDB := stdlib.OpenDB(*cfg)
	fsys, err := fs.Sub(migrations.FS, ".")
	if err != nil {
		closeQuietly(sqlDB)
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, fsys)
	if err != nil {
		closeQuietly(sqlDB)
		return nil, nil, fmt.Errorf("migration provider: %w", err)
	}
	return provider, func() { closeQuietly(sqlDB) }, nil
}

func closeQuietly(db *sql.DB) { _ = db.Close() }
