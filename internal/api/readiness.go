package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// readiness runs every check, concurrently, each within the check timeout, and returns
// the /readyz body with its status code: 503 when a dependency the replica cannot
// serve without is down or the replica is draining, otherwise 200 (degraded when a
// dependency it can serve without is down). internal adds each failure's text and
// each check's detail.
func (s *Server) readiness(ctx context.Context, internal bool) (Readiness, int) {
	res := Readiness{Status: statusOK, Checks: make(map[string]CheckResult, len(s.checks))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range s.checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, s.checkTimeout)
			defer cancel()
			cr := CheckResult{Status: statusOK}
			if internal {
				cr.Detail = c.Detail
			}
			if err := c.Check(ctx); err != nil {
				cr.Status = statusUnavailable
				if c.Degrades {
					cr.Status = statusDegraded
				}
				if internal {
					cr.Error = err.Error()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			res.Checks[c.Name] = cr
			switch cr.Status {
			case statusUnavailable:
				res.Down = append(res.Down, c.Name)
			case statusDegraded:
				res.Degraded = append(res.Degraded, c.Name)
			}
		})
	}
	wg.Wait()
	sort.Strings(res.Down)
	sort.Strings(res.Degraded)
	status := http.StatusOK
	switch {
	case len(res.Down) > 0:
		res.Status, status = statusUnavailable, http.StatusServiceUnavailable
	case s.draining.Load():
		res.Status, status = statusDraining, http.StatusServiceUnavailable
	case len(res.Degraded) > 0:
		res.Status = statusDegraded
	}
	return res, status
}

var (
	readyDesc = prometheus.NewDesc("space_ready",
		"1 when this replica's /readyz answers 200 (ready, or degraded: serving without a dependency it can do without), 0 when it answers 503. Read at scrape time.",
		nil, nil)
	dependencyDesc = prometheus.NewDesc("space_dependency_up",
		"1 when the readiness check of a dependency passes, 0 when it fails (degraded or unavailable), by dependency. Read at scrape time.",
		[]string{"dependency"}, nil)
)

// readinessCollector runs the readiness checks at scrape time. Prometheus scrapes a
// replica that is not ready too (its endpoints are discovered ready or not), so an
// alert on space_ready == 0 sees a replica that the Service has taken out.
type readinessCollector struct{ s *Server }

func (c *readinessCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- readyDesc
	ch <- dependencyDesc
}

func (c *readinessCollector) Collect(ch chan<- prometheus.Metric) {
	res, status := c.s.readiness(context.Background(), false)
	ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, boolValue(status == http.StatusOK))
	for name, cr := range res.Checks {
		ch <- prometheus.MustNewConstMetric(dependencyDesc, prometheus.GaugeValue, boolValue(cr.Status == statusOK), name)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// promLogger hands promhttp's errors (a collector that failed a scrape) to the log.
type promLogger struct{ l *slog.Logger }

func (p promLogger) Println(v ...any) {
	if p.l != nil {
		p.l.Warn("metrics scrape: a collector failed; the rest was served", "err", fmt.Sprint(v...))
	}
}
