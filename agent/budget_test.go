package agent

import "testing"

// TestDefaultBudget: with no --budget the agent takes the tmpfs's size,
// but never more than half the host's memory: a /dev/shm sized beyond
// the memory behind it (a container's, or a host's set to its whole
// memory) must not leave the agent refusing to start with its defaults.
func TestDefaultBudget(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name            string
		tmpfs, mem, out uint64
	}{
		{"tmpfs at half the memory (the kernel's default)", 64 * gib, 128 * gib, 64 * gib},
		{"tmpfs smaller", 16 * gib, 128 * gib, 16 * gib},
		{"tmpfs larger than the memory", 128 * gib, 126 * gib, 63 * gib},
		{"tmpfs at the whole memory", 128 * gib, 128 * gib, 64 * gib},
		{"memory unknown", 128 * gib, 0, 128 * gib},
	}
	for _, c := range cases {
		if got := defaultBudget(c.tmpfs, c.mem); got != c.out {
			t.Errorf("%s: defaultBudget(%d GiB, %d GiB) = %d GiB, want %d GiB", c.name, c.tmpfs/gib, c.mem/gib, got/gib, c.out/gib)
		}
		if got := defaultBudget(c.tmpfs, c.mem); c.mem > 0 && got > c.mem {
			t.Errorf("%s: a default budget above the host's memory: %d", c.name, got)
		}
	}
}
