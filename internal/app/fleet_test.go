package app

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/internal/testenv/kubeenv"
)

// fleetTemplates is the python template of the tests, its Pods scheduled by the
// fleet's kube-scheduler (kubeenv.FleetScheduler).
var fleetTemplates = `{"templates": {"python-3.12": {"image": "python:3.12-slim", "max_disk_gib": 50,
	"pod": {"schedulerName": "` + kubeenv.FleetScheduler + `", "containers": [{"name": "sandbox"}]}}}}`

// podLog records every Pod created in a namespace (a watch from before the first),
// and when each was first seen Ready.
type podLog struct {
	mu      sync.Mutex
	created map[string]*corev1.Pod   // by name, as created
	seen    map[string]time.Time     // when the watch told of its creation
	ready   map[string]time.Duration // from then until it was first seen Ready
}

func watchPods(t *testing.T, srv *kubeenv.Server, ns string) *podLog {
	t.Helper()
	l := &podLog{created: map[string]*corev1.Pod{}, seen: map[string]time.Time{}, ready: map[string]time.Duration{}}
	ctx, cancel := context.WithCancel(context.Background())
	list, err := srv.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("pods before the test: %d (%v)", len(list.Items), err)
	}
	w, err := srv.Clientset.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				if ev.Type == watch.Error && ctx.Err() == nil {
					t.Errorf("the pod watch failed: %v", ev.Object)
				}
				continue
			}
			l.mu.Lock()
			if ev.Type == watch.Added {
				if _, dup := l.created[p.Name]; dup {
					t.Errorf("pod %s added twice", p.Name)
				}
				l.created[p.Name] = p.DeepCopy()
				l.seen[p.Name] = time.Now()
			}
			if _, seen := l.ready[p.Name]; !seen && isReady(p) {
				l.ready[p.Name] = time.Since(l.seen[p.Name])
			}
			l.mu.Unlock()
		}
		if ctx.Err() == nil {
			t.Errorf("the pod watch ended before the test: pods created after it are not counted")
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
	return l
}

// owner is what a Pod was made for: its name without the random suffix (sbx-<sandbox
// id> or slot-<slot id>).
func owner(pod string) string { return pod[:strings.LastIndex(pod, "-")] }

// TestKubernetesFleet runs space-api's replicas on simulated nodes: a real
// kube-scheduler binds the sandboxes' Pods (through WaitForFirstConsumer claims), kwok
// makes them Running and Ready. 30 sandboxes through two replicas with a warm pool of
// 10, one replica killed and started again midway, while the pool refills: every
// sandbox and slot got exactly one Pod, and after the restart nothing is left that no
// row accounts for.
func TestKubernetesFleet(t *testing.T) {
	t.Parallel()
	const sandboxes, poolTarget = 30, 10
	srv := kubeenv.Start(t)
	ns := srv.Namespace(t)
	srv.StartKubelet(t, ns, kubeenv.KubeletOptions{Scheduled: true})
	nodes := srv.StartFleet(t, 3, kubeenv.FleetCapacity())
	pods := watchPods(t, srv, ns)

	pool := fmt.Sprintf(`[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"target":%d}]`, poolTarget)
	quota := `{"clients": {"acme": {"concurrency": 100, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 1000, "burst": 1000}}}`
	env := replicaEnv(t, quotaFlags(quota, pool), map[string]string{
		"SPACE_RECONCILE_INTERVAL":   "500ms",
		"SPACE_RECONCILE_GRACE":      "2s",
		"KUBECONFIG":                 srv.Kubeconfig,
		"SPACE_SUBSTRATE":            "kubernetes",
		"SPACE_KUBERNETES_NAMESPACE": ns,
		// The bound after which a dead replica's warming slot is forgotten, and its
		// half-made Pod swept, is this plus the substrate's fixed slack.
		"SPACE_KUBERNETES_READY_TIMEOUT": "15s",
		"SPACE_TEMPLATES_FILE":           testenv.WriteFile(t, "templates.json", fleetTemplates),
	})
	delete(env, "SPACE_SIMULATED_STATE_DIR")
	a, b := startReplica(t, "a", env), startReplica(t, "b", env)
	f := &fleet{t: t, db: testenv.Pool(t, env["SPACE_DATABASE_URL"])}
	readySlots := func() int { return f.count("SELECT count(*) FROM pool_slots WHERE state = 'ready'") }
	testenv.Eventually(t, 2*time.Minute, "the warm pool to fill", func() bool { return readySlots() == poolTarget })

	srvClient := &server{t: t}
	var mu sync.Mutex
	made := map[string]space.Sandbox{}
	create := func(base string, i int) {
		r := srvClient.request(base, "POST", "/v1/sandboxes", "acme", pythonBody, "Idempotency-Key", fmt.Sprintf("fleet-%d", i))
		if r.StatusCode != 201 {
			t.Errorf("create %d = %d %s", i, r.StatusCode, r.body)
			return
		}
		var sb space.Sandbox
		r.json(t, &sb)
		mu.Lock()
		made[sb.ID] = sb
		mu.Unlock()
	}
	batch := func(from, to int, replicas ...*replica) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 5)
		for i := from; i < to; i++ {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				create(replicas[i%len(replicas)].public, i)
			})
		}
		wg.Wait()
	}
	before, err := srv.Counters(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	batch(0, sandboxes/2, a, b)
	// Midway, with the pool refilling on both replicas: a dies (SIGKILL, its warms cut
	// wherever they were) and starts again.
	// Killed while the pool refills (within a second of the batch, if it does): a
	// warm of a's cut is what the restart must not leave behind.
	warming := 0
	for end := time.Now().Add(time.Second); warming == 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		warming = f.count("SELECT count(*) FROM pool_slots WHERE state = 'warming'")
	}
	a.kill()
	a2 := startReplica(t, "a2", env)
	batch(sandboxes/2, sandboxes, a2, b)
	elapsed := time.Since(began)
	if t.Failed() {
		t.FailNow()
	}
	// The control plane served the fleet within its own seats: its priority and
	// fairness refused none of the requests of the creates, the restart and the refills.
	after, err := srv.Counters(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if rejected := after.Rejected - before.Rejected; rejected != 0 {
		t.Errorf("the API server's priority and fairness rejected %.0f requests over the creates (%.0f dispatched)", rejected, after.Dispatched-before.Dispatched)
	}

	// Settled: every sandbox running on its Pod, the pool full again, and the
	// namespace holding exactly that, every Pod Ready on a fleet node.
	onFleet := map[string]bool{}
	for _, n := range nodes {
		onFleet[n] = true
	}
	var lastWrong string
	settled := func() bool {
		ctx := testenv.Context(t)
		rows, err := f.db.Query(ctx, `SELECT substrate_ref FROM sandboxes WHERE state = 'running'
			UNION ALL SELECT substrate_ref FROM pool_slots WHERE state = 'ready'`)
		if err != nil {
			t.Fatal(err)
		}
		owned := map[string]bool{}
		for rows.Next() {
			var ref string
			if err := rows.Scan(&ref); err != nil {
				t.Fatal(err)
			}
			owned[ref] = true
		}
		rows.Close()
		live, err := srv.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claims, err := srv.Clientset.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var wrong []string
		if n := f.count("SELECT count(*) FROM sandboxes WHERE state = 'running'"); n != sandboxes {
			wrong = append(wrong, fmt.Sprintf("%d sandboxes running", n))
		}
		if n := readySlots(); n != poolTarget {
			wrong = append(wrong, fmt.Sprintf("%d slots ready", n))
		}
		for _, p := range live.Items {
			if !owned[p.Name] || !isReady(&p) || !onFleet[p.Spec.NodeName] {
				wrong = append(wrong, fmt.Sprintf("pod %s (owned %v, ready %v, node %q)", p.Name, owned[p.Name], isReady(&p), p.Spec.NodeName))
			}
		}
		if len(live.Items) != sandboxes+poolTarget || len(claims.Items) != sandboxes+poolTarget {
			wrong = append(wrong, fmt.Sprintf("%d pods and %d claims, want %d each", len(live.Items), len(claims.Items), sandboxes+poolTarget))
		}
		lastWrong = strings.Join(wrong, "; ")
		return len(wrong) == 0
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !settled() {
		if time.Now().After(deadline) {
			t.Fatalf("2 minutes after the last create, not settled: %s\nlogs: %v", lastWrong, srv.FleetLogs())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// One Pod per sandbox started cold or slot warmed: never two for one owner, every
	// cold sandbox's Pod its own, every warm sandbox's an adopted slot's.
	pods.mu.Lock()
	defer pods.mu.Unlock()
	byOwner := map[string][]string{}
	for name := range pods.created {
		byOwner[owner(name)] = append(byOwner[owner(name)], name)
	}
	cold, warm := 0, 0
	for id, sb := range made {
		n := len(byOwner["sbx-"+id])
		if sb.Warm {
			warm++
		} else {
			cold++
		}
		if want := map[bool]int{true: 0, false: 1}[sb.Warm]; n != want {
			t.Errorf("sandbox %s (warm %v): %d pods of its own created, want %d", id, sb.Warm, n, want)
		}
	}
	slots := 0
	for o, names := range byOwner {
		if strings.HasPrefix(o, "slot-") {
			slots++
		}
		if len(names) != 1 {
			t.Errorf("%s: %d pods created (%v), want 1", o, len(names), names)
		}
	}
	if len(made) != sandboxes {
		t.Fatalf("%d sandboxes made, want %d", len(made), sandboxes)
	}
	if warm == 0 {
		t.Errorf("no create was a warm hit")
	}
	perOwner := float64(len(pods.created)) / float64(cold+slots)
	if cold+slots != len(byOwner) || perOwner != 1 {
		t.Errorf("%d pods created for %d cold starts and %d slots warmed (%.3f per activation or slot), want 1.0", len(pods.created), cold, slots, perOwner)
	}
	var lat []time.Duration
	for _, d := range pods.ready {
		lat = append(lat, d)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("%d sandboxes (%d warm, %d cold) in %s on %d nodes, a replica killed with %d slots warming; %d pods created: %d cold, %d slots warmed (%d adopted, %d in the pool, %d stopped); pod ready p50 %s, max %s",
		sandboxes, warm, cold, elapsed.Round(time.Millisecond), len(nodes), warming, len(pods.created), cold, slots, warm, poolTarget, slots-warm-poolTarget,
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}
