package freeport

import (
	"net"
	"testing"
)

func TestPortsAreDistinctAndFree(t *testing.T) {
	ports, err := Ports(8)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || p <= 0 {
			t.Fatalf("ports %v: %d twice or invalid", ports, p)
		}
		seen[p] = true
	}
	a, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("the free address %s cannot be listened on: %v", a, err)
	}
	l.Close()
}
