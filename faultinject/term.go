package faultinject

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kind is what a fault does when it fires.
type Kind string

// The kinds of fault; doc.go says what each does.
const (
	KindOff     Kind = "off"
	KindError   Kind = "error"
	KindExit    Kind = "exit"
	KindPanic   Kind = "panic"
	KindSleep   Kind = "sleep"
	KindCorrupt Kind = "corrupt"
	KindShort   Kind = "short"
	KindTorn    Kind = "torn"
	KindStatus  Kind = "status"
	KindReset   Kind = "reset"
	KindTimeout Kind = "timeout"
	KindDrop    Kind = "drop"
)

// term is one link of a point's chain: [P%][N*]kind[(arg)].
type term struct {
	percent float64 // 0 < percent <= 100
	count   int64   // fires left; < 0: no limit
	kind    Kind
	arg     string
	err     error         // KindError
	code    int           // KindExit, KindStatus
	delay   time.Duration // KindSleep
	next    *term
	src     string // the term as written, for GET /debug/faults
	rng     *rand.Rand
}

// errnos are the error names a spec may use; other text becomes an error
// with that text.
var errnos = map[string]error{
	"EIO":          syscall.EIO,
	"ENOSPC":       syscall.ENOSPC,
	"EDQUOT":       syscall.EDQUOT,
	"EROFS":        syscall.EROFS,
	"ECONNRESET":   syscall.ECONNRESET,
	"ECONNREFUSED": syscall.ECONNREFUSED,
	"ETIMEDOUT":    syscall.ETIMEDOUT,
}

// parseChain parses a point's chain of terms, checking each kind against
// the point's.
func parseChain(p *Point, s string, seed uint64) (*term, error) {
	var head, tail *term
	for i, part := range strings.Split(s, "->") {
		t, err := parseTerm(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("faultinject: %s: term %d %q: %w", p.Name, i+1, part, err)
		}
		if t.kind != KindOff && !p.accepts(t.kind) {
			return nil, fmt.Errorf("faultinject: %s: %q cannot fire here (it takes %s)", p.Name, t.kind, kindList(p.Kinds))
		}
		t.rng = rand.New(rand.NewPCG(seed, uint64(i)))
		if head == nil {
			head = t
		} else {
			tail.next = t
		}
		tail = t
	}
	return head, nil
}

func (p *Point) accepts(k Kind) bool {
	for _, x := range p.Kinds {
		if x == k {
			return true
		}
	}
	return false
}

func kindList(ks []Kind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// parseTerm parses [P%][N*]kind[(arg)].
func parseTerm(s string) (*term, error) {
	t := &term{percent: 100, count: -1, src: s}
	if i := strings.Index(s, "%"); i >= 0 && !strings.Contains(s[:i], "(") {
		p, err := strconv.ParseFloat(s[:i], 64)
		if err != nil || p <= 0 || p > 100 {
			return nil, fmt.Errorf("probability %q: want a number in (0, 100]", s[:i])
		}
		t.percent, s = p, s[i+1:]
	}
	if i := strings.Index(s, "*"); i >= 0 && !strings.Contains(s[:i], "(") {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("count %q: want a whole number of at least 1", s[:i])
		}
		t.count, s = n, s[i+1:]
	}
	kind, arg := s, ""
	if i := strings.Index(s, "("); i >= 0 {
		if !strings.HasSuffix(s, ")") {
			return nil, errors.New("unclosed parenthesis")
		}
		kind, arg = s[:i], s[i+1:len(s)-1]
	}
	t.kind, t.arg = Kind(kind), arg
	return t, t.parseArg()
}

// parseArg checks and decodes the argument of the term's kind.
func (t *term) parseArg() error {
	noArg := func() error {
		if t.arg != "" {
			return fmt.Errorf("%s takes no argument", t.kind)
		}
		return nil
	}
	switch t.kind {
	case KindOff, KindPanic, KindCorrupt, KindShort, KindTorn, KindReset, KindTimeout, KindDrop:
		return noArg()
	case KindError:
		if t.arg == "" {
			return errors.New("error needs an argument: error(EIO), error(ENOSPC) or error(any text)")
		}
		if e, ok := errnos[t.arg]; ok {
			t.err = e
		} else {
			t.err = errors.New(t.arg)
		}
	case KindExit:
		t.code = 137 // as if killed by SIGKILL
		if t.arg != "" {
			c, err := strconv.Atoi(t.arg)
			if err != nil || c < 0 || c > 255 {
				return fmt.Errorf("exit status %q: want 0 to 255", t.arg)
			}
			t.code = c
		}
	case KindSleep:
		d, err := time.ParseDuration(t.arg)
		if err != nil || d <= 0 || d > time.Hour {
			return fmt.Errorf("sleep %q: want a Go duration such as 200ms, at most 1h", t.arg)
		}
		t.delay = d
	case KindStatus:
		c, err := strconv.Atoi(t.arg)
		if err != nil || c < 100 || c > 599 {
			return fmt.Errorf("status %q: want an HTTP status, 100 to 599", t.arg)
		}
		t.code = c
	default:
		return fmt.Errorf("unknown kind %q (want off, error, exit, panic, sleep, corrupt, short, torn, status, reset, timeout or drop)", t.kind)
	}
	return nil
}

// chainString writes a chain back as a spec term.
func chainString(t *term) string {
	var parts []string
	for ; t != nil; t = t.next {
		parts = append(parts, t.src)
	}
	return strings.Join(parts, "->")
}
