package config

import (
	"bufio"
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/store"
)

func TestDefaultsAreTheDocumentedValues(t *testing.T) {
	t.Parallel()
	want := Config{
		HTTPAddr:          ":8080",
		InternalHTTPAddr:  ":8081",
		LogLevel:          "info",
		ShutdownTimeout:   25 * time.Second,
		IdempotencyKeyTTL: 24 * time.Hour,
		Auth:              Auth{Mode: AuthAPIKey, FailureRate: space.Rate{RefillRPS: 0.2, Burst: 20}},
		Redis:             Redis{Mode: RedisAuto, Timeout: 100 * time.Millisecond, PipelineAbove: 8, BatchAbove: 8, KeyPrefix: "space"},
		Admission: Admission{
			Enabled:            true,
			Cluster:            space.Rate{RefillRPS: 100, Burst: 200},
			FailureMode:        FailOpen,
			RefusalCacheMaxAge: time.Second,
			RefusalPace:        10 * time.Millisecond,
		},
		Flags: Flags{PollInterval: 2 * time.Second},
		Sandbox: Sandbox{
			Substrate:             "simulated",
			TemplatesPollInterval: 2 * time.Second,
			MaxShape:              space.Shape{CPUMillis: 16000, MemoryMiB: 65536, DiskGiB: 100},
			MaxBodyBytes:          64 << 10,
		},
		Pool:              Pool{RefillReserve: 0.2},
		Dispatcher:        Dispatcher{Workers: 10, AdmissionDeadline: 10 * time.Minute, MaxSnooze: time.Minute, MaxAttempts: 5, OwnerLanes: 4},
		Reconcile:         Reconcile{Interval: 10 * time.Second, Grace: 30 * time.Second},
		Lifecycle:         Lifecycle{Interval: 5 * time.Second},
		Retention:         Retention{Sandboxes: 168 * time.Hour, Operations: 168 * time.Hour},
		MetricsBudgetKeys: 100,
		Overload:          Overload{MaxInFlight: 32, MaxQueued: 1024, MaxQueuedPerClient: 32, MaxQueueWait: time.Second, MaxConnections: 10000},
		Kubernetes:        Kubernetes{ReadyTimeout: 2 * time.Minute, QPS: 50, Burst: 100, MountPath: "/workspace"},
	}
	if got := Default(); !reflect.DeepEqual(got, want) {
		t.Errorf("Default() =\n%+v\nwant\n%+v", got, want)
	}
}

// The coalescing thresholds' defaults are declared as text (config cannot import
// admission): they must be the admission package's constants. (Their 0 loads as 0,
// TestLoad, which admission's options take to mean never as the variables do.)
func TestCoalescingDefaultsAreAdmissions(t *testing.T) {
	t.Parallel()
	d := Default().Redis
	if d.PipelineAbove != admission.DefaultPipelineAbove || d.BatchAbove != admission.DefaultBatchAbove {
		t.Fatalf("SPACE_REDIS_PIPELINE_ABOVE and SPACE_REDIS_BATCH_ABOVE default to %d and %d, admission's defaults are %d and %d",
			d.PipelineAbove, d.BatchAbove, admission.DefaultPipelineAbove, admission.DefaultBatchAbove)
	}
}

// The overload gate's seats are as many as the Postgres pool's connections by default
// (DefaultMaxInFlight says why).
func TestSeatsAreThePoolsConnections(t *testing.T) {
	t.Parallel()
	if DefaultMaxInFlight != store.DefaultMaxConns {
		t.Fatalf("SPACE_MAX_IN_FLIGHT defaults to %d, the Postgres pool to %d connections", DefaultMaxInFlight, store.DefaultMaxConns)
	}
}

func TestLoadWithOnlyTheRequiredVariablesIsDefault(t *testing.T) {
	t.Parallel()
	got, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.DatabaseURL = "postgres://u@127.0.0.1:5432/space"
	want.Sandbox.TemplatesFile = "/etc/space/templates.json"
	want.Redis.Addrs = []string{"127.0.0.1:6379"}
	want.Redis.From.Addrs = EnvRedisAddrs
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load =\n%+v\nwant\n%+v", got, want)
	}
}

func TestEveryVariableIsDeclaredOnceWithOneLineOfHelp(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, v := range Vars() {
		switch {
		case seen[v.Name]:
			t.Errorf("%s is declared twice", v.Name)
		case v.Group == "":
			t.Errorf("%s has no group", v.Name)
		case v.Help == "" || strings.Contains(v.Help, "\n"):
			t.Errorf("%s: help %q, want one line", v.Name, v.Help)
		case v.Default != "" && (v.Required != "" || v.Unset != ""):
			t.Errorf("%s has a default and says what unset means", v.Name)
		case v.Required != "" && v.Unset != "":
			t.Errorf("%s is required and says what unset means", v.Name)
		}
		seen[v.Name] = true
	}
	for _, name := range []string{EnvDatabaseURL, EnvLogLevel, EnvRedisURL, EnvRedisAddrs, EnvRedisMode, EnvRedisUsername,
		EnvRedisPassword, EnvRedisPasswordFile, EnvRedisTLS, EnvRedisTLSCAFile, EnvRedisTLSServerName, EnvKubernetesNamespace} {
		if !seen[name] {
			t.Errorf("the name constant %s is not declared", name)
		}
	}
}

func TestSettingAVariableToItsDefaultChangesNothing(t *testing.T) {
	t.Parallel()
	want, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range Vars() {
		if v.Default == "" {
			continue
		}
		got, err := Load(env(map[string]string{v.Name: v.Default}))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s=%s: %v, and the configuration differs from the unset one: %v", v.Name, v.Default, err, !reflect.DeepEqual(got, want))
		}
	}
}

func TestTheEnvFileOfConfigLoadsBackToTheDefaults(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := WriteEnv(&out); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("line %q is neither a comment nor NAME=value", line)
		}
		vars[name] = value
	}
	for _, v := range Vars() {
		if _, ok := vars[v.Name]; !ok && (v.Default != "" || v.Required != "") {
			t.Errorf("%s is not in the env file", v.Name)
		}
	}
	vars[EnvDatabaseURL] = "postgres://u@h/db"
	vars["SPACE_TEMPLATES_FILE"] = "/t.json"
	vars[EnvRedisAddrs] = "r:6379"
	got, err := Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.DatabaseURL, want.Sandbox.TemplatesFile = "postgres://u@h/db", "/t.json"
	want.Redis.Addrs, want.Redis.From.Addrs = []string{"r:6379"}, EnvRedisAddrs
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the env file loads to\n%+v\nwant the defaults\n%+v", got, want)
	}
}

func TestLoadDatabaseReadsNothingElse(t *testing.T) {
	t.Parallel()
	c, err := LoadDatabase(func(k string) string {
		return map[string]string{
			EnvDatabaseURL:                "postgres://u@h/db",
			EnvRedisMode:                  "sentinel",
			EnvKubernetesNamespace:        "Not_A_Namespace",
			"SPACE_DISPATCHER_WORKERS":    "-1",
			"SPACE_REFUSAL_CACHE_MAX_AGE": "soon",
		}[k]
	})
	if err != nil {
		t.Fatalf("LoadDatabase = %v, want the other variables left unread", err)
	}
	want := Default()
	want.DatabaseURL = "postgres://u@h/db"
	if !reflect.DeepEqual(c, want) {
		t.Errorf("LoadDatabase =\n%+v\nwant the defaults and the URL\n%+v", c, want)
	}
}

func TestRefusalCacheMaxAgeOfZeroTurnsItOff(t *testing.T) {
	t.Parallel()
	c, err := Load(env(map[string]string{"SPACE_REFUSAL_CACHE_MAX_AGE": "0"}))
	if err != nil || c.Admission.RefusalCacheMaxAge != 0 {
		t.Fatalf("SPACE_REFUSAL_CACHE_MAX_AGE=0: %v, %v; want 0 accepted", c.Admission.RefusalCacheMaxAge, err)
	}
	c, err = Load(env(map[string]string{"SPACE_REFUSAL_CACHE_MAX_AGE": "250ms"}))
	if err != nil || c.Admission.RefusalCacheMaxAge != 250*time.Millisecond {
		t.Fatalf("SPACE_REFUSAL_CACHE_MAX_AGE=250ms: %v, %v", c.Admission.RefusalCacheMaxAge, err)
	}
	_, err = Load(env(map[string]string{"SPACE_REFUSAL_CACHE_MAX_AGE": "-1s"}))
	var ve *VarError
	if !errors.As(err, &ve) || ve.Var != "SPACE_REFUSAL_CACHE_MAX_AGE" || !strings.Contains(err.Error(), ">= 0") {
		t.Fatalf("SPACE_REFUSAL_CACHE_MAX_AGE=-1s: %v, want an error naming it", err)
	}
}

func TestRefusalPace(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, value string
		want        time.Duration
	}{
		{"0 answers every refusal at once", "0", 0},
		{"a pace is read as a Go duration", "25ms", 25 * time.Millisecond},
		{"a second is the longest pace", "1s", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Load(env(map[string]string{"SPACE_REFUSAL_PACE": tc.value}))
			if err != nil || c.Admission.RefusalPace != tc.want {
				t.Fatalf("SPACE_REFUSAL_PACE=%s: %v, %v; want %v", tc.value, c.Admission.RefusalPace, err, tc.want)
			}
		})
	}
	for _, bad := range []string{"-1ms", "1001ms", "fast"} {
		t.Run("a pace of "+bad+" is an error naming the variable", func(t *testing.T) {
			t.Parallel()
			_, err := Load(env(map[string]string{"SPACE_REFUSAL_PACE": bad}))
			var ve *VarError
			if !errors.As(err, &ve) || ve.Var != "SPACE_REFUSAL_PACE" || !strings.Contains(err.Error(), "from 0 to 1s") {
				t.Fatalf("SPACE_REFUSAL_PACE=%s: %v, want an error naming it", bad, err)
			}
		})
	}
}

func TestLoadKubernetes(t *testing.T) {
	t.Parallel()

	t.Run("the variables are read", func(t *testing.T) {
		t.Parallel()
		c, err := Load(env(map[string]string{
			EnvKubernetesNamespace:                        "sandboxes",
			"SPACE_KUBERNETES_READY_TIMEOUT":              "90s",
			"SPACE_KUBERNETES_CLIENT_QPS":                 "12.5",
			"SPACE_KUBERNETES_CLIENT_BURST":               "30",
			"KUBECONFIG":                                  " /a/config:/b/config ",
			"SPACE_KUBERNETES_STORAGE_CLASS":              "fast.ssd",
			"SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS":      "csi",
			"SPACE_KUBERNETES_VOLUME_MOUNT_PATH":          "/home/user",
			"SPACE_KUBERNETES_SOFT_BREACH_PRIORITY_CLASS": "degradable",
		}))
		if err != nil {
			t.Fatal(err)
		}
		want := Kubernetes{Namespace: "sandboxes", ReadyTimeout: 90 * time.Second, QPS: 12.5, Burst: 30, Kubeconfig: "/a/config:/b/config",
			StorageClass: "fast.ssd", SnapshotClass: "csi", MountPath: "/home/user", SoftBreachPriorityClass: "degradable"}
		if c.Kubernetes != want {
			t.Errorf("kubernetes = %+v, want %+v", c.Kubernetes, want)
		}
	})

	for name, value := range map[string]string{
		EnvKubernetesNamespace:           "Sandboxes!",
		"SPACE_KUBERNETES_READY_TIMEOUT": "soon",
		"SPACE_KUBERNETES_CLIENT_QPS":    "0",
		"SPACE_KUBERNETES_CLIENT_BURST":  "1.5",
	} {
		t.Run(name+"="+value+" is refused naming it", func(t *testing.T) {
			t.Parallel()
			_, err := Load(env(map[string]string{name: value}))
			var ve *VarError
			if !errors.As(err, &ve) || ve.Var != name || ve.Value != value {
				t.Errorf("err = %v, want a VarError naming %s and %q", err, name, value)
			}
		})
	}
}
