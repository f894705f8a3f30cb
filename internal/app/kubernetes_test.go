package app

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/substrate/kubernetes"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/internal/testenv/kubeenv"
)

// kubeTemplates are the test templates plus one whose pod spec decodes but that the API
// server's validation refuses (a container name that is no DNS label).
const kubeTemplates = `{"templates": {
	"python-3.12": {"image": "python:3.12-slim", "max_disk_gib": 50},
	"node-22": {"image": "node:22-slim"},
	"refused": {"image": "busybox:1", "pod": {"containers": [{"name": "Not_A_Label"}]}}
}}`

var volumeSnapshots = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

// kubeCluster is a namespace of the test API server with its kubelet, and the
// variables that point space-api at it.
type kubeCluster struct {
	srv *kubeenv.Server
	ns  string
	env map[string]string
	// gate, when set, holds every new Pod Pending until open says otherwise.
	mu   sync.Mutex
	open func(*corev1.Pod) bool
	k    *kubeenv.Kubelet
}

func newKubeCluster(t *testing.T, gated bool) *kubeCluster {
	t.Helper()
	srv := kubeenv.Start(t)
	c := &kubeCluster{srv: srv, ns: srv.Namespace(t)}
	opts := kubeenv.KubeletOptions{}
	if gated {
		c.open = func(*corev1.Pod) bool { return false }
		opts.PodStatus = func(p *corev1.Pod, ip string) *corev1.PodStatus {
			c.mu.Lock()
			open := c.open(p)
			c.mu.Unlock()
			if !open {
				return nil
			}
			st := kubeenv.ReadyStatus(p, ip)
			return &st
		}
	}
	c.k = srv.StartKubelet(t, c.ns, opts)
	c.env = map[string]string{
		"KUBECONFIG":                             srv.Kubeconfig,
		"SPACE_SUBSTRATE":                        "kubernetes",
		"SPACE_KUBERNETES_NAMESPACE":             c.ns,
		"SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS": kubeenv.SnapshotClass,
		"SPACE_KUBERNETES_READY_TIMEOUT":         "30s",
	}
	return c
}

// letThrough makes the kubelet start the Pods open accepts from now on.
func (c *kubeCluster) letThrough(open func(*corev1.Pod) bool) {
	c.mu.Lock()
	c.open = open
	c.mu.Unlock()
	c.k.Poke()
}

// config is the Kubernetes configuration of c.env, as space-api reads it.
func (c *kubeCluster) config() config.Kubernetes {
	cfg, err := config.Load(func(k string) string {
		switch k {
		case "SPACE_DATABASE_URL":
			return "postgres://unused@127.0.0.1/space"
		case "SPACE_REDIS_ADDRS":
			return "127.0.0.1:1"
		case "SPACE_TEMPLATES_FILE":
			return "/unused"
		}
		return c.env[k]
	})
	if err != nil {
		panic(fmt.Sprintf("the test's kubernetes variables do not load: %v", err)) // a broken test literal
	}
	return cfg.Kubernetes
}

// substrate is the kubernetes substrate over the cluster, as the test's own view.
func (c *kubeCluster) substrate(t *testing.T) *kubernetes.Substrate {
	t.Helper()
	k := c.config()
	sub, err := kubernetes.Connect(kubernetes.Cluster{Kubeconfig: k.Kubeconfig, Namespace: k.Namespace, QPS: k.QPS, Burst: k.Burst},
		kubernetes.Options{ReadyTimeout: k.ReadyTimeout, SnapshotClass: k.SnapshotClass, MountPath: k.MountPath})
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

func (c *kubeCluster) pods(t *testing.T, selector string) []corev1.Pod {
	t.Helper()
	list, err := c.srv.Clientset.CoreV1().Pods(c.ns).List(testenv.Context(t), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// held counts what the namespace holds for sandbox id: Pods, claims, snapshots.
func (c *kubeCluster) held(t *testing.T, id string) (pods, claims, snapshots int) {
	t.Helper()
	ctx := testenv.Context(t)
	sel := metav1.ListOptions{LabelSelector: "space.dev/sandbox-id=" + id}
	p, err := c.srv.Clientset.CoreV1().Pods(c.ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.srv.Clientset.CoreV1().PersistentVolumeClaims(c.ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.srv.Dynamic.Resource(volumeSnapshots).Namespace(c.ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	return len(p.Items), len(cl.Items), len(s.Items)
}

// startKubeServer runs space-api in-process with SPACE_SUBSTRATE=kubernetes on c.
func startKubeServer(t *testing.T, c *kubeCluster, o e2eOptions) *server {
	t.Helper()
	cfg := testConfig(t)
	cfg.Sandbox.Substrate = kubernetes.Name
	cfg.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", kubeTemplates)
	cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1000}
	if o.quota != "" {
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(o.quota, o.poolShapes))
		cfg.Flags.PollInterval = 10 * time.Millisecond
	}
	cfg.Kubernetes = c.config()
	if o.config != nil {
		o.config(&cfg)
	}
	m := NewMain(cfg, NewLogger(io.Discard, "error"))
	m.RedisPrefix = testenv.Prefix(t)
	if err := m.Run(testenv.Context(t)); err != nil {
		m.Close()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return &server{t: t, m: m}
}

func TestKubernetesSubstrate(t *testing.T) {
	t.Parallel()

	t.Run("space-api on an API server creates, hits the pool, pauses, restores, wakes and deletes", func(t *testing.T) {
		t.Parallel()
		c := newKubeCluster(t, false)
		pool := `[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"target":1}]`
		// Sweeps may take anything older than a moment for an orphan; this test runs
		// them itself (below), so the background rounds are far apart.
		s := startKubeServer(t, c, e2eOptions{quota: acmeQuota, poolShapes: pool, config: func(cfg *config.Config) {
			cfg.Reconcile = config.Reconcile{Interval: time.Hour, Grace: 100 * time.Millisecond}
		}})
		ctx := testenv.Context(t)
		var ready api.Readiness
		if code := getJSON(t, s.m.InternalURL()+"/readyz", &ready); code != 200 || !strings.Contains(ready.Checks["substrate"].Detail, c.ns) {
			t.Fatalf("readyz = %d %+v", code, ready)
		}
		slotReady := func() bool {
			var n int
			if err := s.m.DB.QueryRow(ctx, "SELECT count(*) FROM pool_slots WHERE state = 'ready'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1 && len(c.pods(t, "space.dev/pool=true")) == 1
		}
		testenv.Eventually(t, time.Minute, "the warm pool to fill", slotReady)

		// A warm hit: the slot's Pod and claim become the sandbox's.
		warm := s.create("acme", pythonBody)
		if !warm.Warm || warm.State != space.StateRunning {
			t.Fatalf("first create %+v, want a warm hit", warm)
		}
		if p, cl, _ := c.held(t, warm.ID); p != 1 || cl != 1 {
			t.Fatalf("the warm sandbox holds %d pods and %d claims, want its adopted slot's one each", p, cl)
		}

		// A cold start: 201 once its Pod is ready.
		testenv.Eventually(t, time.Minute, "the pool to refill", slotReady)
		slot := c.pods(t, "space.dev/pool=true")[0].Name
		cold := s.create("acme", `{"template":"node-22","cpu_millis":500,"memory_mib":512,"disk_gib":3}`)
		if cold.Warm {
			t.Fatalf("a shape with no pool was warm: %+v", cold)
		}
		pods := c.pods(t, "space.dev/sandbox-id="+cold.ID)
		if len(pods) != 1 || !isReady(&pods[0]) || pods[0].Spec.Containers[0].Image != "node:22-slim" {
			t.Fatalf("the cold sandbox's pods %+v, want one ready node:22-slim", pods)
		}
		claim := claimOf(&pods[0])

		// Pause: the Pod goes, the claim stays, a snapshot is taken.
		var sb space.Sandbox
		if r := s.do("POST", "/v1/sandboxes/"+cold.ID+"/pause", "acme", ""); r.StatusCode != 200 {
			t.Fatalf("pause = %d %s", r.StatusCode, r.body)
		} else {
			r.json(t, &sb)
		}
		if p, cl, sn := c.held(t, cold.ID); sb.State != space.StatePaused || p != 0 || cl != 1 || sn != 1 {
			t.Fatalf("after the pause: %s with %d pods, %d claims, %d snapshots; want paused, 0, 1, 1", sb.State, p, cl, sn)
		}
		// The reconciler's sweep takes what no row accounts for after two sightings: a
		// paused sandbox's claim and snapshot are its row's, whatever its ref says.
		for sweeps := 0; sweeps < 2; {
			res, err := s.m.Reconciler.Round(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if res.Orphans != 0 {
				t.Fatalf("a sweep stopped %d resources of a fleet with no orphan", res.Orphans)
			}
			if res.Leader && res.Swept {
				sweeps++
			}
		}
		if p, cl, sn := c.held(t, cold.ID); p != 0 || cl != 1 || sn != 1 {
			t.Fatalf("after two sweeps the paused sandbox holds %d pods, %d claims, %d snapshots; want 0, 1, 1", p, cl, sn)
		}

		// Restore: a new Pod on the kept claim, started cold (a warm slot cannot mount
		// the sandbox's volume), leaving the ready slot in the pool.
		if r := s.do("POST", "/v1/sandboxes/"+cold.ID+"/restore", "acme", ""); r.StatusCode != 200 {
			t.Fatalf("restore = %d %s", r.StatusCode, r.body)
		}
		pods = c.pods(t, "space.dev/sandbox-id="+cold.ID)
		if len(pods) != 1 || claimOf(&pods[0]) != claim || !isReady(&pods[0]) {
			t.Fatalf("restored pods %+v, want one ready pod on the kept claim %s", pods, claim)
		}
		if slots := c.pods(t, "space.dev/pool=true"); len(slots) != 1 || slots[0].Name != slot {
			t.Fatalf("the restore took the warm slot %s: pool pods now %v", slot, podNames(slots))
		}

		// Pause again, and wake through the internal listener: the same claim again.
		if r := s.do("POST", "/v1/sandboxes/"+cold.ID+"/pause", "acme", ""); r.StatusCode != 200 {
			t.Fatalf("second pause = %d %s", r.StatusCode, r.body)
		}
		if r := s.internal("POST", "/internal/v1/sandboxes/"+cold.ID+"/wake", ""); r.StatusCode != 200 {
			t.Fatalf("wake = %d %s", r.StatusCode, r.body)
		} else {
			r.json(t, &sb)
		}
		pods = c.pods(t, "space.dev/sandbox-id="+cold.ID)
		if sb.State != space.StateRunning || len(pods) != 1 || claimOf(&pods[0]) != claim {
			t.Fatalf("woken %s with pods %v, want running on %s", sb.State, podNames(pods), claim)
		}
		if _, _, sn := c.held(t, cold.ID); sn != 1 {
			t.Fatalf("%d snapshots after two pauses, want the newest only", sn)
		}

		// Delete: the Pod, the claim and the snapshot go.
		for _, id := range []string{cold.ID, warm.ID} {
			if r := s.do("DELETE", "/v1/sandboxes/"+id, "acme", ""); r.StatusCode != http.StatusNoContent {
				t.Fatalf("delete = %d %s", r.StatusCode, r.body)
			}
			testenv.Eventually(t, 30*time.Second, "everything of sandbox "+id+" to be removed", func() bool {
				p, cl, sn := c.held(t, id)
				return p+cl+sn == 0
			})
		}
	})

	t.Run("an idle pause keeps the sandbox's claim, and its retention deletes it", func(t *testing.T) {
		t.Parallel()
		c := newKubeCluster(t, false)
		s := startKubeServer(t, c, e2eOptions{quota: `{"tiers": {"pro": {"concurrency": 50, "live_sandboxes": 100,
				"idle_timeout_seconds": 1, "paused_retention_seconds": 3}}, "clients": {"acme": {"tier": "pro"}}}`,
			config: func(cfg *config.Config) {
				cfg.Flags.FallbackTier = "pro"
				cfg.Lifecycle.Interval = 100 * time.Millisecond
			}})
		sb := s.create("acme", `{"template":"node-22","cpu_millis":500,"memory_mib":512,"disk_gib":3}`)
		testenv.Eventually(t, time.Minute, "the idle sandbox to be paused", func() bool {
			got := s.sandboxOf("acme", sb.ID)
			return got.State == space.StatePaused && reason(got.PauseReason) == space.ReasonIdle
		})
		if p, cl, sn := c.held(t, sb.ID); p != 0 || cl != 1 || sn != 1 {
			t.Fatalf("the idle-paused sandbox holds %d pods, %d claims, %d snapshots; want 0, 1, 1", p, cl, sn)
		}
		testenv.Eventually(t, time.Minute, "the retention to delete the sandbox and all it held", func() bool {
			got := s.sandboxOf("acme", sb.ID)
			p, cl, sn := c.held(t, sb.ID)
			return got.State == space.StateTerminated && reason(got.TerminationReason) == space.ReasonRetention && p+cl+sn == 0
		})
	})

	t.Run("a pause and a restore cut by a crash are settled from what the cluster holds", func(t *testing.T) {
		t.Parallel()
		c := newKubeCluster(t, true)
		// The node starts every Pod but the one a crashed restore left half made.
		c.letThrough(func(p *corev1.Pod) bool { return p.Name != "sbx-half-made" })
		s := startKubeServer(t, c, e2eOptions{quota: acmeQuota, config: func(cfg *config.Config) {
			cfg.Reconcile = config.Reconcile{Interval: time.Hour, Grace: 100 * time.Millisecond}
		}})
		ctx := testenv.Context(t)
		sub := c.substrate(t)
		// crashed leaves sandbox id in state as a replica that died mid-way would, long
		// enough ago for the reconciler, and runs rounds until one settled it.
		crashed := func(id string, state space.SandboxState) space.Sandbox {
			t.Helper()
			if _, err := s.m.DB.Exec(ctx, "UPDATE sandboxes SET state = $2, updated_at = now() - interval '1 hour' WHERE id = $1", id, state); err != nil {
				t.Fatal(err)
			}
			for {
				res, err := s.m.Reconciler.Round(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if res.Leader {
					break
				}
			}
			var sb space.Sandbox
			s.do("GET", "/v1/sandboxes/"+id, "acme", "").json(t, &sb)
			return sb
		}
		sb := s.create("acme", pythonBody)
		pods := c.pods(t, "space.dev/sandbox-id="+sb.ID)
		claim := claimOf(&pods[0])

		// A pause whose replica died once the Pod was deleted: the claim is found, so the
		// sandbox is paused on it.
		if err := sub.Stop(ctx, pods[0].Name); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the pod to go", func() bool { return len(c.pods(t, "space.dev/sandbox-id="+sb.ID)) == 0 })
		if got := crashed(sb.ID, space.StatePausing); got.State != space.StatePaused || !strings.Contains(got.LastError, "snapshot was found") {
			t.Fatalf("a pause cut after its pod went settled as %s (%s), want paused", got.State, got.LastError)
		}

		// A restore whose replica died with its Pod made but not ready: paused again,
		// the half-made Pod stopped, the claim kept.
		half := pods[0].DeepCopy()
		half.ObjectMeta = metav1.ObjectMeta{Name: "sbx-half-made", Labels: pods[0].Labels, Annotations: pods[0].Annotations}
		half.Status = corev1.PodStatus{}
		half.Spec.NodeName = ""
		if _, err := c.srv.Clientset.CoreV1().Pods(c.ns).Create(ctx, half, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := crashed(sb.ID, space.StateRestoring); got.State != space.StatePaused || !strings.Contains(got.LastError, "paused again") {
			t.Fatalf("a restore cut before its pod was ready settled as %s (%s), want paused again", got.State, got.LastError)
		}
		testenv.Eventually(t, 30*time.Second, "the half-made pod to be stopped", func() bool { return len(c.pods(t, "space.dev/sandbox-id="+sb.ID)) == 0 })
		if _, cl, _ := c.held(t, sb.ID); cl != 1 {
			t.Fatalf("%d claims after the settlements, want the sandbox's one kept", cl)
		}

		// And it restores, onto that claim.
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/restore", "acme", ""); r.StatusCode != 200 {
			t.Fatalf("restore = %d %s", r.StatusCode, r.body)
		}
		if pods := c.pods(t, "space.dev/sandbox-id="+sb.ID); len(pods) != 1 || claimOf(&pods[0]) != claim || !isReady(&pods[0]) {
			t.Fatalf("restored pods %v, want one ready on %s", podNames(pods), claim)
		}
	})

	t.Run("a template the API server refuses is a 422 naming the template, and leaves nothing", func(t *testing.T) {
		t.Parallel()
		c := newKubeCluster(t, false)
		s := startKubeServer(t, c, e2eOptions{quota: acmeQuota})
		r := s.do("POST", "/v1/sandboxes", "acme", `{"template":"refused","cpu_millis":500,"memory_mib":512,"disk_gib":1}`)
		if r.StatusCode != http.StatusUnprocessableEntity {
			t.Fatalf("create = %d %s, want 422", r.StatusCode, r.body)
		}
		if p := r.problem(t); p.Field != "template" || !strings.Contains(p.Detail, "spec.containers[0].name") {
			t.Fatalf("problem %+v, want the template field and the server's reason", p)
		}
		if n := s.sandboxCount(); n != 0 {
			t.Errorf("%d sandboxes recorded for a refused create", n)
		}
		if pods := c.pods(t, ""); len(pods) != 0 {
			t.Errorf("pods left: %v", podNames(pods))
		}
	})

	t.Run("a replica killed mid-start leaves pods the survivor settles: ready ones running, the rest stopped", func(t *testing.T) {
		t.Parallel()
		c := newKubeCluster(t, true)
		sub := c.substrate(t)
		env := replicaEnv(t, quotaFlags(acmeQuota, ""), map[string]string{
			"SPACE_RECONCILE_INTERVAL": "200ms",
			"SPACE_RECONCILE_GRACE":    "500ms",
		})
		delete(env, "SPACE_SIMULATED_STATE_DIR")
		env["SPACE_TEMPLATES_FILE"] = testenv.WriteFile(t, "templates.json", kubeTemplates)
		for k, v := range c.env {
			env[k] = v
		}
		// The substrate's bound: the ready timeout plus its fixed slack.
		env["SPACE_KUBERNETES_READY_TIMEOUT"] = "2s"
		a := startReplica(t, "a", env)
		f := &fleet{t: t, db: testenv.Pool(t, env["SPACE_DATABASE_URL"])}
		srv := &server{t: t}
		var wg sync.WaitGroup
		// Keyed, so that a retry under the key can still learn them: an unkeyed
		// create nobody was answered is ended rather than left running.
		for i := range 4 {
			wg.Go(func() {
				srv.requestNoFail(a.public, "POST", "/v1/sandboxes", "acme", pythonBody, "Idempotency-Key", fmt.Sprintf("cut-%d", i))
			})
		}
		testenv.Eventually(t, time.Minute, "four cold starts with their pods made", func() bool {
			return f.count("SELECT count(*) FROM sandboxes WHERE state = 'starting'") == 4 && len(c.pods(t, "")) == 4
		})
		a.kill()
		wg.Wait()
		// Two of the dead replica's pods come up after all; two never do.
		var ids []string
		for _, p := range c.pods(t, "") {
			ids = append(ids, p.Annotations["space.dev/sandbox-id"])
		}
		up := map[string]bool{ids[0]: true, ids[1]: true}
		c.letThrough(func(p *corev1.Pod) bool { return up[p.Annotations["space.dev/sandbox-id"]] })
		startReplica(t, "b", env)

		testenv.Eventually(t, 2*time.Minute, "the reconciler to settle every sandbox", func() bool {
			return f.count("SELECT count(*) FROM sandboxes WHERE state = 'starting'") == 0
		})
		// What each settlement leaves, read until it holds: the reconciler writes a
		// sandbox's end before it stops what ran for it (docs/design.md, Recovery), and a
		// deleted Pod stays, terminating, until the kubelet has removed it.
		settled := func() (wrong []string) {
			for _, id := range ids {
				var state, ref string
				if err := f.db.QueryRow(testenv.Context(t), "SELECT state, coalesce(substrate_ref, '') FROM sandboxes WHERE id = $1", id).Scan(&state, &ref); err != nil {
					t.Fatal(err)
				}
				found, err := sub.Find(testenv.Context(t), id)
				if err != nil {
					t.Fatal(err)
				}
				ready, ok := found.Ready()
				switch {
				case up[id] && (state != "running" || !ok || ready.Ref != ref || len(found.Resources) != 1):
					wrong = append(wrong, fmt.Sprintf("sandbox %s whose pod came up: %s on %q, found %+v; want running on that pod", id, state, ref, found))
				case !up[id] && (state != "failed" || len(found.Resources) != 0):
					wrong = append(wrong, fmt.Sprintf("sandbox %s whose pod never came up: %s, found %+v; want failed with its pod stopped", id, state, found.Resources))
				}
			}
			return wrong
		}
		deadline := time.Now().Add(30 * time.Second)
		for wrong := settled(); len(wrong) > 0; wrong = settled() {
			if time.Now().After(deadline) {
				t.Fatalf("30s after every sandbox was settled, what the cluster holds differs:\n%s", strings.Join(wrong, "\n"))
			}
			time.Sleep(50 * time.Millisecond)
		}
		// The failed sandboxes' claims are the sweep's: two sweeps that find them
		// unowned.
		testenv.Eventually(t, time.Minute, "the sweep to remove the failed sandboxes' claims", func() bool {
			for id := range up {
				if _, cl, _ := c.held(t, id); cl != 1 {
					return false
				}
			}
			for _, id := range ids {
				if _, cl, _ := c.held(t, id); !up[id] && cl != 0 {
					return false
				}
			}
			return true
		})
	})

	t.Run("a bad kubernetes variable stops the start naming it", func(t *testing.T) {
		t.Parallel()
		_, err := config.Load(func(k string) string {
			return map[string]string{"SPACE_DATABASE_URL": "postgres://u@h/db", "SPACE_REDIS_ADDRS": "127.0.0.1:1",
				"SPACE_TEMPLATES_FILE": "/t", "SPACE_SUBSTRATE": "kubernetes", "SPACE_KUBERNETES_NAMESPACE": "Not_A_Namespace"}[k]
		})
		if err == nil || !strings.Contains(err.Error(), "SPACE_KUBERNETES_NAMESPACE") {
			t.Fatalf("Load = %v, want an error naming SPACE_KUBERNETES_NAMESPACE", err)
		}
	})

	t.Run("a sandbox admitted over its soft limit runs in a Pod labelled so, with the soft-breach PriorityClass", func(t *testing.T) {
		t.Parallel()
		c := newKubeCluster(t, false)
		if _, err := c.srv.Clientset.SchedulingV1().PriorityClasses().Create(testenv.Context(t), &schedulingv1.PriorityClass{
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-degradable-" + c.ns}, Value: -10}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		s := startKubeServer(t, c, e2eOptions{
			quota: `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100, "soft_refill_rps": 0.000001, "soft_burst": 1}},
				"rate": {"acme": {"refill_rps": 0.000001, "burst": 10}}}`,
			config: func(cfg *config.Config) { cfg.Kubernetes.SoftBreachPriorityClass = "sandbox-degradable-" + c.ns }})
		within := s.create("acme", pythonBody)
		over := s.create("acme", pythonBody)
		if within.SoftBreach || !over.SoftBreach || over.SoftBreachAt == nil {
			t.Fatalf("soft breaches: first %v, second %v at %v; want the second only", within.SoftBreach, over.SoftBreach, over.SoftBreachAt)
		}
		for sb, want := range map[*space.Sandbox]bool{within: false, over: true} {
			pods := c.pods(t, "space.dev/sandbox-id="+sb.ID)
			if len(pods) != 1 {
				t.Fatalf("sandbox %s has %d pods", sb.ID, len(pods))
			}
			p := pods[0]
			if labelled := p.Labels["space.dev/soft-breach"] == "true"; labelled != want {
				t.Errorf("sandbox %s's pod labelled soft-breach %v, want %v", sb.ID, labelled, want)
			}
			if got := p.Spec.PriorityClassName == "sandbox-degradable-"+c.ns; got != want {
				t.Errorf("sandbox %s's pod priority class %q (priority %v)", sb.ID, p.Spec.PriorityClassName, p.Spec.Priority)
			}
			if want && (p.Spec.Priority == nil || *p.Spec.Priority != -10) {
				t.Errorf("the API server gave the soft-breached pod priority %v, want the class's -10", p.Spec.Priority)
			}
		}
		var got space.Sandbox
		s.do("GET", "/v1/sandboxes/"+over.ID, "acme", "").json(t, &got)
		if !got.SoftBreach || got.SoftBreachAt == nil {
			t.Fatalf("GET of the soft-breached sandbox = %+v", got)
		}
	})
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

func claimOf(p *corev1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
