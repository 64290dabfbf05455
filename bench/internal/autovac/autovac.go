// Package autovac stands in for Postgres's autovacuum on a server that has it turned off, as the
// development machines' server has: every table of the database that crosses autovacuum's own
// thresholds (the server's autovacuum_* settings) is vacuumed or analyzed, as the launcher would.
//
// Without it a bench measures a server nobody runs in production: no table is ever analyzed, so a
// prepared statement's generic plan, made while its tables were nearly empty (the warm-up), is
// never invalidated and keeps its nearly-empty-table plan through a backlog of tens of thousands
// of rows (issue 13: the execution-consumer's start batch took 100 ms a batch that way, against
// 0.5 ms re-planned), and dead versions pile up for every system alike.
package autovac

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Off reports whether the server's autovacuum is off.
func Off(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var on string
	if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&on); err != nil {
		return false, fmt.Errorf("show autovacuum: %w", err)
	}
	return on != "on", nil
}

// Stats counts what a stand-in did.
type Stats struct {
	Passes, Vacuums, Analyzes int
	Errors                    int
	LastErr                   error
}

// StandIn runs passes every naptime until stopped.
type StandIn struct {
	pool    *pgxpool.Pool
	naptime time.Duration
	schemas []string // empty: every schema
	cancel  context.CancelFunc
	done    chan struct{}

	mu    sync.Mutex
	stats Stats
}

// Start starts a stand-in over the tables of pool's database (of the schemas named, if any), its
// first pass at once.
func Start(ctx context.Context, pool *pgxpool.Pool, naptime time.Duration, schemas ...string) *StandIn {
	ctx, cancel := context.WithCancel(ctx)
	s := &StandIn{pool: pool, naptime: naptime, schemas: schemas, cancel: cancel, done: make(chan struct{})}
	go s.loop(ctx)
	return s
}

// Stop stops the stand-in, waits for its pass in progress, and returns what it did.
func (s *StandIn) Stop() Stats {
	s.cancel()
	<-s.done
	return s.Snapshot()
}

// Snapshot returns what the stand-in did so far.
func (s *StandIn) Snapshot() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *StandIn) loop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.naptime)
	defer t.Stop()
	for {
		vac, ana, err := s.pass(ctx)
		s.mu.Lock()
		s.stats.Passes++
		s.stats.Vacuums += vac
		s.stats.Analyzes += ana
		if err != nil && ctx.Err() == nil {
			s.stats.Errors++
			s.stats.LastErr = err
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass vacuums (with analyze) the tables over the vacuum thresholds — dead versions, or rows
// inserted since the last vacuum — and analyzes those over the analyze threshold only.
func (s *StandIn) pass(ctx context.Context) (vacuums, analyzes int, err error) {
	rows, err := s.pool.Query(ctx, `
		SELECT format('%I.%I', t.schemaname, t.relname),
			t.n_dead_tup > current_setting('autovacuum_vacuum_threshold')::float8
					+ current_setting('autovacuum_vacuum_scale_factor')::float8 * greatest(c.reltuples, 0)
				OR t.n_ins_since_vacuum > current_setting('autovacuum_vacuum_insert_threshold')::float8
					+ current_setting('autovacuum_vacuum_insert_scale_factor')::float8 * greatest(c.reltuples, 0),
			t.n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::float8
				+ current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0)
		FROM pg_stat_user_tables t JOIN pg_class c ON c.oid = t.relid
		WHERE cardinality($1::text[]) = 0 OR t.schemaname = ANY($1)
		ORDER BY 1`, s.schemas)
	if err != nil {
		return 0, 0, fmt.Errorf("autovacuum stand-in: list tables: %w", err)
	}
	type todo struct {
		name     string
		vac, ana bool
	}
	var list []todo
	for rows.Next() {
		var t todo
		if err := rows.Scan(&t.name, &t.vac, &t.ana); err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("autovacuum stand-in: list tables: %w", err)
		}
		if t.vac || t.ana {
			list = append(list, t)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("autovacuum stand-in: list tables: %w", err)
	}
	for _, t := range list {
		stmt := "ANALYZE " + t.name
		if t.vac {
			stmt = "VACUUM (ANALYZE) " + t.name
		}
		// Simple protocol: VACUUM cannot run in the extended protocol's implicit transaction
		// block when pipelined, and neither statement is worth preparing.
		if _, err := s.pool.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
			if ctx.Err() != nil {
				return vacuums, analyzes, nil
			}
			// A table dropped since the list (a finished run's schema) is not an error.
			if isUndefinedTable(err) {
				continue
			}
			return vacuums, analyzes, fmt.Errorf("autovacuum stand-in: %s: %w", stmt, err)
		}
		if t.vac {
			vacuums++
		} else {
			analyzes++
		}
	}
	return vacuums, analyzes, nil
}

// isUndefinedTable reports a table or schema that is gone (42P01, 3F000).
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000")
}
