//go:build unix

package db

import (
	"bytes"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = lis.Close() }()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err = net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

// peek runs peekSocket with a bound: it must never wait.
func peek(t *testing.T, c net.Conn) peekResult {
	t.Helper()
	got := make(chan peekResult, 1)
	go func() { got <- peekSocket(c) }()
	select {
	case r := <-got:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("peekSocket blocked")
		return peekUnknown
	}
}

func TestPeekSocket(t *testing.T) {
	t.Parallel()
	t.Run("idle, pending, closed", func(t *testing.T) {
		t.Parallel()
		client, server := tcpPair(t)
		require.Equal(t, peekIdle, peek(t, client))
		_, err := server.Write([]byte("E"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return peek(t, client) == peekPending }, 5*time.Second, time.Millisecond)
		require.Equal(t, peekPending, peek(t, client), "a peek takes nothing out")
		buf := make([]byte, 1)
		_, err = client.Read(buf)
		require.NoError(t, err)
		require.NoError(t, server.Close())
		require.Eventually(t, func() bool { return peek(t, client) == peekClosed }, 5*time.Second, time.Millisecond)
	})
	// pgx's background reader can sit in a blocking Read of an idle connection (it stops only
	// when data comes); the peek must not wait for that Read's lock.
	t.Run("while another goroutine is blocked reading", func(t *testing.T) {
		t.Parallel()
		client, server := tcpPair(t)
		read := make(chan struct{})
		go func() {
			buf := make([]byte, 1)
			_, _ = client.Read(buf)
			close(read)
		}()
		require.Eventually(t, func() bool { // the reader is parked in its Read, holding the lock
			buf := make([]byte, 1<<20)
			return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("waitRead"))
		}, 5*time.Second, time.Millisecond)
		require.Equal(t, peekIdle, peek(t, client))
		_, err := server.Write([]byte("E"))
		require.NoError(t, err)
		<-read
	})
}
