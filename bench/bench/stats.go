package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Stat is one figure over several runs: the median, and the smallest and largest run
// beside it, because on a shared machine the spread says as much as the middle.
type Stat struct {
	Median, Min, Max float64
	// Runs is how many runs the figure comes from.
	Runs int
}

// summarize returns the median, min and max of values; the zero Stat for none.
func summarize(values []float64) Stat {
	if len(values) == 0 {
		return Stat{}
	}
	s := slices.Clone(values)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Stat{Median: med, Min: s[0], Max: s[n-1], Runs: n}
}

// format renders the stat as "median [min–max]" with the given verb for each number.
func (s Stat) format(verb string) string {
	if s.Runs == 0 {
		return "n/a"
	}
	if s.Runs == 1 || s.Min == s.Max {
		return fmt.Sprintf(verb, s.Median)
	}
	return fmt.Sprintf(verb+" ["+verb+"–"+verb+"]", s.Median, s.Min, s.Max)
}

// percentile returns the p-th percentile (0 < p ≤ 100) of latencies by the
// nearest-rank method; 0 for none. latencies is sorted in place.
func percentile(latencies []time.Duration, p float64) time.Duration {
	if len(latencies) == 0 {
		return 0
	}
	slices.Sort(latencies)
	rank := int(math.Ceil(p / 100 * float64(len(latencies))))
	rank = min(max(rank, 1), len(latencies))
	return latencies[rank-1]
}

// ms is a duration in milliseconds, as a float for the tables.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ratioStats returns the stat of a[i]/b[i] over the runs, each run's ratio taken
// within the run, so that drift of the machine between runs cancels.
func ratioStats(a, b []float64) Stat {
	var r []float64
	for i := range min(len(a), len(b)) {
		if b[i] != 0 {
			r = append(r, a[i]/b[i])
		}
	}
	return summarize(r)
}
