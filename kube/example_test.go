package kube

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// The example MPIJob in deploy/examples is one the controller manages, with
// the world size its comments promise.
func TestExampleMPIJob(t *testing.T) {
	data, err := os.ReadFile("../deploy/examples/mpijob-train.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if u.GroupVersionKind().GroupVersion().String() != MPIJobs.GroupVersion().String() || u.GetKind() != "MPIJob" {
		t.Fatalf("example is a %v", u.GroupVersionKind())
	}
	if !managed(u.GetAnnotations()) {
		t.Fatal("example is not annotated for rewind")
	}
	if _, err := parseSpec(u.GetAnnotations()); err != nil {
		t.Fatal(err)
	}
	shape, err := shapeOf(u)
	if err != nil {
		t.Fatal(err)
	}
	if shape.worldSize() != 4 {
		t.Fatalf("example has %d ranks, want 4", shape.worldSize())
	}
}
