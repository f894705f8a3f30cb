package kubeenv

import (
	"context"
	"fmt"
	"regexp"
	"strings"
)

// Counters are the API server's own counts of what it served, read from its /metrics
// at one moment: a test or the bench reads them before and after what it measures.
type Counters struct {
	// Requests is apiserver_request_total summed by "verb resource[/subresource]"
	// (every client's).
	Requests map[string]float64
	// Dispatched and Rejected are its priority and fairness counts, summed over every
	// priority level and reason: apiserver_flowcontrol_dispatched_requests_total, the
	// requests it served through its queues, and
	// apiserver_flowcontrol_rejected_requests_total, those it refused with a 429 for
	// want of seats. A counter the server never incremented has no sample: 0.
	Dispatched, Rejected float64
}

var (
	counterSample = regexp.MustCompile(`^(apiserver_request_total|apiserver_flowcontrol_dispatched_requests_total|apiserver_flowcontrol_rejected_requests_total)\{([^}]*)\} ([0-9.e+]+)$`)
	labelPair     = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// Counters reads the API server's Counters. It fails when the server dispatched nothing
// through priority and fairness (it is off), so that its rejections are never
// reported as none when nothing could have counted them.
func (s *Server) Counters(ctx context.Context) (Counters, error) {
	out := Counters{Requests: map[string]float64{}}
	body, err := s.Clientset.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return out, fmt.Errorf("the API server's metrics: %w", err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		m := counterSample.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(m[3], &v); err != nil {
			continue
		}
		switch m[1] {
		case "apiserver_flowcontrol_dispatched_requests_total":
			out.Dispatched += v
			continue
		case "apiserver_flowcontrol_rejected_requests_total":
			out.Rejected += v
			continue
		}
		labels := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[p[1]] = p[2]
		}
		res := labels["resource"]
		if labels["subresource"] != "" {
			res += "/" + labels["subresource"]
		}
		out.Requests[labels["verb"]+" "+res] += v
	}
	if len(out.Requests) == 0 {
		return out, fmt.Errorf("no apiserver_request_total in the API server's metrics")
	}
	if out.Dispatched == 0 {
		return out, fmt.Errorf("the API server dispatched no request through priority and fairness (apiserver_flowcontrol_dispatched_requests_total): is it off?")
	}
	return out, nil
}
