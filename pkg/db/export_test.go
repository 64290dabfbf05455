package db

import "net"

// SocketGone reports whether an idle connection's socket holds its backend's last message (a
// FATAL) or the end of the stream: the client side has seen the backend go, as alive would.
func SocketGone(c net.Conn) bool {
	r := peekSocket(c)
	return r == peekPending || r == peekClosed
}
