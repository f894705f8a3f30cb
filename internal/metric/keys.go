package metric

import (
	"sort"
	"sync"
)

// OtherKeys is the budget_key label of the series of every key past a Keys' bound: they
// are summed there.
const OtherKeys = "_other"

// Keys bounds the budget keys that label series, so that a replica's /metrics does not
// grow with its tenants (a platform has tens of thousands; no Prometheus takes a series
// per tenant per series): the first Max keys a counter sees keep a label of their own
// for good, the rest are counted under OtherKeys (SPACE_METRICS_BUDGET_KEYS, 100). A
// counter's series never changes label once named, so every rate() over it holds.
// Max 0 names no key: every series is the tier's alone, under OtherKeys.
type Keys struct {
	max   int
	mu    sync.RWMutex
	named map[string]bool
}

// NewKeys returns Keys naming at most max keys.
func NewKeys(max int) *Keys { return &Keys{max: max, named: map[string]bool{}} }

// Label is key's budget_key label: key itself while it is named or there is room for
// it, OtherKeys past the bound.
func (k *Keys) Label(key string) string {
	if k == nil {
		return key
	}
	k.mu.RLock()
	named, full := k.named[key], len(k.named) >= k.max
	k.mu.RUnlock()
	switch {
	case named:
		return key
	case full:
		return OtherKeys
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.named[key] || len(k.named) < k.max {
		k.named[key] = true
		return key
	}
	return OtherKeys
}

// Top is the label of each key of a gauge read whole at scrape time (a queue's depth by
// key): the max keys with the largest values keep their own, the rest OtherKeys. A
// gauge has no history to keep, so the largest now are named, whichever they are.
func Top(values map[string]float64, max int) map[string]string {
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if values[keys[i]] != values[keys[j]] {
			return values[keys[i]] > values[keys[j]]
		}
		return keys[i] < keys[j]
	})
	out := make(map[string]string, len(keys))
	for i, k := range keys {
		if i < max {
			out[k] = k
		} else {
			out[k] = OtherKeys
		}
	}
	return out
}
