package chaos

import (
	"fmt"
	"sync"

	"rewind.dev/rewind/internal/demo"
)

// references are the digests of an uninterrupted run of each rank, after
// every step (demo.RankReference, computed once and extended on demand).
type references struct {
	size  int64
	mu    sync.Mutex
	ranks map[uint32]*refRank
}

type refRank struct {
	st      *demo.State
	digests []string // index: step
}

// maxRefStep bounds how far a reference is computed: a digest claimed
// for a step beyond it is judged wrong rather than computed for minutes.
const maxRefStep = 20_000

func newReferences(size int64) *references {
	return &references{size: size, ranks: map[uint32]*refRank{}}
}

// digest returns the uninterrupted run's digest of rank after step.
func (r *references) digest(rank uint32, step int64) (string, error) {
	if step < 0 || step > maxRefStep {
		return "", fmt.Errorf("chaos: step %d is outside the reference run (0 to %d)", step, maxRefStep)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rr := r.ranks[rank]
	if rr == nil {
		st, err := demo.NewRankState(r.size, rank)
		if err != nil {
			return "", err
		}
		rr = &refRank{st: st, digests: []string{st.Digest()}}
		r.ranks[rank] = rr
	}
	for int64(len(rr.digests)) <= step {
		rr.st.Step()
		rr.digests = append(rr.digests, rr.st.Digest())
	}
	return rr.digests[step], nil
}
