//go:build unix

package db

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// peekAlive reports whether an idle connection's socket is still open, without a round trip and
// without taking anything out of it: a non-blocking MSG_PEEK. A backend that was terminated
// (pg_terminate_backend, a restart, a failover) sent its FATAL error and closed the socket
// before we write anything, so the peek sees data or the end of the stream; a live idle backend
// sends nothing, so the peek finds nothing to read. ok is false when the check could not be made
// (not a socket we can peek), so the caller keeps the connection.
func peekAlive(c net.Conn) (alive, ok bool) {
	if t, isTLS := c.(*tls.Conn); isTLS {
		c = t.NetConn()
	}
	sc, isSys := c.(syscall.Conn)
	if !isSys {
		return true, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true, false
	}
	var rerr error
	var buf [1]byte
	// Returning true from the callback leaves the read at once instead of waiting for the socket
	// to become readable.
	if err := raw.Read(func(fd uintptr) bool {
		_, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false, true
	}
	switch {
	case errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK) || errors.Is(rerr, syscall.EINTR):
		return true, true // nothing to read: the backend is idle, as it should be
	case rerr != nil:
		return false, true // reset or otherwise broken
	default:
		// Zero bytes is the end of the stream; more is a message nobody asked for on an idle
		// connection, in practice the FATAL of a terminated backend.
		return false, true
	}
}
