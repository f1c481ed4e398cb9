package units

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]uint64{"0": 0, "100": 100, "4GiB": 4 << 30, "512MiB": 512 << 20, "1.5G": 3 << 29, "64 KiB": 64 << 10, "2GB": 2e9} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1GiB", "four", "1XB"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}
