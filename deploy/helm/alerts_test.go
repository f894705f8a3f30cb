package helm

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// TestAlertsFire evaluates the alerts that compare series with one another over
// recorded series, so that each is seen to fire when it should and to stay quiet
// otherwise: a parse cannot tell a wrong join from a right one.
func TestAlertsFire(t *testing.T) {
	t.Parallel()
	ms := render(t, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.queueBehindRatio=10",
		"--set", "prometheusRule.queueBehindSeconds=300")
	rule := get[*prometheusRule](t, ms, "PrometheusRule", "")
	expr := func(alert string) string {
		for _, g := range rule.Spec.Groups {
			for _, r := range g.Rules {
				if r.Alert == alert {
					return r.Expr
				}
			}
		}
		t.Fatalf("no alert %s", alert)
		return ""
	}
	// oldest is a queue-age series of this release's budget key at a constant age;
	// elsewhere is another release's.
	oldest := func(key string, age float64) series {
		return series{labels.FromStrings("__name__", "space_dispatcher_oldest_queued_seconds", "namespace", namespace,
			"job", release+"-space-api-internal", "budget_key", key, "kind", "create", "tier", "pro"), age, 0}
	}
	elsewhere := series{labels.FromStrings("__name__", "space_dispatcher_oldest_queued_seconds", "namespace", "elsewhere",
		"job", "other", "budget_key", "initech", "kind", "create", "tier", ""), 90000, 0}
	behind := expr("SpaceQueueOneKeyFarBehind")

	t.Run("one budget key far behind the others fires for that key alone", func(t *testing.T) {
		t.Parallel()
		got := evaluate(t, behind, oldest("acme", 1000), oldest("globex", 20), oldest("initech", 40), elsewhere)
		if len(got) != 1 || got[0].Metric.Get("budget_key") != "acme" || got[0].F != 1000 {
			t.Fatalf("fired for %v, want acme's 1000s", got)
		}
	})

	t.Run("a tier refused by the cluster bucket below its reserved rate fires; one served its reserve does not", func(t *testing.T) {
		t.Parallel()
		held := expr("SpaceTierHeldBelowItsReserve")
		ours := func(name, tier string, extra ...string) labels.Labels {
			l := append([]string{"__name__", name, "namespace", namespace, "job", release + "-space-api-internal", "tier", tier}, extra...)
			return labels.FromStrings(l...)
		}
		// Counters that grow by perSecond each second, recorded each minute.
		counter := func(l labels.Labels, perSecond float64) series {
			return series{labels: l, value: 0, slope: perSecond * 60}
		}
		refused := func(tier string) series {
			return counter(ours("space_sandbox_admission_rate_decisions_total", tier, "decision", "rejected", "bucket", "cluster_activation"), 2)
		}
		tokens := func(tier string, perSecond float64) series {
			return counter(ours("space_sandbox_admission_cluster_tokens_total", tier, "source", "reserve"), perSecond)
		}
		reserved := func(tier string, rps float64) series {
			return series{labels: ours("space_tier_reserved_rps", tier), value: rps}
		}
		got := evaluate(t, held, refused("pro"), tokens("pro", 3), reserved("pro", 10),
			refused("enterprise"), tokens("enterprise", 40), reserved("enterprise", 40),
			tokens("team", 1), reserved("team", 10))
		if len(got) != 1 || got[0].Metric.Get("tier") != "pro" {
			t.Fatalf("fired for %v, want pro alone (refused at 3/s of its 10/s)", got)
		}
	})

	t.Run("lifecycle actions failing fire for the failing action alone; old failures and another release's stay quiet", func(t *testing.T) {
		t.Parallel()
		failing := expr("SpaceLifecycleActionsFailing")
		failures := func(ns, job, action string, value, perMinute float64) series {
			return series{labels.FromStrings("__name__", "space_sandbox_lifecycle_failures_total", "namespace", ns, "job", job,
				"pod", "space-api-0", "action", action), value, perMinute}
		}
		ours := release + "-space-api-internal"
		// A pause failing once a minute (a substrate that cannot snapshot), terminations
		// that failed long ago and no more, another release's failing too.
		got := evaluate(t, failing, failures(namespace, ours, "pause", 0, 1), failures(namespace, ours, "terminate", 4, 0),
			failures("elsewhere", "other", "terminate", 0, 3))
		if len(got) != 1 || got[0].Metric.Get("action") != "pause" || got[0].F <= 0 {
			t.Fatalf("fired for %v, want this release's pause alone", got)
		}
		if got := evaluate(t, failing, failures(namespace, ours, "pause", 7, 0), failures(namespace, ours, "terminate", 0, 0)); len(got) != 0 {
			t.Fatalf("fired for %v with no failure in the window", got)
		}
	})

	for name, recorded := range map[string][]series{
		"keys behind alike":                   {oldest("acme", 1000), oldest("globex", 900)},
		"a key alone":                         {oldest("acme", 5000)},
		"a gap under the floor":               {oldest("acme", 250), oldest("globex", 2)},
		"the others with nothing queued (0s)": {oldest("acme", 1000), oldest("unknown", 0)},
	} {
		t.Run(name+" stay quiet", func(t *testing.T) {
			t.Parallel()
			if got := evaluate(t, behind, append(recorded, elsewhere)...); len(got) != 0 {
				t.Fatalf("fired for %v", got)
			}
		})
	}
}

// series is one recorded series: value at 0, growing by slope a minute.
type series struct {
	labels labels.Labels
	value  float64
	slope  float64
}

// evaluate runs expr at ten minutes into a recording of recorded (a sample a minute
// from 0) and returns what it selects.
func evaluate(t *testing.T, expr string, recorded ...series) promql.Vector {
	t.Helper()
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 100000, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})
	q := &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
		var out []storage.Series
		for _, s := range recorded {
			if slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return !m.Matches(s.labels.Get(m.Name)) }) {
				continue
			}
			var samples []chunks.Sample
			for i := range 11 {
				samples = append(samples, floatSample{t: int64(i) * time.Minute.Milliseconds(), f: s.value + float64(i)*s.slope})
			}
			out = append(out, storage.NewListSeries(s.labels, samples))
		}
		slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
		return &seriesSet{list: out, at: -1}
	}}
	query, err := engine.NewInstantQuery(context.Background(), &storage.MockQueryable{MockQuerier: q}, nil, expr, time.UnixMilli(10*time.Minute.Milliseconds()))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer query.Close()
	res := query.Exec(context.Background())
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	v, err := res.Vector()
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

type seriesSet struct {
	list []storage.Series
	at   int
}

func (s *seriesSet) Next() bool                        { s.at++; return s.at < len(s.list) }
func (s *seriesSet) At() storage.Series                { return s.list[s.at] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                      { return s.t }
func (s floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                    { return s.f }
func (s floatSample) H() *histogram.Histogram       { return nil }
func (s floatSample) FH() *histogram.FloatHistogram { return nil }
func (s floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample           { return s }
