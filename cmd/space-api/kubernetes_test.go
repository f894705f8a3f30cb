package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestKubernetesSubstrateWiring(t *testing.T) {
	t.Parallel()

	t.Run("SPACE_SUBSTRATE=kubernetes serves with the cluster of KUBECONFIG and reports it in readyz", func(t *testing.T) {
		t.Parallel()
		// There is no cluster here: an API server stand-in that answers the readiness
		// probe's pod list, which is all a start needs.
		var lists atomic.Int64
		apiServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == "GET" && r.URL.Path == "/api/v1/namespaces/sandboxes/pods" {
				lists.Add(1)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}`)
				return
			}
			http.NotFound(w, r)
		}))
		t.Cleanup(apiServer.Close)
		kubeconfig := testenv.WriteFile(t, "kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, apiServer.URL))
		cfg := testConfig(t)
		cfg.Sandbox.Substrate = "kubernetes"
		cfg.Kubernetes.Kubeconfig, cfg.Kubernetes.Namespace = kubeconfig, "sandboxes"
		m := startMain(t, cfg)
		var ready api.Readiness
		if code := getJSON(t, m.InternalURL()+"/readyz", &ready); code != 200 {
			t.Fatalf("readyz = %d %+v", code, ready)
		}
		if c := ready.Checks["substrate"]; c.Status != "ok" || !strings.Contains(c.Detail, "sandboxes") || lists.Load() == 0 {
			t.Fatalf("substrate check = %+v after %d pod lists", c, lists.Load())
		}
	})

	t.Run("a bad kubernetes variable stops the start naming it", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{
			"SPACE_DATABASE_URL":         testenv.DatabaseURL(t),
			"SPACE_REDIS_ADDRS":          testenv.RedisAddr(t),
			"SPACE_TEMPLATES_FILE":       testenv.WriteFile(t, "templates.json", testTemplates),
			"SPACE_SUBSTRATE":            "kubernetes",
			"SPACE_KUBERNETES_NAMESPACE": "Not_A_Namespace",
		}
		err := run(testenv.Context(t), []string{"serve"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "SPACE_KUBERNETES_NAMESPACE") {
			t.Fatalf("run = %v, want an error naming SPACE_KUBERNETES_NAMESPACE", err)
		}
	})
}
