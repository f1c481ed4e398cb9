package shm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
)

// MaxJobLen bounds a job id; it becomes a directory name.
const MaxJobLen = 128

// ValidateJob checks that a job id is safe as one path element: 1 to 128
// characters from [A-Za-z0-9._-], starting with a letter or digit (so never
// "." or ".."), and no path separator.
func ValidateJob(job string) error {
	if job == "" {
		return fmt.Errorf("shm: job id is empty")
	}
	if len(job) > MaxJobLen {
		return fmt.Errorf("shm: job id %.20q... is %d characters, the limit is %d", job, len(job), MaxJobLen)
	}
	for i := 0; i < len(job); i++ {
		c := job[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("shm: job id %q must start with a letter or digit", job)
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("shm: job id %q contains %q; allowed are letters, digits, '.', '_' and '-'", job, c)
		}
	}
	return nil
}

// MaxNodeLen bounds a node name: a DNS name, as a Kubernetes node's is.
const MaxNodeLen = 253

// ValidateNode checks a node name: 1 to 253 characters from
// [A-Za-z0-9._-], starting and ending with a letter or digit. A host name
// or a Kubernetes node name passes; the name is also one safe path
// element (never "." or "..", no '/'), as it may name files and
// directories, and it travels in logs, metrics and host:port addresses.
func ValidateNode(node string) error {
	const rule = "a node name is 1 to 253 letters, digits, '.', '_' and '-', starting and ending with a letter or digit"
	if node == "" {
		return fmt.Errorf("shm: node name is empty; %s", rule)
	}
	if len(node) > MaxNodeLen {
		return fmt.Errorf("shm: node name %.20q... is %d characters; %s", node, len(node), rule)
	}
	for i := 0; i < len(node); i++ {
		c := node[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || i == len(node)-1 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("shm: node name %q is refused: %s", node, rule)
		}
	}
	return nil
}

// KubeJobID is the job id of the Kubernetes training job (an MPIJob, a
// JobSet, a TrainJob) called name in namespace: "NAMESPACE.NAME". A
// namespace is a DNS label (no '.'), so the first '.' separates the two
// and no two jobs share an id. A pair longer than MaxJobLen keeps as much
// of the name as fits and ends in '_' and 16 hex digits of the SHA-256 of
// "NAMESPACE/NAME": Kubernetes names never hold '_', so a shortened id is
// never another job's full one. Names Kubernetes would refuse are refused
// here too (that is what makes the ids distinct). The Python SDK's
// rewind.kube_job_id is the same function; the tests of both are held to
// shm/testdata/kube_job_ids.
func KubeJobID(namespace, name string) (string, error) {
	if !kubeName(namespace, 63, false) {
		return "", fmt.Errorf("shm: namespace %q is not a Kubernetes namespace (a DNS label: 1-63 of a-z, 0-9, '-')", namespace)
	}
	if !kubeName(name, 253, true) {
		return "", fmt.Errorf("shm: job name %q is not a Kubernetes object name (a DNS subdomain: 1-253 of a-z, 0-9, '-', '.')", name)
	}
	id := namespace + "." + name
	if len(id) <= MaxJobLen {
		return id, nil
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	tail := "_" + hex.EncodeToString(sum[:8])
	keep := MaxJobLen - len(namespace) - 1 - len(tail) // at least 47: a namespace has at most 63
	return namespace + "." + name[:keep] + tail, nil
}

// kubeName reports whether s is a DNS-1123 label (dots false) or
// subdomain (dots true) of at most max characters.
func kubeName(s string, max int, dots bool) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if (i == 0 || i == len(s)-1) && !alnum {
			return false
		}
		if !alnum && c != '-' && !(dots && c == '.') {
			return false
		}
	}
	return true
}

// KubeJobFromEnv is KubeJobID of REWIND_NAMESPACE and REWIND_JOB_NAME
// (a pod gets both from the downward API: metadata.namespace and its
// job-name label); "" and no error when either is unset. Both SDKs use it
// when REWIND_JOB is not set.
func KubeJobFromEnv(getenv func(string) string) (string, error) {
	ns, name := getenv("REWIND_NAMESPACE"), getenv("REWIND_JOB_NAME")
	if ns == "" || name == "" {
		return "", nil
	}
	id, err := KubeJobID(ns, name)
	if err != nil {
		return "", fmt.Errorf("%w (from REWIND_NAMESPACE and REWIND_JOB_NAME)", err)
	}
	return id, nil
}

// Paths names the files under a shared-memory root:
//
//	<root>/<job>/rank-<r>/slot-<i>.safetensors   a segment
//	<root>/<job>/rank-<r>/slots.json             the rank's slot states
type Paths struct{ Root string }

// RankDir returns the directory of one rank of a job.
func (p Paths) RankDir(job string, rank uint32) string {
	return filepath.Join(p.Root, job, "rank-"+strconv.FormatUint(uint64(rank), 10))
}

// Segment returns the path of a slot's segment.
func (p Paths) Segment(job string, rank, slot uint32) string {
	return filepath.Join(p.RankDir(job, rank), "slot-"+strconv.FormatUint(uint64(slot), 10)+".safetensors")
}

// SlotsFile returns the path of a rank's slot state file.
func (p Paths) SlotsFile(job string, rank uint32) string {
	return filepath.Join(p.RankDir(job, rank), "slots.json")
}
