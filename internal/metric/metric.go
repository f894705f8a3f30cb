// Package metric is what every component of space-api shares about its Prometheus
// series: one way to register them.
package metric

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns it, or returns the collector already
// registered under the same description, so that two components built on one registry
// (two Admitters in a test, a restarted component) share their series instead of
// failing. With a nil reg, c is returned unregistered.
//
// A conflicting registration (the same name with other labels or help) is a bug of
// the wiring that the tests of /metrics catch; c is then returned unregistered, still
// counting, rather than stopping the service over a metric.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
