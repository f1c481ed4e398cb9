package faultinject

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// EnvSpec is the environment variable a daemon started with
// --fault-injection reads its initial spec from.
const EnvSpec = "REWIND_FAULTS"

// Injector holds the armed faults of one daemon (or of one part of a
// test). A nil *Injector never fires.
type Injector struct {
	log  *slog.Logger
	seed uint64
	exit func(code int) // os.Exit; tests replace it

	mu    sync.Mutex
	terms map[string]*term  // point → the chain still to fire
	specs map[string]string // point → the chain as armed
	hits  map[string]uint64 // point → times fired
}

// New returns an Injector with nothing armed. seed makes probabilistic
// terms replayable: the same seed and spec fire at the same hits of each
// point (hits of one point happen in the order the code reaches it).
func New(log *slog.Logger, seed uint64) *Injector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Injector{log: log, seed: seed, exit: os.Exit,
		terms: map[string]*term{}, specs: map[string]string{}, hits: map[string]uint64{}}
}

// FromEnv returns an Injector armed with the spec in REWIND_FAULTS (none
// armed when it is empty).
func FromEnv(log *slog.Logger, seed uint64) (*Injector, error) {
	in := New(log, seed)
	if s := os.Getenv(EnvSpec); s != "" {
		if err := in.Set(s); err != nil {
			return nil, fmt.Errorf("%s: %w", EnvSpec, err)
		}
	}
	return in, nil
}

// Set arms the spec's terms ("point=term;point=term"), replacing what was
// armed at those points. A spec with any error arms nothing.
func (in *Injector) Set(spec string) error {
	if in == nil {
		return fmt.Errorf("faultinject: fault injection is off (start the daemon with --fault-injection)")
	}
	armed := map[string]*term{}
	src := map[string]string{}
	for _, item := range strings.FieldsFunc(spec, func(r rune) bool { return r == ';' || r == '\n' }) {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, chain, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("faultinject: %q: want point=term", item)
		}
		name = strings.TrimSpace(name)
		p, ok := lookup(name)
		if !ok {
			return fmt.Errorf("faultinject: no fault point %q (GET /debug/faults lists them)", name)
		}
		t, err := parseChain(p, strings.TrimSpace(chain), in.pointSeed(name))
		if err != nil {
			return err
		}
		armed[name], src[name] = t, chainString(t)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	maps.Copy(in.terms, armed)
	maps.Copy(in.specs, src)
	for name, s := range src {
		in.log.Warn("fault armed", "point", name, "term", s)
	}
	return nil
}

// pointSeed gives each point its own random stream, so that the hits of
// one point do not shift the draws of another.
func (in *Injector) pointSeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return in.seed ^ h.Sum64()
}

// Clear disarms every point.
func (in *Injector) Clear() {
	if in == nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	clear(in.terms)
	clear(in.specs)
	in.log.Warn("faults cleared")
}

// Armed returns the spec of every armed point, sorted by point.
func (in *Injector) Armed() []string {
	if in == nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []string
	for _, name := range slices.Sorted(maps.Keys(in.specs)) {
		out = append(out, name+"="+in.specs[name])
	}
	return out
}

// Hits returns how often each point fired.
func (in *Injector) Hits() map[string]uint64 {
	if in == nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return maps.Clone(in.hits)
}

// Fault is what fired at a point; the zero Fault is none.
type Fault struct {
	Point string
	Kind  Kind
	err   error
	Code  int           // KindStatus: the HTTP status
	Delay time.Duration // KindSleep
	rng   uint64        // a draw for the site's own choices (which byte)
}

// Fired reports whether a fault fired.
func (f Fault) Fired() bool { return f.Kind != "" }

// Err is the error of a KindError fault, naming the point; nil otherwise.
func (f Fault) Err() error {
	if f.Kind != KindError {
		return nil
	}
	return &Error{Point: f.Point, Err: f.err}
}

// Draw is a random number from the fault's point stream, for a site that
// must pick (which byte to flip, where to tear).
func (f Fault) Draw() uint64 { return f.rng }

// Error is an injected error. It unwraps to the errno or text of the spec.
type Error struct {
	Point string
	Err   error
}

func (e *Error) Error() string { return "injected fault at " + e.Point + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Eval asks whether a fault fires at point. Exit, panic and sleep are
// carried out here (a sleep ends early when ctx does); every other kind is
// returned for the site to carry out. A nil Injector, or a point with
// nothing armed, returns the zero Fault.
func (in *Injector) Eval(ctx context.Context, point string) Fault {
	if in == nil {
		return Fault{}
	}
	f, ok := in.fire(point)
	if !ok {
		return Fault{}
	}
	switch f.Kind {
	case KindExit:
		in.log.Error("fault: exiting", "point", point, "status", f.Code)
		fmt.Fprintf(os.Stderr, "faultinject: exit(%d) at %s\n", f.Code, point)
		in.exit(f.Code)
	case KindPanic:
		panic(fmt.Sprintf("faultinject: panic at %s", point))
	case KindSleep:
		_ = clock.Sleep(ctx, f.Delay) // a sleep ends early when ctx does
	}
	return f
}

// Check is Eval for a point where only failing means something: it
// returns the error of a KindError fault, nil otherwise.
func (in *Injector) Check(ctx context.Context, point string) error {
	return in.Eval(ctx, point).Err()
}

// fire takes the next firing of point's chain, if any.
func (in *Injector) fire(point string) (Fault, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	t := in.terms[point]
	for t != nil && t.count == 0 {
		t = t.next
		in.terms[point] = t
	}
	if t == nil {
		return Fault{}, false
	}
	if t.percent < 100 && t.rng.Float64()*100 >= t.percent {
		return Fault{}, false
	}
	if t.count > 0 {
		t.count--
	}
	if t.kind == KindOff {
		return Fault{}, false // a hit passed over, as the chain says
	}
	in.hits[point]++
	recordHit(point)
	return Fault{Point: point, Kind: t.kind, err: t.err, Code: t.code, Delay: t.delay, rng: t.rng.Uint64()}, true
}
