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

func TestBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		64 << 20: "64.0 MiB", 3 << 29: "1.5 GiB", 1 << 60: "1.0 EiB", 1<<64 - 1: "16.0 EiB",
	} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
