package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrIsBelowTheEphemeralRangeAndNeverRepeats(t *testing.T) {
	from, to, err := portRange()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 200 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < from || port >= to {
			t.Fatalf("%s outside [%d, %d)", addr, from, to)
		}
	}
}

func TestAddrAnswersAPortThatCanBeBound(t *testing.T) {
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the port Addr answered is not free: %v", err)
	}
	_ = l.Close()
}
