// Package promtest reads a Prometheus registry in tests: every sample as
// one map, keyed as the exposition format names it.
package promtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Samples returns every sample of reg as `name{label="value",...}` (just
// the name when it has no labels) -> value; a histogram's as its _sum
// and _count.
func Samples(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var ls []string
			for _, l := range m.Label {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := func(suffix string) string {
				if len(ls) == 0 {
					return mf.GetName() + suffix
				}
				return mf.GetName() + suffix + "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.Gauge != nil:
				out[key("")] = m.Gauge.GetValue()
			case m.Counter != nil:
				out[key("")] = m.Counter.GetValue()
			case m.Histogram != nil:
				out[key("_sum")] = m.Histogram.GetSampleSum()
				out[key("_count")] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}
