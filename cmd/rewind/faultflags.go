package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"rewind.dev/rewind/faultinject"
)

// faultFlags turn on fault injection in a daemon (faultinject): off unless
// --fault-injection is given; then the spec comes from REWIND_FAULTS and
// from PUT /debug/faults on the metrics address.
type faultFlags struct {
	on bool
}

func (f *faultFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "fault-injection", false,
		"arm fault points from $"+faultinject.EnvSpec+" and serve "+faultinject.HandlerPath+
			" on the metrics address (tests and chaos runs only; never in production)")
}

// injector returns the daemon's injector, nil when fault injection is off.
// $REWIND_FAULT_SEED seeds its probabilistic terms (default: the clock),
// and the seed is logged so that a run can be replayed.
func (f *faultFlags) injector(log *slog.Logger) (*faultinject.Injector, error) {
	if !f.on {
		return nil, nil
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("REWIND_FAULT_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("REWIND_FAULT_SEED %q: want a whole number", s)
		}
		seed = n
	}
	in, err := faultinject.FromEnv(log.With("component", "faultinject"), seed)
	if err != nil {
		return nil, err
	}
	log.Warn("fault injection is on", "seed", seed, "armed", in.Armed(), "admin", faultinject.HandlerPath)
	return in, nil
}
