package tiers

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Policy says which steps of a job go to which tier and how many each
// keeps. Its text form, used by flags and the rewind.dev/policy annotation:
//
//	nvme:every=10,keep=3;pfs:every=100,keep=2;s3:every=30m,keep=5
//
// One clause per tier (nvme, pfs, s3); every= is a step count or a
// duration (a step goes when that many steps or that much time passed since
// the tier's last copy); keep= is how many copies the tier retains.
type Policy struct {
	Tiers []TierPolicy
}

// TierPolicy is one tier's clause.
type TierPolicy struct {
	Tier       Name
	EverySteps int64         // 0 when EveryTime is set
	EveryTime  time.Duration // 0 when EverySteps is set
	Keep       int
}

// DefaultPolicy suits a job that checkpoints to memory every step: local
// NVMe often (cheap, survives a process and agent crash), the shared
// filesystem less often, the object store on a clock (it survives losing
// every node, and costs money per request).
func DefaultPolicy() Policy {
	return Policy{Tiers: []TierPolicy{
		{Tier: NVMe, EverySteps: 10, Keep: 2},
		{Tier: PFS, EverySteps: 100, Keep: 2},
		{Tier: S3, EveryTime: 30 * time.Minute, Keep: 3},
	}}
}

// ParsePolicy parses the text form; an empty string is DefaultPolicy.
func ParsePolicy(s string) (Policy, error) {
	if strings.TrimSpace(s) == "" {
		return DefaultPolicy(), nil
	}
	var p Policy
	for i, clause := range strings.Split(s, ";") {
		clause = strings.TrimSpace(clause)
		if clause == "" {
			// Not a policy of no tiers: a slip (";;", a stray ';') that
			// would silently turn off every durable copy.
			return Policy{}, fmt.Errorf("tiers: policy %q: clause %d is empty (';' twice, or at an end); want clauses TIER:every=N|DURATION,keep=K joined by ';'", s, i+1)
		}
		tp, err := parseClause(clause)
		if err != nil {
			return Policy{}, fmt.Errorf("tiers: policy %q: %w", s, err)
		}
		p.Tiers = append(p.Tiers, tp)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, fmt.Errorf("tiers: policy %q: %w", s, err)
	}
	return p, nil
}

func parseClause(clause string) (TierPolicy, error) {
	name, opts, ok := strings.Cut(clause, ":")
	tp := TierPolicy{Tier: Name(strings.TrimSpace(name))}
	if !ok {
		return tp, fmt.Errorf("clause %q: want TIER:every=N|DURATION,keep=K", clause)
	}
	for _, kv := range strings.Split(opts, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return tp, fmt.Errorf("tier %s: %q is not key=value", tp.Tier, kv)
		}
		switch k {
		case "every":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				tp.EverySteps = n
			} else if d, err := time.ParseDuration(v); err == nil {
				tp.EveryTime = d
			} else {
				return tp, fmt.Errorf("tier %s: every=%q is neither a step count nor a duration (10, 30m)", tp.Tier, v)
			}
		case "keep":
			n, err := strconv.Atoi(v)
			if err != nil {
				return tp, fmt.Errorf("tier %s: keep=%q is not a number", tp.Tier, v)
			}
			tp.Keep = n
		default:
			return tp, fmt.Errorf("tier %s: unknown key %q (every, keep)", tp.Tier, k)
		}
	}
	return tp, nil
}

// Validate checks every clause.
func (p Policy) Validate() error {
	seen := map[Name]bool{}
	for _, t := range p.Tiers {
		switch {
		case !t.Tier.Valid():
			return fmt.Errorf("unknown tier %q (%s)", t.Tier, nameList())
		case seen[t.Tier]:
			return fmt.Errorf("tier %s given twice", t.Tier)
		case t.EverySteps < 0 || t.EveryTime < 0 || (t.EverySteps == 0) == (t.EveryTime == 0):
			return fmt.Errorf("tier %s: every= must be one positive step count or duration", t.Tier)
		case t.EveryTime != 0 && t.EveryTime < time.Second:
			return fmt.Errorf("tier %s: every=%v is shorter than a second", t.Tier, t.EveryTime)
		case t.Keep < 1:
			return fmt.Errorf("tier %s: keep=%d, at least 1 copy must be kept", t.Tier, t.Keep)
		}
		seen[t.Tier] = true
	}
	return nil
}

// String renders the text form.
func (p Policy) String() string {
	var parts []string
	for _, t := range p.Tiers {
		every := strconv.FormatInt(t.EverySteps, 10)
		if t.EveryTime != 0 {
			every = t.EveryTime.String()
		}
		parts = append(parts, fmt.Sprintf("%s:every=%s,keep=%d", t.Tier, every, t.Keep))
	}
	return strings.Join(parts, ";")
}

// Due reports whether a newly consistent step goes to the tier, given the
// step and time of the tier's last copy (lastStep < 0: none yet).
func (t TierPolicy) Due(step, lastStep int64, lastAt, now time.Time) bool {
	if lastStep < 0 {
		return true
	}
	if step <= lastStep {
		return false
	}
	if t.EverySteps > 0 {
		return step-lastStep >= t.EverySteps
	}
	return now.Sub(lastAt) >= t.EveryTime
}

// Retain returns the steps to delete from one tier, given the steps that
// have a complete copy there (manifest written), the policy's keep and the
// job's latest consistent step. It never deletes the latest consistent
// step, and, keep being at least 1, never the tier's newest copy, so a tier
// that is the only durable home of a step keeps it; copies in memory are
// not on any tier and count for nothing here.
func Retain(onTier []int64, keep int, latestConsistent int64) []int64 {
	s := slices.Clone(onTier)
	slices.Sort(s)
	var drop []int64
	for i, step := range s {
		if len(s)-i <= max(keep, 1) {
			break // the newest keep copies stay
		}
		if step != latestConsistent {
			drop = append(drop, step)
		}
	}
	return drop
}
