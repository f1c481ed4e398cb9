// Package units parses and formats byte sizes for flags and output.
package units

import (
	"fmt"
	"strconv"
	"strings"
)

var suffixes = []struct {
	s string
	m uint64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// ParseBytes parses "4GiB", "512MiB", "1.5G", "100" (bytes).
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, x := range suffixes {
		if strings.HasSuffix(t, x.s) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, x.s)), x.m
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("invalid size %q: want a number with an optional unit (KiB, MiB, GiB, TiB)", s)
	}
	return uint64(f * float64(mult)), nil
}

// Bytes formats a byte count for people: 1.5 GiB, 64.0 MiB, 512 B.
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
