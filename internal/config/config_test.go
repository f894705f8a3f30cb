package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
)

// env builds a getenv from the required variables plus overrides.
func env(overrides map[string]string) func(string) string {
	vars := map[string]string{
		"SPACE_DATABASE_URL":   "postgres://u@127.0.0.1:5432/space",
		"SPACE_REDIS_ADDRS":    "127.0.0.1:6379",
		"SPACE_TEMPLATES_FILE": "/etc/space/templates.json",
	}
	for k, v := range overrides {
		vars[k] = v
	}
	return func(k string) string { return vars[k] }
}

func TestLoadDatabase(t *testing.T) {
	t.Parallel()
	c, err := LoadDatabase(func(k string) string {
		return map[string]string{"SPACE_DATABASE_URL": "postgres://u@h/db", "SPACE_LOG_LEVEL": "debug"}[k]
	})
	if err != nil || c.DatabaseURL != "postgres://u@h/db" || c.LogLevel != "debug" {
		t.Fatalf("LoadDatabase = %+v, %v; want the database alone, without templates or Redis", c, err)
	}
	if _, err := LoadDatabase(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "SPACE_DATABASE_URL") {
		t.Fatalf("LoadDatabase without a URL = %v, want an error naming SPACE_DATABASE_URL", err)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()

	t.Run("the required variables alone give the documented defaults", func(t *testing.T) {
		t.Parallel()
		c, err := Load(env(nil))
		if err != nil {
			t.Fatal(err)
		}
		want := Default()
		if c.HTTPAddr != ":8080" || c.InternalHTTPAddr != ":8081" {
			t.Errorf("listeners = %q, %q", c.HTTPAddr, c.InternalHTTPAddr)
		}
		if c.Redis.Timeout != 100*time.Millisecond {
			t.Errorf("redis timeout = %v, want 100ms", c.Redis.Timeout)
		}
		if c.Admission.FailureMode != FailOpen || !c.Admission.Enabled || c.Admission.Shadow {
			t.Errorf("admission = %+v, want enabled, fail open, not shadow", c.Admission)
		}
		if c.Admission.Client != nil {
			t.Errorf("client rate = %+v, want none when unset", c.Admission.Client)
		}
		if c.Admission.Cluster != want.Admission.Cluster {
			t.Errorf("cluster rate = %+v", c.Admission.Cluster)
		}
		if c.Auth.Mode != AuthAPIKey {
			t.Errorf("auth mode = %q", c.Auth.Mode)
		}
		if c.Redis.Addrs[0] != "127.0.0.1:6379" || len(c.Redis.Addrs) != 1 {
			t.Errorf("redis addrs = %v", c.Redis.Addrs)
		}
	})

	t.Run("every variable is read", func(t *testing.T) {
		t.Parallel()
		c, err := Load(env(map[string]string{
			"SPACE_HTTP_ADDR":                                      "127.0.0.1:9000",
			"SPACE_INTERNAL_HTTP_ADDR":                             "127.0.0.1:9001",
			"SPACE_AUTH_MODE":                                      "trusted_header",
			"SPACE_TRUSTED_PROXY_CIDRS":                            "10.0.0.0/8, 192.168.1.7",
			"SPACE_REDIS_ADDRS":                                    "a:7001,b:7002,c:7003",
			"SPACE_REDIS_TIMEOUT":                                  "250ms",
			"SPACE_REDIS_PIPELINE_ABOVE":                           "0",
			"SPACE_REDIS_BATCH_ABOVE":                              "5",
			"SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED":           "false",
			"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS":        "12.5",
			"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":             "30",
			"SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS": "0",
			"SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST":      "3",
			"SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE":      "closed",
			"SPACE_CLUSTER_ACTIVATION_ADMISSION_SHADOW":            "true",
			"SPACE_FLAGS_FILE":                                     "/etc/space/flags.json",
			"SPACE_FLAGS_POLL_INTERVAL":                            "5s",
			"SPACE_TEMPLATES_FILE":                                 "/etc/space/templates.json",
			"SPACE_SUBSTRATE":                                      "kubernetes",
			"SPACE_MAX_CPU_MILLIS":                                 "4000",
			"SPACE_MAX_MEMORY_MIB":                                 "8192",
			"SPACE_MAX_DISK_GIB":                                   "20",
			"SPACE_DISPATCHER_WORKERS":                             "0",
			"SPACE_DISPATCHER_ADMISSION_DEADLINE":                  "1m",
			"SPACE_DISPATCHER_MAX_SNOOZE":                          "30s",
			"SPACE_DISPATCHER_MAX_ATTEMPTS":                        "7",
		}))
		if err != nil {
			t.Fatal(err)
		}
		if c.HTTPAddr != "127.0.0.1:9000" || c.InternalHTTPAddr != "127.0.0.1:9001" {
			t.Errorf("listeners = %q, %q", c.HTTPAddr, c.InternalHTTPAddr)
		}
		wantCIDRs := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32")}
		if c.Auth.Mode != AuthTrustedHeader || len(c.Auth.TrustedProxyCIDRs) != 2 || c.Auth.TrustedProxyCIDRs[0] != wantCIDRs[0] || c.Auth.TrustedProxyCIDRs[1] != wantCIDRs[1] {
			t.Errorf("auth = %+v", c.Auth)
		}
		if len(c.Redis.Addrs) != 3 || c.Redis.Timeout != 250*time.Millisecond || c.Redis.PipelineAbove != 0 || c.Redis.BatchAbove != 5 {
			t.Errorf("redis = %+v", c.Redis)
		}
		a := c.Admission
		if a.Enabled || a.Cluster != (space.Rate{RefillRPS: 12.5, Burst: 30}) || a.Client == nil || *a.Client != (space.Rate{RefillRPS: 0, Burst: 3}) || a.FailureMode != FailClosed || !a.Shadow {
			t.Errorf("admission = %+v (client %+v)", a, a.Client)
		}
		if c.Flags.File != "/etc/space/flags.json" || c.Flags.PollInterval != 5*time.Second {
			t.Errorf("flags = %+v", c.Flags)
		}
		if c.Sandbox.Substrate != "kubernetes" || c.Sandbox.MaxShape != (space.Shape{CPUMillis: 4000, MemoryMiB: 8192, DiskGiB: 20}) || c.Sandbox.TemplatesFile != "/etc/space/templates.json" {
			t.Errorf("sandbox = %+v", c.Sandbox)
		}
		if c.Dispatcher.Workers != 0 || c.Dispatcher.AdmissionDeadline != time.Minute || c.Dispatcher.MaxSnooze != 30*time.Second || c.Dispatcher.MaxAttempts != 7 {
			t.Errorf("dispatcher = %+v", c.Dispatcher)
		}
	})

	bad := []struct {
		name, variable, value, accepts string
		extra                          map[string]string
	}{
		{"a missing database URL", "SPACE_DATABASE_URL", "", "postgres://", nil},
		{"a database URL of another scheme", "SPACE_DATABASE_URL", "mysql://x", "postgres://", nil},
		{"missing Redis addresses", "SPACE_REDIS_ADDRS", "", "host:port", nil},
		{"a missing templates file", "SPACE_TEMPLATES_FILE", "", "templates file", nil},
		{"a Redis address without a port", "SPACE_REDIS_ADDRS", "localhost", "host:port", nil},
		{"a Redis address with a word for a port", "SPACE_REDIS_ADDRS", "a:1,b:http", "numeric port", nil},
		{"a listen address without a port", "SPACE_HTTP_ADDR", "8080", "listen address", nil},
		{"a duration without a unit", "SPACE_REDIS_TIMEOUT", "100", "Go duration", nil},
		{"a negative duration", "SPACE_REDIS_TIMEOUT", "-1s", "positive Go duration", nil},
		{"a zero duration", "SPACE_FLAGS_POLL_INTERVAL", "0s", "positive Go duration", nil},
		{"a negative rate", "SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS", "-1", ">= 0", nil},
		{"a rate that is not a number", "SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS", "fast", ">= 0", nil},
		{"an infinite rate", "SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS", "+Inf", ">= 0", nil},
		{"a burst of zero", "SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST", "0", ">= 1", nil},
		{"a fractional burst", "SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST", "1.5", "integer", nil},
		{"a client rate without a client burst", "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST", "", "set together", map[string]string{"SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS": "1"}},
		{"a client burst without a client rate", "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS", "", "set together", map[string]string{"SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST": "5"}},
		{"a negative client burst", "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST", "-5", ">= 1", map[string]string{"SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS": "1"}},
		{"a boolean that is not one", "SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED", "yes please", "true or false", nil},
		{"an unknown failure mode", "SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE", "ajar", "open, closed", nil},
		{"an unknown auth mode", "SPACE_AUTH_MODE", "none", "api_key, trusted_header", nil},
		{"trusted_header without trusted proxies", "SPACE_TRUSTED_PROXY_CIDRS", "", "required when SPACE_AUTH_MODE=trusted_header", map[string]string{"SPACE_AUTH_MODE": "trusted_header"}},
		{"a CIDR that is not one", "SPACE_TRUSTED_PROXY_CIDRS", "10.0.0.0/33", "CIDRs", nil},
		{"an unknown substrate", "SPACE_SUBSTRATE", "firecracker", "simulated, kubernetes", nil},
		{"a zero shape cap", "SPACE_MAX_DISK_GIB", "0", ">= 1", nil},
		{"a negative worker count", "SPACE_DISPATCHER_WORKERS", "-2", ">= 0", nil},
		{"a negative pipeline threshold", "SPACE_REDIS_PIPELINE_ABOVE", "-1", ">= 0", nil},
		{"a negative batch threshold", "SPACE_REDIS_BATCH_ABOVE", "-1", ">= 0", nil},
		{"zero attempts", "SPACE_DISPATCHER_MAX_ATTEMPTS", "0", ">= 1", nil},
		{"an unknown log level", "SPACE_LOG_LEVEL", "loud", "debug, info", nil},
		{"a refill reserve of the whole bucket", "SPACE_POOL_REFILL_RESERVE", "1", "fraction from 0 to under 1", nil},
		{"a refill reserve in percent", "SPACE_POOL_REFILL_RESERVE", "20%", "fraction", nil},
	}
	for _, tc := range bad {
		t.Run(tc.name+" is refused naming "+tc.variable, func(t *testing.T) {
			t.Parallel()
			overrides := map[string]string{tc.variable: tc.value}
			for k, v := range tc.extra {
				overrides[k] = v
			}
			_, err := Load(env(overrides))
			var ve *VarError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a *VarError", err)
			}
			if ve.Var != tc.variable {
				t.Errorf("error names %s, want %s: %v", ve.Var, tc.variable, err)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, tc.variable) || !strings.Contains(msg, tc.accepts) {
				t.Errorf("error %q: want one line starting with %s and saying %q", msg, tc.variable, tc.accepts)
			}
		})
	}
}
