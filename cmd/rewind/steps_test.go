package main

import (
	"strings"
	"testing"
)

func TestParseStepSpec(t *testing.T) {
	for in, want := range map[string]stepSpec{"7": {7, 7}, "2-5": {2, 5}, "3-3": {3, 3}} {
		if got, err := parseStepSpec(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{"5-2": "ends before", "x": "not a non-negative", "2-": "not a non-negative", "-3": "not a non-negative"} {
		if _, err := parseStepSpec(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want an error saying %q", in, err, msg)
		}
	}
}
