package chaos

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTableRoundTrip(t *testing.T) {
	rows := []Row{
		{"node-kill", seconds(1300 * time.Millisecond), seconds(1400 * time.Millisecond), counts(0), bytesCell(60 << 20), "ok (812 ops)", "PASS"},
		{"two-nodes", seconds(time.Second, 1200*time.Millisecond), "1.2 s / 1.5 s", counts(1, 0), "-", "FAIL", "FAIL (1 of 7 checks)"},
	}
	var b bytes.Buffer
	WriteTable(&b, rows)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("table has %d lines:\n%s", len(lines), b.String())
	}
	for _, l := range lines[1:] {
		if len(l) != len(lines[0]) {
			t.Fatalf("columns not aligned:\n%s", b.String())
		}
	}
	got, err := ParseTable(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, rows) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, rows)
	}
	if rows[1].Detected != "1.0 s / 1.2 s" || rows[1].StepsLost != "1 / 0" || rows[0].Bytes != "60.0 MiB" {
		t.Fatalf("cells: %+v", rows)
	}
}

func TestParseTableRejects(t *testing.T) {
	for name, text := range map[string]string{
		"not a table":   "scenario detected",
		"missing cells": "| a | b |",
		"open row":      "| a | b | c | d | e | f | g",
	} {
		if _, err := ParseTable(text); err == nil {
			t.Errorf("%s: %q parsed", name, text)
		}
	}
}

func TestPickSubnet(t *testing.T) {
	got, err := pickSubnet("172.17.0.0/16 172.31.240.0/24 172.31.241.0/24 ")
	if err != nil || got != "172.31.242" {
		t.Fatalf("pickSubnet = %q, %v", got, err)
	}
	var all strings.Builder
	for i := 240; i < 256; i++ {
		all.WriteString("172.31." + string(rune('0'+i/100)) + string(rune('0'+i/10%10)) + string(rune('0'+i%10)) + ".0/24 ")
	}
	if _, err := pickSubnet(all.String()); err == nil {
		t.Fatal("a subnet was picked with all taken")
	}
}

func TestParseHits(t *testing.T) {
	body := []byte(`{"points":[{"name":"agent/tier-uploaded","hits":0},{"name":"agent/replica-stored","armed":"corrupt","hits":5}]}`)
	if n, err := parseHits(body, "agent/replica-stored"); err != nil || n != 5 {
		t.Fatalf("hits = %d, %v", n, err)
	}
	if _, err := parseHits(body, "agent/nope"); err == nil {
		t.Fatal("an unknown point has hits")
	}
	if _, err := parseHits([]byte("<html>"), "x"); err == nil {
		t.Fatal("a bad answer parsed")
	}
}

func TestScenarioSelection(t *testing.T) {
	seen := map[string]bool{}
	for _, sc := range scenarios {
		if seen[sc.name] || sc.play == nil || sc.what == "" {
			t.Fatalf("scenario %q: duplicate or incomplete", sc.name)
		}
		seen[sc.name] = true
	}
	cfg := DefaultConfig()
	cfg.Smoke = true
	smoke, err := cfg.selected()
	if err != nil || len(smoke) != 2 || smoke[0].name != "node-kill" || smoke[1].name != "minio-stop" {
		t.Fatalf("smoke set: %v, %v", smoke, err)
	}
	cfg.Scenarios = []string{"partition-heal", "nope"}
	if _, err := cfg.selected(); err == nil || !strings.Contains(err.Error(), `no scenario "nope"`) {
		t.Fatalf("an unknown scenario: %v", err)
	}
	// Each scenario draws from its own stream: the same seed, the same
	// choices, whatever else runs.
	a, b := scenarioRNG(42, "node-kill"), scenarioRNG(42, "node-kill")
	c := scenarioRNG(42, "partition-heal")
	x, y, z := a.Uint64(), b.Uint64(), c.Uint64()
	if x != y || x == z {
		t.Fatalf("streams: %d %d %d", x, y, z)
	}
}

// TestDocsChaosTable: the results table docs/testing.md quotes parses,
// names every scenario in order, and shows each passing, so that the
// published results cover the suite as it is.
func TestDocsChaosTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/testing.md")
	if err != nil {
		t.Fatal(err)
	}
	// The results table is the one whose header has the "detected after"
	// column (the scenarios' own table, above it, has none).
	var table []string
	for _, l := range strings.Split(string(b), "\n") {
		if len(table) == 0 {
			if strings.HasPrefix(l, "| scenario ") && strings.Contains(l, "| detected after ") {
				table = append(table, l)
			}
			continue
		}
		if !strings.HasPrefix(l, "|") {
			break
		}
		table = append(table, l)
	}
	if len(table) == 0 {
		t.Fatal("docs/testing.md quotes no chaos results table (as rewind chaos prints it)")
	}
	rows, err := ParseTable(strings.Join(table, "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(scenarios) {
		t.Fatalf("docs/testing.md's table has %d rows, there are %d scenarios", len(rows), len(scenarios))
	}
	for k, r := range rows {
		if r.Scenario != scenarios[k].name || r.Result != "PASS" {
			t.Errorf("docs/testing.md row %d: %s %s, want %s PASS", k, r.Scenario, r.Result, scenarios[k].name)
		}
	}
}
