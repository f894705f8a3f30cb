package metric

import "sync"

// Bound holds a vector's series, each bound once (WithLabelValues) at its first use
// and kept under a key of its labels: a label lookup validates, hashes and compares
// every value, and a series counted at each request or refusal would pay it each time.
// Its keys are never deleted, so K must be bounded, as the series are (routes, tiers,
// fixed names).
type Bound[K comparable, V any] struct {
	bind func(K) V
	m    sync.Map // K -> V
}

// NewBound returns a Bound whose series of key k is bind(k), called at k's first use.
func NewBound[K comparable, V any](bind func(K) V) *Bound[K, V] {
	return &Bound[K, V]{bind: bind}
}

// Of is k's series, bound at its first use. Two goroutines that meet k first at once
// may both bind it; one result is kept, and both are the same series of the vector.
func (b *Bound[K, V]) Of(k K) V {
	if v, ok := b.m.Load(k); ok {
		return v.(V)
	}
	v, _ := b.m.LoadOrStore(k, b.bind(k))
	return v.(V)
}
