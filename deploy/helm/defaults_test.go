package helm

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/config"
)

// chartOwnDefaults are the variables that the chart's default values render to
// something other than config's declared default, each on purpose: the value the
// default values render, and why. docs/kubernetes.md ("Values and the variables they
// become") lists the same. Every other variable the default values render loads to
// what config's default loads to, and one they do not render takes config's default.
var chartOwnDefaults = map[string]struct{ value, why string }{
	config.EnvDatabaseURL: {"postgres://space:space@postgresql:5432/space?sslmode=disable",
		"required, with no default: a placeholder in the chart's Secret, to replace (database.url) or to take from an existing Secret"},
	config.EnvRedisAddrs: {"redis:6379",
		"required unless SPACE_REDIS_URL is set: a placeholder in the chart's Secret (redis.addrs)"},
	"SPACE_TEMPLATES_FILE": {"/etc/space/templates/templates.json",
		"required, with no default: where the chart mounts its templates ConfigMap"},
	"SPACE_FLAGS_FILE": {"/etc/space/flags/flags.json",
		"unset, config reads no flags file: the chart mounts its flags ConfigMap there (flags.enabled)"},
	config.EnvKubernetesNamespace: {namespace,
		"unset, config takes the namespace space-api runs in: the chart names the release namespace, the same one, explicitly, as its Role for the sandbox Pods is granted there"},
}

// TestTheChartsDefaultsAreConfigsDefaults renders the chart with its default values,
// with the simulated substrate and with the kubernetes one (whose variables only it
// renders), and compares every SPACE_* variable the space-api and migrate containers
// get with config's declared default for it: both must load to the same
// configuration, so that values.yaml never holds a default of its own by accident. A
// deliberate difference is listed in chartOwnDefaults, with its reason.
func TestTheChartsDefaultsAreConfigsDefaults(t *testing.T) {
	t.Parallel()
	declared := map[string]config.Var{}
	for _, v := range config.Vars() {
		declared[v.Name] = v
	}
	seen, checked := map[string]bool{}, map[string]bool{}
	for _, r := range []struct {
		args []string
		set  string // the variable args set, which is then not a default
	}{{}, {[]string{"--set", "substrate=kubernetes"}, "SPACE_SUBSTRATE"}} {
		args := r.args
		ms := render(t, args...)
		d := deployment(t, ms)
		for _, name := range []string{"space-api", "migrate"} {
			env := envOf(t, ms, container(t, d, name), nil)
			base, err := config.Load(getenv(env))
			if err != nil {
				t.Fatalf("render %v, container %s: the default values do not load: %v", args, name, err)
			}
			for _, variable := range slices.Sorted(maps.Keys(env)) {
				value := env[variable]
				if variable == r.set || checked[variable+"="+value] {
					continue // both containers and both renders share most variables
				}
				checked[variable+"="+value] = true
				seen[variable] = true
				v, ok := declared[variable]
				switch {
				case !ok:
					if strings.HasPrefix(variable, "SPACE_") {
						t.Errorf("%s=%q is rendered by the default values but config declares no such variable", variable, value)
					}
				case chartOwnDefaults[variable].why != "":
					if want := chartOwnDefaults[variable].value; value != want {
						t.Errorf("%s=%q, want %q, the value chartOwnDefaults lists for it", variable, value, want)
					}
					if v.Default != "" && loadsAlike(t, env, variable, v.Default, base) {
						t.Errorf("%s=%q loads as config's default %q: remove it from chartOwnDefaults", variable, value, v.Default)
					}
				case v.Default == "":
					t.Errorf("%s=%q is rendered by the default values, where config declares no default (%s): render nothing by default, or list it in chartOwnDefaults with the reason",
						variable, value, unsetMeaning(v))
				case !loadsAlike(t, env, variable, v.Default, base):
					t.Errorf("%s=%q by default in the chart, but config's default is %q: set the value in values.yaml to config's, or list the difference in chartOwnDefaults with the reason",
						variable, value, v.Default)
				}
			}
		}
	}
	for _, variable := range slices.Sorted(maps.Keys(chartOwnDefaults)) {
		if !seen[variable] {
			t.Errorf("chartOwnDefaults lists %s, which the default values do not render: remove it", variable)
		}
	}
}

// loadsAlike says whether env with variable set to value loads to base, the
// configuration env itself loads to.
func loadsAlike(t *testing.T, env map[string]string, variable, value string, base config.Config) bool {
	t.Helper()
	other := maps.Clone(env)
	other[variable] = value
	c, err := config.Load(getenv(other))
	if err != nil {
		t.Errorf("%s=%q (config's default) does not load beside the chart's other values: %v", variable, value, err)
		return false
	}
	return reflect.DeepEqual(c, base)
}

func unsetMeaning(v config.Var) string {
	if v.Required != "" {
		return "required: " + v.Required
	}
	return v.Unset
}

// TestLargeNumbersRenderAsConfigReadsThem sets every whole-number value to a large
// number in a values file, where YAML gives helm a float: printed as it is, it would
// read 1.234567e+06, which space-api refuses at start. (--set types whole numbers as
// integers, so it is a file here.)
func TestLargeNumbersRenderAsConfigReadsThem(t *testing.T) {
	t.Parallel()
	const n = "1234567"
	numbers := map[string]string{ // value path: the variable it renders
		"auth.failureBurst":           "SPACE_AUTH_FAILURE_BURST",
		"auth.failureRefillRps":       "SPACE_AUTH_FAILURE_REFILL_RPS",
		"admission.refillRps":         "SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS",
		"admission.burst":             "SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST",
		"admission.clientRefillRps":   "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS",
		"admission.clientBurst":       "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST",
		"metrics.budgetKeys":          "SPACE_METRICS_BUDGET_KEYS",
		"overload.maxInFlight":        "SPACE_MAX_IN_FLIGHT",
		"overload.maxQueued":          "SPACE_MAX_QUEUED",
		"overload.maxQueuedPerClient": "SPACE_MAX_QUEUED_PER_CLIENT",
		"overload.maxConnections":     "SPACE_MAX_CONNECTIONS",
		"kubernetes.clientQps":        "SPACE_KUBERNETES_CLIENT_QPS",
		"kubernetes.clientBurst":      "SPACE_KUBERNETES_CLIENT_BURST",
		"limits.maxCpuMillis":         "SPACE_MAX_CPU_MILLIS",
		"limits.maxMemoryMib":         "SPACE_MAX_MEMORY_MIB",
		"limits.maxDiskGib":           "SPACE_MAX_DISK_GIB",
		"limits.maxBodyBytes":         "SPACE_MAX_BODY_BYTES",
		"dispatcher.workers":          "SPACE_DISPATCHER_WORKERS",
		"dispatcher.ownerLanes":       "SPACE_DISPATCHER_OWNER_LANES",
		"dispatcher.maxAttempts":      "SPACE_DISPATCHER_MAX_ATTEMPTS",
	}
	sections := map[string][]string{}
	for path := range numbers {
		section, key, _ := strings.Cut(path, ".")
		sections[section] = append(sections[section], "  "+key+": "+n)
	}
	body := "substrate: kubernetes\n"
	for _, section := range slices.Sorted(maps.Keys(sections)) {
		body += section + ":\n" + strings.Join(sections[section], "\n") + "\n"
	}
	ms := render(t, "-f", values(t, body))
	env := envOf(t, ms, container(t, deployment(t, ms), "space-api"), nil)
	for _, path := range slices.Sorted(maps.Keys(numbers)) {
		if got := env[numbers[path]]; got != n {
			t.Errorf("%s: %s=%q, want %s", path, numbers[path], got, n)
		}
	}
	if _, err := config.Load(getenv(env)); err != nil {
		t.Errorf("the rendered env does not load: %v", err)
	}
}
