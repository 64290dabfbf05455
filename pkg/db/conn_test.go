package db_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

const poolSize = 4

// appURL is the test database's URL with an application_name of this test's own, so that the
// test terminates its own backends and nobody else's.
func appURL(t *testing.T) (string, string) {
	t.Helper()
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	name := "dbtest_" + hex.EncodeToString(b)
	u, err := url.Parse(dbtest.BaseURL())
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String(), name
}

// dialed records the connections a pool dials, to look at their sockets from the client side.
type dialed struct {
	mu    sync.Mutex
	conns []net.Conn
}

// record makes cfg's pool dial through d.
func (d *dialed) record(cfg *pgxpool.Config) {
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err == nil {
			d.mu.Lock()
			d.conns = append(d.conns, c)
			d.mu.Unlock()
		}
		return c, err
	}
}

// allGone reports whether every connection dialed so far has seen its backend go.
func (d *dialed) allGone() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		if !db.SocketGone(c) {
			return false
		}
	}
	return true
}

// fillAndTerminate makes the pool hold poolSize idle connections, then terminates their backends
// and waits until they are gone as the client sees it: each connection's socket holds the
// backend's FATAL or the end of the stream. The pool now holds poolSize dead connections, idle for
// well under a second (so pgx's own ping-after-a-second-idle does not look at them).
//
// Waiting for the backends to leave pg_stat_activity is not enough (a backend leaves it before it
// flushes its FATAL and closes its socket), nor for their processes to exit: on a loaded machine
// the kernel may hand the close to the client's socket after that (issue 22 saw a caller get the
// 57P01 then). A connection whose backend's close has not reached us is, to the pool, alive; the
// guarantee is about connections that died before the statement ran, as the client can know it.
func fillAndTerminate(t *testing.T, pool *pgxpool.Pool, app string, conns *dialed) {
	t.Helper()
	ctx := context.Background()
	held := make([]*pgxpool.Conn, 0, poolSize)
	for range poolSize {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	require.Equal(t, int32(poolSize), pool.Stat().IdleConns())

	admin, err := pgx.Connect(ctx, dbtest.BaseURL())
	require.NoError(t, err)
	defer func() { _ = admin.Close(ctx) }()
	var pids []int32
	require.NoError(t, admin.QueryRow(ctx,
		`SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&pids))
	require.Len(t, pids, poolSize)
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM unnest($1::int[]) pid`, pids).Scan(&n))
	require.Equal(t, poolSize, n)
	require.Eventually(t, conns.allGone, 30*time.Second, 5*time.Millisecond,
		"every terminated backend's close reaches its connection")
}

// openTerminable opens a pool of poolSize connections with an application name of its own, whose
// connections fillAndTerminate can watch.
func openTerminable(t *testing.T) (*pgxpool.Pool, string, *dialed) {
	t.Helper()
	u, app := appURL(t)
	conns := &dialed{}
	pool, err := db.Open(context.Background(), u, db.MaxConns(poolSize), conns.record)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, app, conns
}

func TestPoolSkipsConnectionsWhoseBackendsWereTerminated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, app, conns := openTerminable(t)

	fillAndTerminate(t, pool, app, conns)
	start := time.Now()
	for i := range poolSize + 1 {
		var one int
		require.NoError(t, pool.QueryRow(ctx, `SELECT 1`).Scan(&one), "statement %d after the backends were terminated", i)
	}
	require.Less(t, time.Since(start), db.DefaultHealthCheckPeriod,
		"the dead connections were skipped at once, not left for the health check to replace")

	fillAndTerminate(t, pool, app, conns)
	var got int
	require.NoError(t, db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT 2`).Scan(&got)
	}))
	require.Equal(t, 2, got)
}

// The control: a pgx pool as it comes hands out the dead connections, and the statements on
// them fail, with errors IsConnectionError knows.
func TestPlainPgxPoolFailsOnTerminatedBackends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, app := appURL(t)
	cfg, err := pgxpool.ParseConfig(u)
	require.NoError(t, err)
	cfg.MaxConns = poolSize
	conns := &dialed{}
	conns.record(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	fillAndTerminate(t, pool, app, conns)
	var failures int
	for range poolSize + 1 {
		var one int
		if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			failures++
			require.True(t, db.IsConnectionError(err), "%v", err)
		}
	}
	require.Positive(t, failures, "without the check, a dead connection is handed out")
}

func TestPoolHealthCheckPeriod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.Open(ctx, dbtest.BaseURL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Equal(t, db.DefaultHealthCheckPeriod, pool.Config().HealthCheckPeriod)

	pool2, err := db.Open(ctx, dbtest.BaseURL()+"&pool_health_check_period=2s")
	require.NoError(t, err)
	t.Cleanup(pool2.Close)
	require.Equal(t, 2*time.Second, pool2.Config().HealthCheckPeriod, "the URL's setting wins")
}

func TestWithTxRollsBackAndCommits(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `CREATE TABLE t (v int)`)
	require.NoError(t, err)

	boom := errors.New("boom")
	err = db.WithTx(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)

	// A cancelled caller still leaves no transaction open on the connection.
	cctx, cancel := context.WithCancel(ctx)
	err = db.WithTx(cctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(cctx, `INSERT INTO t VALUES (2)`); err != nil {
			return err
		}
		cancel()
		return cctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)

	require.NoError(t, db.WithTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES (3)`)
		return err
	}))
	var vals []int
	rows, err := s.Pool.Query(ctx, `SELECT v FROM t ORDER BY v`)
	require.NoError(t, err)
	vals, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{3}, vals)
}

func TestIsConnectionError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A real dial failure: nothing listens on port 1.
	_, dialErr := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	require.Error(t, dialErr)

	closed, err := db.Open(ctx, dbtest.BaseURL())
	require.NoError(t, err)
	closed.Close()
	_, closedErr := closed.Exec(ctx, `SELECT 1`)
	require.Error(t, closedErr)

	// A real server error about the statement.
	pool, err := db.Open(ctx, dbtest.BaseURL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, syntaxErr := pool.Exec(ctx, `SELEC 1`)
	require.Error(t, syntaxErr)

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"dial refused", dialErr, true},
		{"closed pool", closedErr, true},
		{"admin shutdown 57P01", &pgconn.PgError{Code: "57P01", Severity: "FATAL"}, true},
		{"crash shutdown 57P02", &pgconn.PgError{Code: "57P02"}, true},
		{"cannot connect now 57P03", &pgconn.PgError{Code: "57P03"}, true},
		{"connection failure 08006", &pgconn.PgError{Code: "08006"}, true},
		{"too many connections 53300", &pgconn.PgError{Code: "53300"}, true},
		{"eof, wrapped", fmt.Errorf("read execution: %w", io.ErrUnexpectedEOF), true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"syntax error", syntaxErr, false},
		{"no rows", pgx.ErrNoRows, false},
		{"cancelled", fmt.Errorf("query: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, db.IsConnectionError(tt.err), "%v", tt.err)
			require.Equal(t, tt.want, db.IsConnectionError(fmt.Errorf("handler: %w", tt.err)), "%v", tt.err)
		})
	}
}

// Many statements at once on a pool whose backends were just terminated: every one succeeds.
func TestPoolUnderLoadAfterTermination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, app, conns := openTerminable(t)
	fillAndTerminate(t, pool, app, conns)

	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			var one int
			errs <- pool.QueryRow(ctx, `SELECT 1`).Scan(&one)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// A backend that dies as BEGIN is sent (after the pool's check): WithTx tries once more on a fresh
// connection, and fn runs once. A single statement that dies the same way is not tried again (it
// may have run): it fails with a connection error, which clients see as UNAVAILABLE.
func TestWithTxRetriesABeginThatDied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.NewSchema(t)
	_, err := s.Pool.Exec(ctx, `CREATE TABLE t (v int)`)
	require.NoError(t, err)
	proxy := dbtest.NewProxy(t)
	pool := proxy.Pool(t, s, db.MaxConns(1))

	// The statement first, as the control: the pool's one connection dies as it is sent.
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	proxy.DropOnNextWrite()
	_, err = pool.Exec(ctx, `INSERT INTO t VALUES (0)`)
	require.Error(t, err)
	require.True(t, db.IsConnectionError(err), "%v", err)

	_, err = pool.Exec(ctx, `SELECT 1`) // a fresh connection, idle for well under pgx's 1 s ping threshold
	require.NoError(t, err)
	proxy.DropOnNextWrite()
	runs := 0
	require.NoError(t, db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		runs++
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
		return err
	}))
	require.Equal(t, 1, runs)
	var vals []int
	rows, err := s.Pool.Query(ctx, `SELECT v FROM t ORDER BY v`)
	require.NoError(t, err)
	vals, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1}, vals)
}

// Statements refused for the moment are transient — UNAVAILABLE to a client — but not connection
// errors (a batch re-run row by row on them stays possible).
func TestIsTransient(t *testing.T) {
	for code, want := range map[string]bool{"40001": true, "40P01": true, "55P03": true, "57014": true,
		"23505": false, "22P02": false, "57P01": false, "42601": false} {
		err := fmt.Errorf("insert: %w", &pgconn.PgError{Code: code})
		require.Equal(t, want, db.IsTransient(err), code)
	}
	require.False(t, db.IsTransient(context.Canceled))
}

// TestClassify: each database error sorted once, by what it says to do.
func TestClassify(t *testing.T) {
	for code, want := range map[string]db.ErrorKind{
		"08006": db.ErrConnection, "57P01": db.ErrConnection, "53300": db.ErrConnection,
		"40001": db.ErrTransient, "40P01": db.ErrTransient, "40003": db.ErrTransient, "53100": db.ErrTransient,
		"55P03": db.ErrTransient, "57014": db.ErrTransient,
		"23505": db.ErrRow, "23503": db.ErrRow, "22P02": db.ErrRow, "22021": db.ErrRow,
		"42601": db.ErrStatement, "42501": db.ErrStatement, "XX000": db.ErrStatement,
	} {
		err := fmt.Errorf("statement: %w", &pgconn.PgError{Code: code})
		require.Equal(t, want, db.Classify(err), code)
		require.Equal(t, want == db.ErrRow, db.IsRowError(err), code)
	}
	require.Equal(t, db.ErrNotDatabase, db.Classify(nil))
	require.Equal(t, db.ErrNotDatabase, db.Classify(errors.New("not the database's")))
	require.Equal(t, db.ErrConnection, db.Classify(&pgconn.ConnectError{}))
	require.True(t, db.IsLockTimeout(fmt.Errorf("x: %w", &pgconn.PgError{Code: "55P03"})))
	require.False(t, db.IsLockTimeout(&pgconn.PgError{Code: "57014"}))
}
