package coordinator

import (
	"maps"
	"testing"
)

func TestShrinkPlacement(t *testing.T) {
	two := map[uint32]string{0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
	for _, tc := range []struct {
		name    string
		down    []string
		spares  []string
		want    map[uint32]string
		shrinks bool
	}{
		{"a lost node, no spare: its ranks dropped, the rest numbered anew", []string{"b"}, nil,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c"}, true},
		{"the first node lost", []string{"a"}, nil, map[uint32]string{0: "b", 1: "b", 2: "c", 3: "c"}, true},
		{"a spare takes the lost node whole: no shrink", []string{"b"}, []string{"d"}, nil, false},
		{"two lost, one spare: the first goes to the spare, the second is dropped", []string{"a", "c"}, []string{"d"},
			map[uint32]string{0: "d", 1: "d", 2: "b", 3: "b"}, true},
		{"nothing lost", nil, nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			down := func(n string) bool {
				for _, d := range tc.down {
					if d == n {
						return true
					}
				}
				return false
			}
			got, ok := shrinkPlacement(two, down, tc.spares)
			if ok != tc.shrinks || !maps.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v %v", got, ok, tc.want, tc.shrinks)
			}
		})
	}
}
