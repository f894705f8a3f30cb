package kubernetes

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/config"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestReadEnvHasDefaults(t *testing.T) {
	t.Parallel()
	e, err := ReadEnv(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if e.ReadyTimeout != 2*time.Minute || e.QPS != 50 || e.Burst != 100 || e.Namespace != "" ||
		e.StorageClass != "" || e.SnapshotClass != "" || e.MountPath != "/workspace" {
		t.Errorf("defaults = %+v", e)
	}
}

func TestReadEnvTakesTheVolumeVariables(t *testing.T) {
	t.Parallel()
	e, err := ReadEnv(envOf(map[string]string{
		"SPACE_KUBERNETES_STORAGE_CLASS":         "fast-ssd",
		"SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS": "csi.hostpath.snapclass",
		"SPACE_KUBERNETES_VOLUME_MOUNT_PATH":     "/home/user",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if e.StorageClass != "fast-ssd" || e.SnapshotClass != "csi.hostpath.snapclass" || e.MountPath != "/home/user" {
		t.Errorf("read %+v", e)
	}
	for _, bad := range []string{"/", "/a/../b", "/a/", "/a:b"} {
		if _, err := ReadEnv(envOf(map[string]string{"SPACE_KUBERNETES_VOLUME_MOUNT_PATH": bad})); err == nil {
			t.Errorf("mount path %q accepted", bad)
		}
	}
}

func TestReadEnvNamesTheBadVariable(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"SPACE_KUBERNETES_NAMESPACE":     "Sandboxes!",
		"SPACE_KUBERNETES_READY_TIMEOUT": "soon",
		"SPACE_KUBERNETES_CLIENT_QPS":    "0",
		"SPACE_KUBERNETES_CLIENT_BURST":  "1.5",
		"SPACE_KUBERNETES_STORAGE_CLASS": "Fast SSD",
		// A class name is a DNS subdomain: dots are fine, a label over 63 is not.
		"SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS": "csi." + strings.Repeat("x", 64),
		"SPACE_KUBERNETES_VOLUME_MOUNT_PATH":     "workspace",
	} {
		_, err := ReadEnv(envOf(map[string]string{name: value}))
		var ve *config.VarError
		if !errors.As(err, &ve) || ve.Var != name {
			t.Errorf("%s=%s: err = %v, want a VarError naming it", name, value, err)
		}
	}
}

// A kubeconfig is enough to build the clientset: nothing is contacted until a call.
func TestNewFromEnvBuildsAClientFromKubeconfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config")
	kubeconfig := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: from-context}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}

	s, err := NewFromEnv(envOf(map[string]string{"KUBECONFIG": path, "SPACE_KUBERNETES_READY_TIMEOUT": "90s"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.namespace != "from-context" || s.readyTimeout != 90*time.Second {
		t.Errorf("namespace %q, ready timeout %s: want the context's namespace and 90s", s.namespace, s.readyTimeout)
	}

	s, err = NewFromEnv(envOf(map[string]string{"KUBECONFIG": path, "SPACE_KUBERNETES_NAMESPACE": "sandboxes"}), nil)
	if err != nil || s.namespace != "sandboxes" {
		t.Errorf("SPACE_KUBERNETES_NAMESPACE did not win over the context: %v %v", s, err)
	}
}

func TestNewFromEnvFailsClearlyWithoutAnyConfig(t *testing.T) {
	t.Parallel()
	_, err := NewFromEnv(envOf(map[string]string{"KUBECONFIG": filepath.Join(t.TempDir(), "missing")}), nil)
	if err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Fatalf("err = %v, want it to say no kubeconfig was usable", err)
	}
}
