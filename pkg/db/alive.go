package db

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type peekResult int

const (
	peekUnknown peekResult = iota // the socket could not be looked at
	peekIdle                      // nothing to read: a live idle backend
	peekPending                   // something to read: a FATAL, a notice, a TLS record...
	peekClosed                    // the end of the stream, or an error
)

// alive is the pool's PrepareConn: it reports whether a connection about to be handed out is
// still usable, at the cost of one system call in the common case. Data waiting on an idle
// connection is read as pgx would read it (CheckConn, which returns at once since the data is
// there): a terminated backend's FATAL makes it an error, a notice or a notification does not.
func alive(_ context.Context, c *pgx.Conn) (bool, error) {
	switch peekSocket(c.PgConn().Conn()) {
	case peekClosed:
		return false, nil
	case peekPending:
		return c.PgConn().CheckConn() == nil, nil //nolint:staticcheck // SA1019: Ping would be a round trip per checkout; the data is already there to read (above)
	default:
		return true, nil
	}
}
