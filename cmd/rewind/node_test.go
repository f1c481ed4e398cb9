package main

import (
	"slices"
	"testing"
)

func TestNodeArgs(t *testing.T) {
	before, after := splitArgs([]string{"--job", "j", "--", "--node", "n1", "--socket=/s", "-coordinator", "c:1", "--", "x"})
	if !slices.Equal(before, []string{"--job", "j"}) || len(after) != 7 {
		t.Fatalf("split: %v | %v", before, after)
	}
	for name, want := range map[string]string{"node": "n1", "socket": "/s", "coordinator": "c:1", "listen": "def"} {
		if got := flagValue(after, name, "def"); got != want {
			t.Errorf("flagValue(%s) = %q, want %q", name, got, want)
		}
	}
	// The last one given wins, as with flag.
	if got := flagValue([]string{"--node", "a", "--node=b"}, "node", ""); got != "b" {
		t.Errorf("last flag: %q", got)
	}
	if _, after := splitArgs([]string{"--job", "j"}); after != nil {
		t.Errorf("no -- gave agent args %v", after)
	}
}

func TestParseRanks(t *testing.T) {
	if got, err := parseRanks("0, 2"); err != nil || !slices.Equal(got, []uint32{0, 2}) {
		t.Fatalf("parseRanks = %v, %v", got, err)
	}
	if got, err := parseRanks(""); err != nil || got != nil {
		t.Fatalf("a spare: %v, %v", got, err)
	}
	if _, err := parseRanks("1,x"); err == nil {
		t.Fatal("a bad rank parsed")
	}
}
