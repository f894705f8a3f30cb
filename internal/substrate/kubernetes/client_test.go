package kubernetes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeKubeconfig writes a kubeconfig of an API server that is never contacted, whose
// context names namespace.
func writeKubeconfig(t *testing.T, namespace string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config")
	kubeconfig := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: "` + namespace + `"}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A kubeconfig is enough to build the clientset: nothing is contacted until a call.
func TestConnectBuildsAClientFromKubeconfig(t *testing.T) {
	t.Parallel()
	path := writeKubeconfig(t, "from-context")

	s, err := Connect(Cluster{Kubeconfig: path, QPS: 50, Burst: 100}, Options{ReadyTimeout: 90 * time.Second, MountPath: testMountPath})
	if err != nil {
		t.Fatal(err)
	}
	if s.namespace != "from-context" || s.readyTimeout != 90*time.Second {
		t.Errorf("namespace %q, ready timeout %s: want the context's namespace and 90s", s.namespace, s.readyTimeout)
	}

	s, err = Connect(Cluster{Kubeconfig: path, Namespace: "sandboxes", QPS: 50, Burst: 100}, Options{ReadyTimeout: time.Minute, MountPath: testMountPath})
	if err != nil || s.namespace != "sandboxes" {
		t.Errorf("the cluster's Namespace did not win over the context: %v %v", s, err)
	}
}

func TestRESTConfigTakesTheClusterRateLimit(t *testing.T) {
	t.Parallel()
	cfg, ns, err := Cluster{Kubeconfig: writeKubeconfig(t, "ctx"), QPS: 12.5, Burst: 30}.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS != 12.5 || cfg.Burst != 30 || cfg.UserAgent != "space-api" || ns != "ctx" {
		t.Errorf("rest config QPS %v, burst %d, user agent %q, namespace %q", cfg.QPS, cfg.Burst, cfg.UserAgent, ns)
	}
	for name, c := range map[string]Cluster{
		"QPS":   {Kubeconfig: writeKubeconfig(t, "ctx"), Burst: 30},
		"Burst": {Kubeconfig: writeKubeconfig(t, "ctx"), QPS: 1},
	} {
		if _, _, err := c.RESTConfig(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("RESTConfig without %s = %v, want an error naming it", name, err)
		}
	}
}

func TestConnectFailsClearlyWithoutAnyConfig(t *testing.T) {
	t.Parallel()
	_, err := Connect(Cluster{Kubeconfig: filepath.Join(t.TempDir(), "missing"), QPS: 50, Burst: 100}, Options{ReadyTimeout: time.Minute, MountPath: testMountPath})
	if err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Fatalf("err = %v, want it to say no kubeconfig was usable", err)
	}
}
