package helm

import (
	"encoding/json"
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// seriesGolden lists every series name the chart's alerts and dashboard read, as the
// PromQL parser finds them. internal/app's TestSignals checks each against a real
// scrape of a running server, so an alert on a series space-api does not export (a
// renamed metric, a typo) fails the tests. Regenerate it with
// `go test ./deploy/helm -run TestMonitoring -update` after changing a query.
const seriesGolden = "testdata/monitoring-series.txt"

var update = flag.Bool("update", false, "rewrite "+seriesGolden)

// operationsDoc is where every alert and every series the chart reads is explained to
// the operator: the alert table (its severity and what to do) and the series table.
const operationsDoc = "../../docs/operations.md"

// prometheusRule is the part of prometheus-operator's monitoring.coreos.com/v1
// PrometheusRule the chart renders, decoded strictly like serviceMonitor.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval,omitempty"`
			Rules    []struct {
				Alert       string            `json:"alert,omitempty"`
				Record      string            `json:"record,omitempty"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// dashboard is the part of a Grafana dashboard the test reads: its panels' ids,
// places and queries.
type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		ID      int     `json:"id"`
		Type    string  `json:"type"`
		Title   string  `json:"title"`
		GridPos gridPos `json:"gridPos"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// gridPos is a panel's place on Grafana's grid, 24 columns wide.
type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

func (a gridPos) overlaps(b gridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// documented reads docs/operations.md's alert table (each alert's severity) and the
// series named in the first column of its series table.
func documented(t *testing.T) (alerts map[string]string, series map[string]bool) {
	t.Helper()
	b, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	alerts = map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(\\w+)` \\((\\w+)\\) \\|").FindAllStringSubmatch(doc, -1) {
		alerts[m[1]] = m[2]
	}
	series = map[string]bool{}
	_, table, _ := strings.Cut(doc, "## The series")
	table, _, _ = strings.Cut(table, "\n## ")
	for _, row := range regexp.MustCompile(`(?m)^\| ([^|]+) \|`).FindAllStringSubmatch(table, -1) {
		for _, span := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(row[1], -1) {
			series[span[1]] = true
		}
	}
	return alerts, series
}

// grafanaVariables are replaced by sample values before a dashboard query is parsed:
// Grafana expands them before Prometheus sees the query.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$namespace", "space-system", "$job", ".+")

// parseQuery parses one PromQL expression and returns the series names it reads and
// its vector selectors.
func parseQuery(t *testing.T, where, expr string) ([]string, []*parser.VectorSelector) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", where, expr, err)
		return nil, nil
	}
	var names []string
	var selectors []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			selectors = append(selectors, vs)
			if vs.Name == "" {
				t.Errorf("%s: a selector without a metric name in %q", where, expr)
			}
			names = append(names, vs.Name)
		}
		return nil
	})
	return names, selectors
}

// hasMatcher reports whether vs matches name=value exactly.
func hasMatcher(vs *parser.VectorSelector, name, value string, typ labels.MatchType) bool {
	return slices.ContainsFunc(vs.LabelMatchers, func(m *labels.Matcher) bool {
		return m.Name == name && m.Value == value && m.Type == typ
	})
}

func TestMonitoring(t *testing.T) {
	t.Parallel()
	ms := render(t, "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true",
		"--set", "prometheusRule.labels.release=kube-prometheus-stack")
	used := map[string]bool{}
	severity := map[string]string{} // by alert

	t.Run("every alert parses, selects this release's series only, and says what it means", func(t *testing.T) {
		rule := get[*prometheusRule](t, ms, "PrometheusRule", "")
		if rule.Labels["release"] != "kube-prometheus-stack" || rule.Namespace != namespace {
			t.Errorf("PrometheusRule labels %v namespace %q", rule.Labels, rule.Namespace)
		}
		var alerts []string
		for _, g := range rule.Spec.Groups {
			for _, r := range g.Rules {
				alerts = append(alerts, r.Alert)
				severity[r.Alert] = r.Labels["severity"]
				names, selectors := parseQuery(t, r.Alert, r.Expr)
				for _, n := range names {
					used[n] = true
				}
				for _, vs := range selectors {
					if !hasMatcher(vs, "namespace", namespace, labels.MatchEqual) || !hasMatcher(vs, "job", release+"-space-api-internal", labels.MatchEqual) {
						t.Errorf("%s: %s reads every release's series, not this one's", r.Alert, vs)
					}
				}
				if r.For != "" {
					if _, err := model.ParseDuration(r.For); err != nil {
						t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
					}
				}
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("%s: needs a severity, a summary and a description: %+v %+v", r.Alert, r.Labels, r.Annotations)
				}
			}
		}
		for _, want := range []string{"SpaceAdmissionFailingOpen", "SpaceClusterBucketExhausted", "SpaceQueuedOperationTooOld",
			"SpaceQueueOneKeyFarBehind", "SpaceTierHeldBelowItsReserve", "SpacePoolBelowTarget", "SpaceConfigReloadFailed", "SpaceReplicaNotReady",
			"SpaceLifecycleActionsFailing"} {
			if !slices.Contains(alerts, want) {
				t.Errorf("no %s alert among %v", want, alerts)
			}
		}
	})

	t.Run("the dashboard is a ConfigMap for the sidecar whose every query parses and selects the chosen release", func(t *testing.T) {
		cm := get[*corev1.ConfigMap](t, ms, "ConfigMap", release+"-space-api-dashboard")
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("dashboard labels %v, want the sidecar's grafana_dashboard=1", cm.Labels)
		}
		var d dashboard
		dec := json.NewDecoder(strings.NewReader(cm.Data["space-api.json"]))
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("space-api.json: %v", err)
		}
		queries := 0
		ids := map[int]string{}
		var rows []string
		for i, p := range d.Panels {
			if other, ok := ids[p.ID]; ok {
				t.Errorf("%s: id %d is %s's too", p.Title, p.ID, other)
			}
			ids[p.ID] = p.Title
			if g := p.GridPos; g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 || g.Y < 0 {
				t.Errorf("%s: gridPos %+v is not on a 24-column grid", p.Title, g)
			}
			for _, q := range d.Panels[:i] {
				if p.GridPos.overlaps(q.GridPos) {
					t.Errorf("%s (gridPos %+v) overlaps %s (%+v)", p.Title, p.GridPos, q.Title, q.GridPos)
				}
			}
			if p.Type == "row" {
				rows = append(rows, p.Title)
			}
			for _, tg := range p.Targets {
				queries++
				names, selectors := parseQuery(t, p.Title, grafanaVariables.Replace(tg.Expr))
				for _, n := range names {
					used[n] = true
				}
				for _, vs := range selectors {
					if !hasMatcher(vs, "namespace", "space-system", labels.MatchEqual) || !hasMatcher(vs, "job", ".+", labels.MatchRegexp) {
						t.Errorf("%s: %s does not select by the namespace and job variables", p.Title, vs)
					}
				}
			}
		}
		if d.UID == "" || queries < 20 {
			t.Errorf("dashboard uid %q with %d queries", d.UID, queries)
		}
		if want := []string{"Create path", "Admission buckets", "Warm pool", "Queue", "Errors and health", "Tiers", "Lifecycle"}; !slices.Equal(rows, want) {
			t.Errorf("dashboard rows %q, want %q", rows, want)
		}
	})

	t.Run("every alert and every series they read is documented for the operator", func(t *testing.T) {
		alerts, series := documented(t)
		if len(severity) == 0 || len(series) < 20 {
			t.Fatalf("nothing to compare: %d alerts rendered, %d series documented", len(severity), len(series))
		}
		for alert, sev := range severity {
			switch doc, ok := alerts[alert]; {
			case !ok:
				t.Errorf("%s has no row in %s's alert table (what it means, what to do)", alert, operationsDoc)
			case doc != sev:
				t.Errorf("%s is %s in the chart, %s in %s", alert, sev, doc, operationsDoc)
			}
		}
		for alert := range alerts {
			if _, ok := severity[alert]; !ok {
				t.Errorf("%s documents %s, which the chart does not render", operationsDoc, alert)
			}
		}
		for name := range used {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
			if name != "up" && !series[base] {
				t.Errorf("the chart reads %s, which %s's series table does not list", base, operationsDoc)
			}
		}
	})

	t.Run("the series they read are the ones the scrape test checks", func(t *testing.T) {
		if t.Failed() || len(used) == 0 {
			t.Fatal("nothing to compare: the rules or the dashboard did not parse")
		}
		var names []string
		for n := range used {
			names = append(names, n)
		}
		slices.Sort(names)
		want := strings.Join(names, "\n") + "\n"
		if *update {
			if err := os.WriteFile(seriesGolden, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(seriesGolden)
		if err != nil || string(got) != want {
			t.Fatalf("%s is out of date (%v): run go test ./deploy/helm -run TestMonitoring -update\nwant:\n%s", seriesGolden, err, want)
		}
	})

	t.Run("off by default", func(t *testing.T) {
		def := render(t)
		if n := len(def.all("PrometheusRule")); n != 0 {
			t.Errorf("%d PrometheusRules rendered by default", n)
		}
		for _, d := range def.all("ConfigMap") {
			if strings.HasSuffix(d.name, "-dashboard") {
				t.Errorf("dashboard %s rendered by default", d.name)
			}
		}
	})
}
