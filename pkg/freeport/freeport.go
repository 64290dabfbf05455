// Package freeport hands out loopback addresses for programs a test or benchmark starts itself.
//
// Asking the kernel for port 0 and closing the listener gives a port from the ephemeral range, and
// the kernel hands the same range out as the source port of every outgoing connection: between
// the close and the program's bind, a connection to Postgres or between two services can take it
// ("bind: address already in use", seen in CI). Ports are therefore drawn below the ephemeral
// range, where no outgoing connection lands, and checked free by listening on them.
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
	highest   int // exclusive: the start of the kernel's ephemeral range
)

// Addr returns "127.0.0.1:port" for a port no listener holds, outside the kernel's ephemeral
// range, and not returned before by this process.
func Addr() (string, error) {
	rangeOnce.Do(func() { highest = ephemeralStart() })
	for tries := 0; tries < 1000; tries++ {
		port := lowest + rand.IntN(highest-lowest)
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
	return "", fmt.Errorf("freeport: no free port in [%d, %d) after 1000 tries", lowest, highest)
}

// ephemeralStart reads the first port of Linux's ephemeral range; elsewhere, or when the range
// leaves too little room below it, it answers IANA's 49152.
func ephemeralStart() int {
	const fallback = 49152
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return fallback
	}
	fields := strings.Fields(string(raw))
	if len(fields) == 0 {
		return fallback
	}
	start, err := strconv.Atoi(fields[0])
	if err != nil || start < lowest+1000 {
		return fallback
	}
	return start
}
