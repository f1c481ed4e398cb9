package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// The coordinator's index is not the only record of the tier copies: each
// copy has its manifest on its store. A coordinator started on an empty
// or lost store asks the agents what their tiers hold (TierCopies) and
// rebuilds its tier copies from the manifests (docs/design/20261121_tiers.md,
// "Rediscovery").

const (
	// defaultMaxListedManifests bounds one tier's listing: retention keeps
	// a few copies per job, so this is thousands of jobs' worth.
	defaultMaxListedManifests = 1 << 16
	// defaultMaxListedSteps bounds the steps listed per job and tier,
	// newest first: more than any retention policy keeps.
	defaultMaxListedSteps = 1024
	// manifestReaders is how many manifests are read at once: an object
	// store answers each read in milliseconds, and one at a time would
	// make a large listing take minutes.
	manifestReaders = 8
	// listProgressEvery is how often (in manifests) a listing logs how far
	// it got.
	listProgressEvery = 1000
)

// TierListing says how the listing of one tier went.
type TierListing struct {
	Tier      tiers.Name
	Store     string
	Jobs      int
	Manifests int  // valid manifests handed to the caller
	Skipped   int  // manifests that do not decode or validate
	Truncated bool // a bound stopped the listing
	// Err is set when the tier could not be listed whole: the store
	// failed, or some manifest could not be read. The manifests handed
	// over are good; asking again later may find the rest.
	Err error
}

// ListTierCopies reads the manifests on the named tiers (every tier of
// the agent when none is named) and calls emit with each one that reads
// and validates: per tier, jobs in name order, each job's newest steps
// first, at most maxPerJob steps per job and maxManifests per tier (0:
// the defaults). A manifest that does not decode or validate is skipped
// with a log line, never handed over; one that cannot be read (the store
// failed) is skipped too, and the tier's listing then carries an error.
// emit is called from the calling goroutine, in order; its error ends the
// listing and is returned, as is the context's.
func (a *Agent) ListTierCopies(ctx context.Context, names []tiers.Name, maxManifests, maxPerJob int,
	emit func(tier tiers.Name, m *tiers.Manifest) error) ([]TierListing, error) {
	if maxManifests <= 0 {
		maxManifests = defaultMaxListedManifests
	}
	if maxPerJob <= 0 {
		maxPerJob = defaultMaxListedSteps
	}
	if len(names) == 0 {
		names = tierOrder(a.cfg.Stores)
	}
	var out []TierListing
	for _, name := range names {
		if _, err := tiers.ParseName(string(name)); err != nil {
			return nil, fmt.Errorf("%w: agent: %w", ErrInvalid, err)
		}
		st := a.cfg.Stores[name]
		if st == nil {
			out = append(out, TierListing{Tier: name, Err: fmt.Errorf("%w: agent: node %s has no tier %q", ErrNotFound, a.cfg.Node, name)})
			continue
		}
		l, err := a.listTier(ctx, name, st, maxManifests, maxPerJob, emit)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// listTier lists one tier; the error is emit's or the context's.
func (a *Agent) listTier(ctx context.Context, name tiers.Name, st tiers.Store, maxManifests, maxPerJob int,
	emit func(tier tiers.Name, m *tiers.Manifest) error) (TierListing, error) {
	l := TierListing{Tier: name, Store: st.String()}
	start := time.Now()
	jobs, err := tiers.Jobs(ctx, st)
	if err != nil {
		if ctx.Err() != nil {
			return l, ctx.Err()
		}
		l.Err = fmt.Errorf("agent: listing the jobs on %s: %w", st, err)
		a.log.Warn("listing tier copies failed", "tier", name, "store", st.String(), "err", err)
		return l, nil
	}
	l.Jobs = len(jobs)
	a.log.Info("listing tier copies", "tier", name, "store", st.String(), "jobs", len(jobs))
	var unread []error
	nextLog := listProgressEvery
	for ji, job := range jobs {
		if l.Manifests >= maxManifests {
			l.Truncated = true
			break
		}
		steps, err := tiers.Steps(ctx, st, job)
		if err != nil {
			if ctx.Err() != nil {
				return l, ctx.Err()
			}
			unread = append(unread, fmt.Errorf("listing the steps of job %s: %w", job, err))
			continue
		}
		slices.Reverse(steps) // newest first: what a bound cuts off is the oldest
		if len(steps) > maxPerJob {
			a.log.Warn("tier holds more steps of a job than a listing takes; the oldest are left out",
				"tier", name, "job", job, "steps", len(steps), "listed", maxPerJob)
			steps, l.Truncated = steps[:maxPerJob], true
		}
		for len(steps) > 0 {
			n := min(len(steps), manifestReaders, maxManifests-l.Manifests)
			if n == 0 {
				l.Truncated = true
				break
			}
			chunk := steps[:n]
			steps = steps[n:]
			mans, errs := readManifests(ctx, st, job, chunk)
			for i, m := range mans {
				switch err := errs[i]; {
				case err == nil:
					if err := emit(name, m); err != nil {
						return l, err
					}
					l.Manifests++
				case ctx.Err() != nil:
					return l, ctx.Err()
				case tiers.IsNotExist(err):
					// Deleted since it was listed: the copy is gone.
				case errors.Is(err, shm.ErrCorrupt):
					l.Skipped++
					a.log.Warn("manifest on tier skipped: it does not decode or validate; its step is not reported",
						"tier", name, "store", st.String(), "job", job, "step", chunk[i], "err", err)
				default:
					unread = append(unread, err)
					a.log.Warn("manifest on tier skipped: it could not be read", "tier", name, "store", st.String(), "job", job,
						"step", chunk[i], "err", err)
				}
			}
		}
		if l.Manifests >= nextLog {
			nextLog = l.Manifests + listProgressEvery
			a.log.Info("listing tier copies", "tier", name, "jobs_done", ji+1, "jobs", len(jobs), "manifests", l.Manifests,
				"seconds", time.Since(start).Seconds())
		}
	}
	if l.Truncated {
		a.log.Warn("tier listing stopped at its bound; older steps are not reported", "tier", name, "manifests", l.Manifests,
			"max", maxManifests, "max_per_job", maxPerJob)
	}
	if len(unread) > 0 {
		l.Err = fmt.Errorf("agent: %s: %d listings or manifests could not be read, the first: %w", st, len(unread), unread[0])
	}
	a.log.Info("tier copies listed", "tier", name, "jobs", l.Jobs, "manifests", l.Manifests, "skipped", l.Skipped,
		"truncated", l.Truncated, "unreadable", len(unread), "seconds", time.Since(start).Seconds())
	return l, nil
}

// readManifests reads the manifests of steps of job at once.
func readManifests(ctx context.Context, st tiers.Store, job string, steps []int64) ([]*tiers.Manifest, []error) {
	mans, errs := make([]*tiers.Manifest, len(steps)), make([]error, len(steps))
	var wg sync.WaitGroup
	for i, step := range steps {
		wg.Go(func() { mans[i], errs[i] = tiers.ReadManifest(ctx, st, job, step) })
	}
	wg.Wait()
	return mans, errs
}

const (
	// tierPageBytes bounds a page of TierCopies (a manifest larger than
	// this goes alone): well under gRPC's default 4 MiB message limit.
	tierPageBytes = 1 << 20
	// tierPageManifests bounds the manifests of a page, so the caller
	// merges (and logs) as the listing goes.
	tierPageManifests = 256
)

// TierCopies streams the manifests of the agent's tiers, in pages.
func (s *server) TierCopies(req *agentpb.TierCopiesRequest, stream agentpb.Agent_TierCopiesServer) error {
	page, size := &agentpb.TierCopiesPage{}, 0
	send := func() error {
		err := stream.Send(page)
		page, size = &agentpb.TierCopiesPage{}, 0
		return err
	}
	listings, err := s.a.ListTierCopies(stream.Context(), tierNames(req.Tiers), int(req.MaxManifests), int(req.MaxStepsPerJob),
		func(tier tiers.Name, m *tiers.Manifest) error {
			pm := tierManifestProto(tier, m)
			if n := proto.Size(pm); size > 0 && size+n > tierPageBytes {
				if err := send(); err != nil {
					return err
				}
			}
			page.Manifests = append(page.Manifests, pm)
			size += proto.Size(pm)
			if len(page.Manifests) >= tierPageManifests {
				return send()
			}
			return nil
		})
	if err != nil {
		return err
	}
	for _, l := range listings {
		pl := &agentpb.TierListing{Tier: string(l.Tier), Store: l.Store, Jobs: uint32(l.Jobs), Manifests: uint32(l.Manifests),
			Skipped: uint32(l.Skipped), Truncated: l.Truncated}
		if l.Err != nil {
			pl.Error = l.Err.Error()
		}
		page.Listings = append(page.Listings, pl)
	}
	return send()
}

func tierManifestProto(tier tiers.Name, m *tiers.Manifest) *agentpb.TierManifest {
	pm := &agentpb.TierManifest{Tier: string(tier), Job: m.Job, Step: m.Step, WorldSize: m.WorldSize, RanksHere: m.Here,
		Shards: make([]*agentpb.TierShard, len(m.Shards))}
	if !m.WrittenAt.IsZero() {
		pm.WrittenUnixNano = m.WrittenAt.UnixNano()
	}
	for i, e := range m.Shards {
		pm.Shards[i] = &agentpb.TierShard{Rank: e.Rank, SizeBytes: uint64(e.Size), HeaderChecksum: e.HeaderChecksum}
	}
	return pm
}
