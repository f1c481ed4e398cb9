package kube

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSpec(t *testing.T) {
	type testcase struct {
		ann     map[string]string
		badKey  string
		replica int64 // -1: unset
		policy  string
		restore int64 // -2: no restore asked
	}
	run := func(t *testing.T, tc testcase) {
		s, err := parseSpec(tc.ann)
		if tc.badKey != "" {
			var ae *annotationError
			if !errors.As(err, &ae) || ae.Key != tc.badKey {
				t.Fatalf("parseSpec(%v) = %v, want an error naming %s", tc.ann, err, tc.badKey)
			}
			if !strings.Contains(err.Error(), tc.badKey) {
				t.Fatalf("error %q does not name the key", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		got := int64(-1)
		if s.replicas != nil {
			got = int64(*s.replicas)
		}
		if got != tc.replica || s.policy != tc.policy {
			t.Fatalf("replicas %d policy %q, want %d %q", got, s.policy, tc.replica, tc.policy)
		}
		restore := int64(-2)
		if s.restore {
			restore = s.restoreStep
		}
		if restore != tc.restore {
			t.Fatalf("restore %d, want %d", restore, tc.restore)
		}
	}
	for name, tc := range map[string]testcase{
		"nothing":        {ann: map[string]string{}, replica: -1, restore: -2},
		"all":            {ann: map[string]string{AnnReplicas: "2", AnnPolicy: "nvme:every=10,keep=2", AnnRestoreStep: "12"}, replica: 2, policy: "nvme:every=10,keep=2", restore: 12},
		"latest":         {ann: map[string]string{AnnRestoreStep: "latest"}, replica: -1, restore: -1},
		"zero replicas":  {ann: map[string]string{AnnReplicas: "0"}, replica: 0, restore: -2},
		"bad replicas":   {ann: map[string]string{AnnReplicas: "two"}, badKey: AnnReplicas},
		"many replicas":  {ann: map[string]string{AnnReplicas: "1000"}, badKey: AnnReplicas},
		"neg replicas":   {ann: map[string]string{AnnReplicas: "-1"}, badKey: AnnReplicas},
		"bad policy":     {ann: map[string]string{AnnPolicy: "floppy:every=1"}, badKey: AnnPolicy},
		"bad step":       {ann: map[string]string{AnnRestoreStep: "yesterday"}, badKey: AnnRestoreStep},
		"negative step":  {ann: map[string]string{AnnRestoreStep: "-3"}, badKey: AnnRestoreStep},
		"spaces in step": {ann: map[string]string{AnnRestoreStep: " 7 "}, replica: -1, restore: 7},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

// FuzzParseSpec: annotations are outside bytes; parsing never panics and
// an accepted value round-trips to what was asked.
func FuzzParseSpec(f *testing.F) {
	f.Add("1", "nvme:every=10,keep=2", "latest")
	f.Add("x", ";;", "-1")
	f.Fuzz(func(t *testing.T, replicas, policy, step string) {
		s, err := parseSpec(map[string]string{AnnReplicas: replicas, AnnPolicy: policy, AnnRestoreStep: step})
		if err == nil && (s.replicas == nil || !s.restore || s.policy != policy) {
			t.Fatalf("accepted %q %q %q as %+v", replicas, policy, step, s)
		}
	})
}
