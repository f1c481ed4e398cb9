package coordinator

import (
	"maps"
	"testing"
)

func TestGrowPlacement(t *testing.T) {
	four := map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c"}
	for _, tc := range []struct {
		name   string
		from   map[uint32]string
		spares []string
		full   uint32
		want   map[uint32]string
	}{
		{"a spare takes as many ranks as each node runs", four, []string{"b"}, 6,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c", 4: "b", 5: "b"}},
		{"no more than the full size", four, []string{"b", "d"}, 6,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c", 4: "b", 5: "b"}},
		{"two spares", four, []string{"b", "d"}, 8,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c", 4: "b", 5: "b", 6: "d", 7: "d"}},
		{"no spare", four, nil, 6, nil},
		{"uneven ranks per node: no size for a new node", map[uint32]string{0: "a", 1: "a", 2: "c"}, []string{"b"}, 6, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := growPlacement(tc.from, tc.spares, tc.full)
			if ok != (tc.want != nil) || !maps.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v", got, ok, tc.want)
			}
		})
	}
}

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
