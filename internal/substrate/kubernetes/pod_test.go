package kubernetes

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/substrate"
)

func TestLabelValueKeepsValidValuesAndHashesTheOthers(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"acme", "python-3.12", "sbx_01J9ZK", "unknown", ""} {
		if got := labelValue(v); got != v {
			t.Errorf("labelValue(%q) = %q, want it unchanged", v, got)
		}
	}
	seen := map[string]string{}
	for _, v := range []string{"team/a", "team:a", "ünïcode", strings.Repeat("x", 64), strings.Repeat("x", 65), "-lead", "a b"} {
		got := labelValue(v)
		if len(got) > 63 || !validLabelValue.MatchString(got) {
			t.Errorf("labelValue(%q) = %q is not a label value", v, got)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("labelValue(%q) = labelValue(%q) = %q", v, prev, got)
		}
		seen[got] = v
	}
}

func TestPodNamesAreDNSLabelsThatNeverRepeat(t *testing.T) {
	t.Parallel()
	dns := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	for _, id := range []string{"s1", "SBX_01J9ZK", strings.Repeat("a", 200), "--", "ünï"} {
		a, b := podName("slot", id), podName("slot", id)
		if len(a) > 63 || !dns.MatchString(a) {
			t.Errorf("podName(%q) = %q is not a DNS label", id, a)
		}
		if a == b {
			t.Errorf("podName(%q) repeated %q: a restore would collide with its terminating predecessor", id, a)
		}
	}
	stem := func(name string) string { return name[:len(name)-len("-xxxxx")] }
	if stem(podName("sbx", "ab")) == stem(podName("sbx", "AB")) {
		t.Errorf("ids differing only in case get the same name stem")
	}
}

func TestCheckTemplatesReportsEveryBrokenTemplate(t *testing.T) {
	t.Parallel()
	ts := substrate.Templates{
		"ok":         {Image: "python:3.12-slim"},
		"pod-image":  {Pod: json.RawMessage(`{"containers": [{"name": "main", "image": "busybox:1"}]}`)},
		"typo":       {Image: "x", Pod: json.RawMessage(`{"containres": []}`)},
		"no-image":   {Pod: json.RawMessage(`{"containers": [{"name": "main"}]}`)},
		"not-a-spec": {Image: "x", Pod: json.RawMessage(`[1, 2]`)},
	}

	err := CheckTemplates(ts)
	if err == nil {
		t.Fatal("broken templates passed")
	}
	for _, name := range []string{`"typo"`, `"no-image"`, `"not-a-spec"`} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name template %s: %v", name, err)
		}
	}
	for _, name := range []string{`"ok"`, `"pod-image"`} {
		if strings.Contains(err.Error(), name) {
			t.Errorf("error names the good template %s: %v", name, err)
		}
	}
}
