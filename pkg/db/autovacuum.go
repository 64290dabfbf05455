package db

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// AutovacuumOff reports whether the server runs with autovacuum off.
//
// The services' statements are prepared, and pgx settles on a generic plan after five executions;
// a generic plan made while a table was nearly empty is replanned only when the table is analyzed.
// Without autovacuum nothing analyzes it, and a plan that walked a handful of rows walks a backlog
// of thousands (docs/decisions.md, "The services assume autovacuum"; issue 13 measured 100 ms for a
// start that takes 0.4 ms once analyzed).
func AutovacuumOff(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var v string
	if err := pool.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&v); err != nil {
		return false, fmt.Errorf("read the autovacuum setting: %w", err)
	}
	return v == "off", nil
}

// WarnIfAutovacuumOff logs a warning at startup when the server runs with autovacuum off (see
// AutovacuumOff); a failure to read the setting is logged at debug and otherwise ignored: the
// service works either way, only slower as its tables grow.
func WarnIfAutovacuumOff(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger) {
	off, err := AutovacuumOff(ctx, pool)
	if err != nil {
		log.Debug("autovacuum setting not read", zap.Error(err))
		return
	}
	if off {
		log.Warn("postgres runs with autovacuum off: no table is analyzed, and prepared statements keep plans made on small tables as they grow; turn it on, or ANALYZE the schema's tables regularly")
	}
}
