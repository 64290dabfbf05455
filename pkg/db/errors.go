package db

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/integrations-platform/integrations/pkg/apperr"
)

func init() {
	apperr.RegisterDependencyFailure(IsConnectionError)
	apperr.RegisterDependencyFailure(IsTransient)
}

// IsTransient reports whether err is a statement Postgres refused for the moment rather than for
// what it is: a serialization failure (40001), a deadlock (40P01), a lock not available in time
// (55P03: lock_timeout) or a statement cancelled by statement_timeout (57014). Trying it again
// later may well succeed, so a client is answered UNAVAILABLE (retry), never INTERNAL. A batch of
// statements meets these more often than one statement alone: two batches locking rows, or a
// batch bounded in how long it waits. Not a connection error: the connection is fine, and a
// caller that re-runs a batch row by row on a statement's error may do so.
func IsTransient(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40001", "40P01", "55P03", "57014":
		return true
	}
	return false
}

// IsConnectionError reports whether err says the database could not be reached or the
// connection was lost, rather than that the statement was wrong: a dial failure, SQLSTATE class
// 08 (connection exception), 57P01/57P02/57P03 (the backend was terminated by an administrator,
// by a crash of another backend, or the server is starting or stopping), 53300 (too many
// connections), an error pgx marks safe to retry (nothing was sent), a closed pool, or an I/O
// error on the socket. The statement may be tried again later; whether it ran is another matter
// (see WithTx). grpcx.ToStatus answers every such error UNAVAILABLE, never INTERNAL.
func IsConnectionError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03", code == "53300":
			return true
		default:
			// Any other server error is about the statement, even when the connection then died.
			return false
		}
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, puddle.ErrClosedPool) {
		return true
	}
	// pgx reports a lost connection as the socket's error (io.EOF, a reset, net.ErrClosed...),
	// wrapped; apperr knows those.
	return apperr.IsNetworkFailure(err)
}
