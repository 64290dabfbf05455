// Package dbtest gives each test a schema of its own in the real Postgres, migrated to the
// current version and empty, so tests run in parallel without cross-talk; a schema is migrated
// once per process and reused, emptied, by the tests that follow (NewSchema).
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
)

// DefaultURL is the database tests use unless INTEGRATIONS_TEST_DATABASE_URL says otherwise.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// BaseURL returns the test database URL.
func BaseURL() string {
	if u := os.Getenv("INTEGRATIONS_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Schema is a migrated schema of the test's own.
type Schema struct {
	Name string
	// URL connects with search_path set to the schema; hand it to services under test.
	URL  string
	Pool *pgxpool.Pool
}

// NewSchema gives the test a migrated schema of its own, empty, and takes it back when t ends.
// Migrating a schema costs the most of a database test's set-up, so a schema the test leaves as
// it was migrated is emptied (its tables truncated, their sequences restarted) and handed to the
// next test of the same process instead of being dropped; one whose structure the test changed
// (a function, an index, a migration down: see fingerprint) is dropped. Schemas waiting for reuse
// when the process ends are dropped by the next process that makes one.
func NewSchema(t testing.TB) *Schema {
	t.Helper()
	return newSchema(t, true)
}

// NewEmptySchema creates a fresh schema with no migration applied, and drops it when t ends.
func NewEmptySchema(t testing.TB) *Schema {
	t.Helper()
	return newSchema(t, false)
}

func newSchema(t testT, migrate bool) *Schema {
	t.Helper()
	ctx := context.Background()
	admin, err := db.Open(ctx, BaseURL())
	require.NoError(t, err, "test database (set INTEGRATIONS_TEST_DATABASE_URL)")
	t.Cleanup(admin.Close)

	if !migrate {
		name := "t_" + randomHex(6)
		_, err = admin.Exec(ctx, "CREATE SCHEMA "+name)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE") })
		return open(t, name)
	}

	sweepOnce.Do(func() { sweep(ctx, admin) })
	m, ok := reuse.take()
	if !ok {
		m = &migrated{name: fmt.Sprintf("%s%d_%s", reusablePrefix, os.Getpid(), randomHex(4))}
		_, err = admin.Exec(ctx, "CREATE SCHEMA "+m.name)
		require.NoError(t, err)
		if _, err = db.Migrate(ctx, schemaURL(t, m.name)); err == nil {
			m.tables, m.print, err = describe(ctx, admin, m.name)
		}
		if err != nil {
			_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+m.name+" CASCADE")
			require.NoError(t, err)
		}
	}
	// Registered before open's pool.Close, so it runs after it: no connection of the test's
	// pool is left when the schema is emptied.
	t.Cleanup(func() { reuse.give(admin, m) })
	return open(t, m.name)
}

func open(t testT, name string) *Schema {
	t.Helper()
	u := schemaURL(t, name)
	pool, err := db.Open(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &Schema{Name: name, URL: u, Pool: pool}
}

func schemaURL(t testT, name string) string {
	t.Helper()
	u, err := url.Parse(BaseURL())
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// testT is what the package needs of a test: a testing.TB, or BenchmarkSchema's stand-in for one.
type testT interface {
	require.TestingT
	Helper()
	Cleanup(func())
}

// reusablePrefix names the schemas NewSchema hands from test to test: tr<pid>_<random>.
const reusablePrefix = "tr"

// migrated is a migrated schema: its tables (goose's version table apart) and its fingerprint
// as migrated.
type migrated struct {
	name   string
	tables []string
	print  string
}

// maxReusable bounds the schemas a process keeps for reuse (as many as its tests run at once).
const maxReusable = 32

// reuse holds the schemas the process's tests have given back, emptied.
var reuse pool

// noReuse drops every schema at the end of its test (BenchmarkSchema's peer).
var noReuse bool

type pool struct {
	mu   sync.Mutex
	free []*migrated
}

func (p *pool) take() (*migrated, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return nil, false
	}
	m := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return m, true
}

// give takes m back from a test: kept for the next one when its structure is as migrated and it
// could be emptied, dropped otherwise.
func (p *pool) give(admin *pgxpool.Pool, m *migrated) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keep := false
	if _, fingerprint, err := describe(ctx, admin, m.name); err == nil && fingerprint == m.print && !noReuse {
		keep = empty(ctx, admin, m) == nil
	}
	if keep {
		p.mu.Lock()
		if len(p.free) < maxReusable {
			p.free = append(p.free, m)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
	_, _ = admin.Exec(ctx, "DROP SCHEMA "+m.name+" CASCADE")
}

// empty deletes every row of m's tables and restarts their sequences (goose's, whose rows stay,
// apart), in one round trip. DELETE,
// not TRUNCATE: on tables this small it is several times faster (TRUNCATE makes new files for
// every table and index); foreign keys are not checked meanwhile (session_replication_role), so
// the order does not matter.
func empty(ctx context.Context, admin *pgxpool.Pool, m *migrated) error {
	var b strings.Builder
	b.WriteString("SET LOCAL session_replication_role = replica;\n")
	for _, tb := range m.tables {
		fmt.Fprintf(&b, "DELETE FROM %s.%s;\n", pgx.Identifier{m.name}.Sanitize(), pgx.Identifier{tb}.Sanitize())
	}
	fmt.Fprintf(&b, `SELECT setval(format('%%I.%%I', schemaname, sequencename)::regclass, start_value, false)
		FROM pg_sequences WHERE schemaname = %s AND sequencename <> 'goose_db_version_id_seq';`, quoteLiteral(m.name))
	_, err := admin.Exec(ctx, "BEGIN;\n"+b.String()+"\nCOMMIT;")
	if err != nil {
		return fmt.Errorf("empty %s: %w", m.name, err)
	}
	return nil
}

// quoteLiteral quotes a schema name made by this package (letters, digits, underscores).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// describe lists a schema's tables and fingerprints its structure: its relations (tables,
// indexes, sequences, views), columns with their types and defaults, constraints, triggers and
// functions, and the migration version. A test that changes any of them leaves a schema no other
// test reuses.
func describe(ctx context.Context, admin *pgxpool.Pool, schema string) (tables []string, fingerprint string, err error) {
	rows, err := admin.Query(ctx, `
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname <> 'goose_db_version'
		ORDER BY c.relname`, schema)
	if err != nil {
		return nil, "", fmt.Errorf("tables of %s: %w", schema, err)
	}
	if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, "", fmt.Errorf("tables of %s: %w", schema, err)
	}
	// Objects a test recreates (a migration down and up again) get new oids; objects it adds
	// change the counts; a column's type or default changed changes its sums.
	err = admin.QueryRow(ctx, fmt.Sprintf(`
		WITH rels AS (SELECT oid, relkind FROM pg_class WHERE relnamespace = $1::regnamespace)
		SELECT concat_ws(' ',
			(SELECT count(*) || ':' || coalesce(sum(oid::int8), 0) FROM rels),
			(SELECT count(*) || ':' || coalesce(sum(a.atttypid::int8 + a.atttypmod + a.attnotnull::int), 0)
				FROM pg_attribute a JOIN rels r ON r.oid = a.attrelid WHERE a.attnum > 0 AND NOT a.attisdropped),
			(SELECT count(*) || ':' || coalesce(sum(d.oid::int8), 0) FROM pg_attrdef d JOIN rels r ON r.oid = d.adrelid),
			(SELECT count(*) || ':' || coalesce(sum(oid::int8), 0) FROM pg_constraint WHERE connamespace = $1::regnamespace),
			(SELECT count(*) || ':' || coalesce(sum(t.oid::int8), 0) FROM pg_trigger t JOIN rels r ON r.oid = t.tgrelid),
			(SELECT count(*) || ':' || coalesce(sum(oid::int8), 0) FROM pg_proc WHERE pronamespace = $1::regnamespace),
			(SELECT coalesce(max(version_id), 0) FROM %s.goose_db_version))`, pgx.Identifier{schema}.Sanitize()), schema).Scan(&fingerprint)
	if err != nil {
		return nil, "", fmt.Errorf("fingerprint of %s: %w", schema, err)
	}
	return tables, fingerprint, nil
}

var sweepOnce sync.Once

// sweep drops the reusable schemas of test processes that have ended: they kept them for reuse
// when they exited.
func sweep(ctx context.Context, admin *pgxpool.Pool) {
	rows, err := admin.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE $1`, reusablePrefix+"%\\_%")
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		pidText, _, ok := strings.Cut(strings.TrimPrefix(name, reusablePrefix), "_")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE")
	}
}

// alive reports whether a process of this machine has pid.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
