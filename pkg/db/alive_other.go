//go:build !unix

package db

import "net"

func peekSocket(net.Conn) peekResult { return peekUnknown }
