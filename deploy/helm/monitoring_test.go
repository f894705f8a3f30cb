package helm

import (
	"encoding/json"
	"flag"
	"os"
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
// PromQL parser finds them. cmd/space-api's TestSignals checks each against a real
// scrape of a running server, so an alert on a series space-api does not export (a
// renamed metric, a typo) fails the tests. Regenerate it with
// `go test ./deploy/helm -run TestMonitoring -update` after changing a query.
const seriesGolden = "testdata/monitoring-series.txt"

var update = flag.Bool("update", false, "rewrite "+seriesGolden)

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

// dashboard is the part of a Grafana dashboard the test reads: its panels' queries.
type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
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

	t.Run("every alert parses, selects this release's series only, and says what it means", func(t *testing.T) {
		rule := get[*prometheusRule](t, ms, "PrometheusRule", "")
		if rule.Labels["release"] != "kube-prometheus-stack" || rule.Namespace != namespace {
			t.Errorf("PrometheusRule labels %v namespace %q", rule.Labels, rule.Namespace)
		}
		var alerts []string
		for _, g := range rule.Spec.Groups {
			for _, r := range g.Rules {
				alerts = append(alerts, r.Alert)
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
			"SpaceQueueOneKeyFarBehind", "SpaceTierHeldBelowItsReserve", "SpacePoolBelowTarget", "SpaceConfigReloadFailed", "SpaceReplicaNotReady"} {
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
		for _, p := range d.Panels {
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
