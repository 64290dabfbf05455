// Package freeport hands out loopback addresses for programs a test or benchmark starts itself.
//
// Asking the kernel for port 0 and closing the listener gives a port from the ephemeral range, and
// the kernel hands the same range out as the source port of every outgoing connection: between
// the close and the program's bind, a connection to Postgres or between two services can take it
// ("bind: address already in use", seen in CI). Ports are therefore drawn outside the ephemeral
// range (below it, or above it if there is no room below), where no outgoing connection lands,
// and checked free by listening on them.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the smallest port handed out: below it sit the well-known and registered ports
// services on a development machine tend to use.
const lowest = 20000

var (
	handedOut sync.Map // every address returned by this process
	rangeOnce sync.Once
	from, to  int // the ports handed out: [from, to), outside the ephemeral range
	rangeErr  error
)

// Addr returns "127.0.0.1:port" for a port no listener holds, outside the kernel's ephemeral
// range, and not returned before by this process.
func Addr() (string, error) {
	rangeOnce.Do(func() { from, to, rangeErr = portRange() })
	if rangeErr != nil {
		return "", rangeErr
	}
	for tries := 0; tries < 1000; tries++ {
		port := from + rand.IntN(to-from)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if _, taken := handedOut.LoadOrStore(addr, true); taken {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue // held by a listener, or by another process's program
		}
		if err := l.Close(); err != nil {
			return "", fmt.Errorf("freeport: close %s: %w", addr, err)
		}
		return addr, nil
	}
	return "", fmt.Errorf("freeport: no free port in [%d, %d) after 1000 tries", from, to)
}

// minRoom is the fewest ports worth drawing from.
const minRoom = 1000

// portRange is the ports below the kernel's ephemeral range (from lowest), or, if that leaves too
// few, those above it. Without /proc (not Linux), IANA's ephemeral range, 49152–65535, is assumed.
func portRange() (int, int, error) {
	start, end := 49152, 65535
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		f := strings.Fields(string(raw))
		if len(f) != 2 {
			return 0, 0, fmt.Errorf("freeport: cannot read ip_local_port_range %q", raw)
		}
		var err1, err2 error
		start, err1 = strconv.Atoi(f[0])
		end, err2 = strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("freeport: cannot read ip_local_port_range %q", raw)
		}
	}
	switch {
	case start-lowest >= minRoom:
		return lowest, start, nil
	case 65536-(end+1) >= minRoom:
		return end + 1, 65536, nil
	}
	return 0, 0, fmt.Errorf("freeport: the ephemeral range %d–%d leaves fewer than %d ports outside it", start, end, minRoom)
}
