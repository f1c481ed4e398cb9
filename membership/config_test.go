package membership

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigBound(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Name = "n1"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// The bounds DefaultConfig's comment and the design note state.
	for n, want := range map[int]time.Duration{
		2:    2 * time.Second,
		5:    2 * time.Second,
		10:   2 * time.Second,
		100:  3200 * time.Millisecond,
		1000: 4400 * time.Millisecond,
	} {
		if got := cfg.DetectionBound(n); got != want {
			t.Errorf("DetectionBound(%d) = %v, want %v", n, got, want)
		}
	}
	min, max := cfg.SuspicionTimeout(5)
	if min != 600*time.Millisecond || max != 1200*time.Millisecond {
		t.Errorf("SuspicionTimeout(5) = %v, %v; want 600ms, 1.2s", min, max)
	}
	// Lifeguard needs SuspicionMult-2 ≥ 1 confirmations to shorten a
	// suspicion; with fewer the timeout would be fixed at its minimum.
	if cfg.SuspicionMult-2 < 1 {
		t.Errorf("SuspicionMult %d leaves Lifeguard no confirmations to wait for", cfg.SuspicionMult)
	}
	mc := cfg.memberlistConfig()
	if mc.ProbeInterval != cfg.ProbeInterval || mc.SuspicionMult != cfg.SuspicionMult ||
		mc.SuspicionMaxTimeoutMult != cfg.SuspicionMaxTimeoutMult || mc.EnableCompression {
		t.Errorf("memberlist config does not carry the tuning: %+v", mc)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"no name":          {func(c *Config) { c.Name = "" }, "name is empty"},
		"bad bind":         {func(c *Config) { c.BindAddr = "localhost" }, `bind address "localhost"`},
		"bad port":         {func(c *Config) { c.BindPort = 70000 }, "bind port 70000"},
		"bad role":         {func(c *Config) { c.Meta.Role = "x" }, `role "x"`},
		"timeout≥interval": {func(c *Config) { c.ProbeTimeout = c.ProbeInterval }, "must be shorter than the probe interval"},
		"zero poll":        {func(c *Config) { c.StatePollInterval = 0 }, "state poll interval 0s must be positive"},
		"zero suspicion":   {func(c *Config) { c.SuspicionMult = 0 }, "suspicion multiplier 0"},
		"no clock":         {func(c *Config) { c.Clock = nil }, "clock must be set"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Name = "n1"
			tc.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "membership: ") {
				t.Fatalf("got %v, want an error naming membership and containing %q", err, tc.want)
			}
		})
	}
}
