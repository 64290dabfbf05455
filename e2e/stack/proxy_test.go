package stack

import (
	"bufio"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/freeport"
)

// echoName serves a listener that answers every connection with its name and a newline.
func echoName(t *testing.T, name string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name + "\n"))
			_ = c.Close()
		}
	}()
	return l
}

func via(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return line[:len(line)-1]
}

// TestProxySpreadsAndSkipsDeadBackends: connections alternate over the live backends; a dead
// backend is skipped; with none alive the client's connection is closed.
func TestProxySpreadsAndSkipsDeadBackends(t *testing.T) {
	a, b := echoName(t, "a"), echoName(t, "b")
	addr, err := freeport.Addr()
	require.NoError(t, err)
	p, err := newProxy(addr, []string{a.Addr().String(), b.Addr().String()})
	require.NoError(t, err)
	defer p.Close()

	seen := map[string]int{}
	for range 4 {
		seen[via(t, addr)]++
	}
	require.Equal(t, map[string]int{"a": 2, "b": 2}, seen, "round robin over both")

	require.NoError(t, a.Close())
	for range 3 {
		require.Equal(t, "b", via(t, addr), "the dead backend is skipped")
	}
	require.NoError(t, b.Close())
	require.Equal(t, "", via(t, addr), "no backend: the connection is closed")
}
