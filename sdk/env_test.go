package sdk

import (
	"errors"
	"testing"
)

// TestSessionFromEnv: the job, rank and world size a rank finds in its
// environment on Kubernetes (the downward API's namespace and job name
// with Open MPI's or torchrun's variables) and locally (REWIND_*).
func TestSessionFromEnv(t *testing.T) {
	type want struct {
		job             string
		rank, worldSize uint32
		invalid         bool
	}
	cases := map[string]struct {
		env  map[string]string
		want want
	}{
		"REWIND_*":               {map[string]string{"REWIND_JOB": "demo", "REWIND_RANK": "2", "REWIND_WORLD_SIZE": "4"}, want{job: "demo", rank: 2, worldSize: 4}},
		"MPIJob by downward API": {map[string]string{"REWIND_NAMESPACE": "default", "REWIND_JOB_NAME": "train", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, want{job: "default.train", rank: 3, worldSize: 4}},
		"torchrun":               {map[string]string{"REWIND_NAMESPACE": "ml", "REWIND_JOB_NAME": "llama", "RANK": "1", "WORLD_SIZE": "8"}, want{job: "ml.llama", rank: 1, worldSize: 8}},
		"REWIND_JOB wins":        {map[string]string{"REWIND_JOB": "mine", "REWIND_NAMESPACE": "ml", "REWIND_JOB_NAME": "llama", "RANK": "0", "WORLD_SIZE": "1"}, want{job: "mine", worldSize: 1}},
		"a slash is no job id":   {map[string]string{"REWIND_JOB": "default/train", "RANK": "0", "WORLD_SIZE": "1"}, want{invalid: true}},
		"bad namespace":          {map[string]string{"REWIND_NAMESPACE": "Default", "REWIND_JOB_NAME": "train", "RANK": "0", "WORLD_SIZE": "1"}, want{invalid: true}},
		"no job":                 {map[string]string{"RANK": "0", "WORLD_SIZE": "1"}, want{invalid: true}},
	}
	vars := []string{"REWIND_JOB", "REWIND_NAMESPACE", "REWIND_JOB_NAME", "REWIND_RANK", "REWIND_WORLD_SIZE",
		"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "RANK", "WORLD_SIZE"}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			for _, v := range vars {
				t.Setenv(v, tc.env[v])
			}
			s, err := (&Client{}).SessionFromEnv()
			if tc.want.invalid {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("SessionFromEnv = %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.job != tc.want.job || s.rank != tc.want.rank || s.worldSize != tc.want.worldSize {
				t.Fatalf("session %s rank %d of %d, want %s rank %d of %d", s.job, s.rank, s.worldSize, tc.want.job, tc.want.rank, tc.want.worldSize)
			}
		})
	}
}
