package coordinator

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// Tier copies and job policies live beside the index, each write synced
// (they change a few times per copy, not per commit):
//
//	tiercopy/<job>/<step %020d>/<tier>   a step's copy on a tier (JSON tierCopy)
//	policy/<job>                         a job's tier policy, in its text form
//	replicas/<job>                       a job's replica count

func tierCopyKey(job string, step int64, tier string) []byte {
	return []byte(fmt.Sprintf("tiercopy/%s/%020d/%s", job, step, tier))
}

func (s *Store) putTierCopy(tc *tierCopy) error {
	data, err := json.Marshal(tc)
	if err != nil {
		return err
	}
	return s.db.Set(tierCopyKey(tc.Job, tc.Step, tc.Tier), data, pebble.Sync)
}

func (s *Store) deleteTierCopy(tc *tierCopy) error {
	return s.db.Delete(tierCopyKey(tc.Job, tc.Step, tc.Tier), pebble.Sync)
}

func (s *Store) putReplicas(job string, n int) error {
	return s.db.Set([]byte("replicas/"+job), []byte(strconv.Itoa(n)), pebble.Sync)
}

func (s *Store) putPolicy(job, text string) error {
	return s.db.Set([]byte("policy/"+job), []byte(text), pebble.Sync)
}

// loadTiering reads every tier copy and policy.
func (s *Store) loadTiering() (copies []*tierCopy, policies map[string]string, replicas map[string]int, err error) {
	policies, replicas = map[string]string{}, map[string]int{}
	err = s.scan("replicas/", func(key string, val []byte) error {
		n, err := strconv.Atoi(string(val))
		replicas[strings.TrimPrefix(key, "replicas/")] = n
		return err
	})
	if err != nil {
		return nil, nil, nil, err
	}
	err = s.scan("policy/", func(key string, val []byte) error {
		policies[strings.TrimPrefix(key, "policy/")] = string(val)
		return nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	err = s.scan("tiercopy/", func(key string, val []byte) error {
		var tc tierCopy
		if err := json.Unmarshal(val, &tc); err != nil {
			return fmt.Errorf("coordinator: loading %q: %w", key, err)
		}
		copies = append(copies, &tc)
		return nil
	})
	return copies, policies, replicas, err
}

// scan calls f for every key under prefix, in order.
func (s *Store) scan(prefix string, f func(key string, val []byte) error) error {
	upper := []byte(prefix)
	upper[len(upper)-1]++
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte(prefix), UpperBound: upper})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		if err := f(string(it.Key()), it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}
