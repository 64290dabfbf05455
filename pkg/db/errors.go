package db

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/integrations-platform/integrations/pkg/apperr"
)

// The database's errors, sorted once by what they say to do (Classify). Every store and service
// reads a database error through these, never through SQLSTATE codes of its own.

// ErrorKind is what a database error says: retry (ErrConnection, ErrTransient), the row at
// fault (ErrRow), or the statement (ErrStatement).
type ErrorKind int

const (
	// ErrNotDatabase is not an error the database or its connection produced (nil included).
	ErrNotDatabase ErrorKind = iota
	// ErrConnection is the database could not be reached or the connection was lost
	// (IsConnectionError). The statement may be tried again; whether it ran is another matter.
	ErrConnection
	// ErrTransient is refused for the moment, not for what it is (IsTransient): trying it again
	// later may well succeed.
	ErrTransient
	// ErrRow is refused for a row's data (class 22, data exception) or a constraint (class 23): the
	// same statement without that row may succeed, and trying it again as it is will not.
	ErrRow
	// ErrStatement is anything else the server answered (a syntax or permission error, a server's
	// internal error): the statement is at fault for every row alike; a bug.
	ErrStatement
)

// Classify sorts err by what it says to do.
func Classify(err error) ErrorKind {
	switch {
	case err == nil:
		return ErrNotDatabase
	case IsConnectionError(err):
		return ErrConnection
	case IsTransient(err):
		return ErrTransient
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ErrNotDatabase
	}
	switch class(pgErr.Code) {
	case "22", "23":
		return ErrRow
	}
	return ErrStatement
}

// IsRowError reports whether err is one a single row of a statement can cause (ErrRow): a
// batch that failed on it can be run again row by row, each row answered on its own.
func IsRowError(err error) bool { return Classify(err) == ErrRow }

// IsLockTimeout reports whether err is lock_not_available (55P03): the statement waited for a row
// lock longer than lock_timeout.
func IsLockTimeout(err error) bool { return hasCode(err, "55P03") }

// IsTransient reports whether err is a statement Postgres refused for the moment rather than for
// what it is: a transaction rollback (class 40: a serialization failure, a deadlock, a statement
// whose completion is unknown), insufficient resources (class 53: disk full, out of memory; too
// many connections is a connection error), a lock not available in time (55P03: lock_timeout)
// or a statement cancelled by statement_timeout (57014). Trying it again later may well succeed,
// so a client is answered UNAVAILABLE (retry), never INTERNAL. A batch of statements meets these
// more often than one statement alone: two batches locking rows, or a batch bounded in how long
// it waits. Not a connection error: the connection is fine, and a caller that re-runs a batch
// row by row on a statement's error may do so.
func IsTransient(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch code := pgErr.Code; {
	case class(code) == "40", class(code) == "53" && code != "53300", code == "55P03", code == "57014":
		return true
	}
	return false
}

// class is a SQLSTATE's class: its first two characters.
func class(code string) string {
	if len(code) < 2 {
		return ""
	}
	return code[:2]
}

// hasCode reports whether err is a Postgres error with SQLSTATE code.
func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
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
		case class(code) == "08", code == "57P01", code == "57P02", code == "57P03", code == "53300":
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
