package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// newFlagSet returns a command's flag set. A wrong flag is an error of
// one line saying what is wrong and pointing at -h (parseFlags returns it,
// main prints it); the flags themselves are listed only when asked for
// with -h, headed by usage (what follows "usage: rewind ") and about, if
// given.
func newFlagSet(name, usage, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// While parsing, output goes nowhere: the flag package prints the
	// error and then calls Usage, for a wrong flag as for -h.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage: rewind "+usage)
		if about != "" {
			fmt.Fprintln(w, "\n"+about)
		}
		fmt.Fprintln(w)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args. -h prints the flags to stderr and returns
// flag.ErrHelp (main exits 0); any other error is usageError's one line.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stderr)
		fs.Usage()
		fs.SetOutput(io.Discard)
		return err
	case err != nil:
		return usageError(fs, err)
	}
	return nil
}

// usageError is a command-line error on one line, with where to find the
// flags: "invalid value "-5s" for flag -leave-grace: must not be negative
// (rewind coordinator -h lists the flags)".
func usageError(fs *flag.FlagSet, err error) error {
	return fmt.Errorf("%w (rewind %s -h lists the flags)", err, fs.Name())
}

// durationFlag is a duration flag with a lower bound: a value below it is
// refused while the flags are parsed, naming the flag.
type durationFlag struct {
	p        *time.Duration
	positive bool // > 0; otherwise >= 0
}

func (d durationFlag) String() string {
	if d.p == nil {
		return ""
	}
	return d.p.String()
}

func (d durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return errors.New("want a duration such as 10s, 2m or 1h30m")
	case d.positive && v <= 0:
		return errors.New("must be positive")
	case v < 0:
		return errors.New("must not be negative")
	}
	*d.p = v
	return nil
}

// nonNegativeDuration defines a duration flag that refuses negative values.
func nonNegativeDuration(fs *flag.FlagSet, p *time.Duration, name, usage string) {
	fs.Var(durationFlag{p: p}, name, usage)
}

// positiveDuration defines a duration flag that refuses zero and negative
// values.
func positiveDuration(fs *flag.FlagSet, p *time.Duration, name, usage string) {
	fs.Var(durationFlag{p: p, positive: true}, name, usage)
}

// limitFlag defines a flag for one of the coordinator's limits: a whole
// number from 1 to 2^32-1.
func limitFlag(fs *flag.FlagSet, name, what string, set func(uint32), def uint64) {
	fs.Func(name, fmt.Sprintf("limit on the %s; a request over it is refused (default %d)", what, def), func(s string) error {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			return errors.New("want a whole number from 1 to 4294967295")
		}
		set(uint32(n))
		return nil
	})
}
