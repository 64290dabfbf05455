//go:build unix

package db

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// peekSocket looks at an idle connection's socket without a round trip and without taking
// anything out of it: a non-blocking MSG_PEEK. A backend that was terminated (pg_terminate_backend,
// a restart, a failover) sent its FATAL error and closed the socket before we write anything, so
// the peek finds data or the end of the stream; a live idle backend sends nothing, so the peek
// finds nothing to read. A TLS connection is peeked under its TLS layer.
func peekSocket(c net.Conn) peekResult {
	if t, isTLS := c.(*tls.Conn); isTLS {
		c = t.NetConn()
	}
	sc, isSys := c.(syscall.Conn)
	if !isSys {
		return peekUnknown
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peekUnknown
	}
	var n int
	var rerr error
	var buf [1]byte
	// Control, not Read: pgx's background reader may sit in a blocking Read of an idle
	// connection (it is started around large writes and stops only when data comes), holding the
	// descriptor's read lock; RawConn.Read would wait for it forever. A non-blocking peek needs no
	// lock and takes nothing that reader would miss.
	if err := raw.Control(func(fd uintptr) {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		return peekClosed
	}
	switch {
	case errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK) || errors.Is(rerr, syscall.EINTR):
		return peekIdle
	case rerr != nil:
		return peekClosed // reset or otherwise broken
	case n == 0:
		return peekClosed // the end of the stream
	default:
		return peekPending
	}
}
