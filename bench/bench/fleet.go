package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv/kubeenv"
)

// FleetResult is the fleet scenario: space-api's replicas with the kubernetes substrate
// on a real kube-apiserver, a real kube-scheduler and kwok's simulated nodes
// (internal/testenv/kubeenv), creating Sandboxes sandboxes with a warm pool of Pool,
// one replica killed and started again midway, then Pauses of them paused and
// restored.
type FleetResult struct {
	Sandboxes, Pool, Nodes, Replicas, Workers, Pauses int
	// ClusterRefill and ClusterBurst are the cluster activation bucket's; KubeQPS and
	// KubeBurst each replica's API client limit (the chart's defaults, all four).
	ClusterRefill float64
	ClusterBurst  int64
	KubeQPS       float64
	KubeBurst     int
	// ReadyTimeout is SPACE_KUBERNETES_READY_TIMEOUT: after it (and the substrate's
	// slack) a warm-up the kill cut is forgotten and its Pod swept.
	ReadyTimeout time.Duration
	// FloorPods were made straight through the API before space-api started, a claim
	// and a Pod each as the substrate makes them: FloorP50 and FloorP99 are from
	// their creation to Ready, what the scheduler, the claims' provisioning and kwok
	// take with nothing else running: the floor of a sandbox Pod's readiness.
	FloorPods          int
	FloorP50, FloorP99 time.Duration
	// PoolFill is how long the pool took to fill from empty before the creates.
	PoolFill time.Duration
	Run      FleetRun
	Cycle    FleetCycle
	Account  FleetAccount
}

// FleetRun is what one run of the creates measured.
type FleetRun struct {
	Took        time.Duration // from the first create sent to the last answered
	Warm, Cold  int
	Refused     int // 429s (retried after Retry-After)
	PodsCreated int // Pods created in the namespace while the creates ran
	// KilledWarming is the pool's slots warming when one replica was killed, midway.
	KilledWarming int
	// ColdP50 and ColdP99 are a cold create's answer, from its request to its 201,
	// which space-api sends once the sandbox's Pod is ready: admission to a ready Pod.
	ColdP50, ColdP99 time.Duration
	// PerActivation are the API server's requests from the first create to the last
	// restore (every client: space-api, the scheduler, kwok, the provisioner, the
	// bench's watch; the restart and the pauses included), by verb and by verb and
	// resource, divided by the activations (creates and restores).
	PerActivation         map[string]float64
	PerActivationResource map[string]float64
	// ReadyP50 and ReadyP99 are from a Pod's creation to its first Ready, as the
	// bench's watch saw both, for the Pods created while the creates ran.
	ReadyP50, ReadyP99 time.Duration
	// PodRate is the Pods created a second over Took; PeakPodRate the most created in
	// one second from the first create until the namespace settled (warm-ups,
	// restores and the restart's sweep included).
	PodRate, PeakPodRate float64
	// Dispatched and Rejected are the API server's own priority and fairness counts
	// from the first create to the last restore
	// (apiserver_flowcontrol_dispatched_requests_total and
	// apiserver_flowcontrol_rejected_requests_total, every priority level): requests it
	// served through its queues, and requests it refused with a 429 for want of seats.
	Dispatched, Rejected float64
}

// FleetCycle is the pauses and restores: Pauses sandboxes paused, then restored,
// Workers at a time.
type FleetCycle struct {
	PauseTook, RestoreTook time.Duration
	Refused                int // restores answered 429 and retried
	// RestoreP50 and RestoreP99 are a restore's answer, from its request to its 200
	// (the sandbox's new Pod ready).
	RestoreP50, RestoreP99 time.Duration
}

// FleetAccount is every Pod the scenario's watch saw created from the pool's first
// warm-up until the namespace settled (the floor's left out), by what it was made
// for: its name without the random suffix, sbx-<sandbox id> or slot-<slot id>.
type FleetAccount struct {
	Pods int
	// The activations, each of which makes exactly one Pod: sandboxes started cold,
	// slots warmed (a slot's Pod becomes the sandbox that adopts it) and restores.
	ColdStarts, SlotsWarmed, Restores int
	// Extra names each owner given more Pods than its activations: a storm's
	// duplicates.
	Extra []string
	// Settled is how long after the last restore the namespace held exactly the Pods
	// and claims of the running sandboxes and ready slots, each Pod Ready and named by
	// a row; Unsettled says what was still wrong after the bound (empty when it
	// settled), orphans included.
	Settled   time.Duration
	Unsettled string
}

// PerActivation is Pods created per activation: exactly 1 when nothing stormed.
func (a FleetAccount) PerActivation() float64 {
	return float64(a.Pods) / float64(max(1, a.ColdStarts+a.SlotsWarmed+a.Restores))
}

const fleetTemplates = `{"templates": {"fleet": {"image": "python:3.12-slim",
	"pod": {"schedulerName": "` + kubeenv.FleetScheduler + `", "containers": [{"name": "sandbox"}]}}}}`

const fleetBody = `{"template":"fleet","cpu_millis":1000,"memory_mib":2048,"disk_gib":1}`

// fleetSettle bounds the wait for the namespace to settle after the last restore: the
// ready timeout and its slack for a warm-up the kill cut, then the reconciler's rounds.
const fleetSettle = 5 * time.Minute

// runFleet measures the floor, fills the pool, creates the sandboxes through two
// replicas, Workers at a time (a 429 retried 100 ms later), killing one replica and
// starting it again midway, pauses and restores Pauses of them, waits for the
// namespace to settle, and accounts for every Pod made.
func runFleet(ctx context.Context, env *Env, sz sizes) (*FleetResult, error) {
	res := &FleetResult{Sandboxes: sz.fleetSandboxes, Pool: sz.fleetPool, Nodes: sz.fleetNodes, Replicas: 2, Workers: sz.fleetWorkers,
		Pauses: min(sz.fleetPauses, sz.fleetSandboxes), ClusterRefill: 100, ClusterBurst: 200, KubeQPS: 50, KubeBurst: 100,
		ReadyTimeout: sz.fleetReadyTimeout, FloorPods: sz.fleetFloor}
	env.logf("fleet: kube-apiserver, kube-scheduler and kwok (built the first time on this machine)")
	srv, err := kubeenv.Launch(ctx)
	if err != nil {
		return nil, err
	}
	if err := srv.LaunchFleet(ctx); err != nil {
		return nil, err
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("10Ti"),
	}
	nodes, err := srv.AddNodes(ctx, sz.fleetNodes, capacity)
	defer srv.DeleteNodes(nodes)
	if err != nil {
		return nil, err
	}
	ns, err := srv.CreateNamespace(ctx)
	if err != nil {
		return nil, err
	}
	_, stopKubelet, err := srv.RunKubelet(ns, kubeenv.KubeletOptions{Scheduled: true}, nil)
	if err != nil {
		return nil, err
	}
	defer stopKubelet()
	pods, err := watchFleetPods(ctx, srv, ns)
	if err != nil {
		return nil, err
	}
	defer pods.stop()

	if res.FloorP50, res.FloorP99, err = fleetFloor(ctx, srv, ns, pods, res.FloorPods, res.Workers); err != nil {
		return nil, err
	}
	env.logf("fleet: %d pods made straight through the API ready in p50 %s, p99 %s", res.FloorPods, res.FloorP50, res.FloorP99)

	st, err := env.newStack(ctx)
	if err != nil {
		return nil, err
	}
	defer st.close()
	templates := filepath.Join(env.Dir, "fleet-templates.json")
	if err := os.WriteFile(templates, []byte(fleetTemplates), 0o600); err != nil {
		return nil, err
	}
	n := sz.fleetSandboxes + sz.fleetPool
	flags, err := flagsFile(map[string]quota{"bench": {Concurrency: 2 * n, LiveSandboxes: 2 * n}},
		map[string]*rateEntry{"bench": {RefillRPS: 100_000, Burst: 100_000}},
		[]poolShape{{Template: "fleet", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 1, Target: sz.fleetPool}})
	if err != nil {
		return nil, err
	}
	vars := map[string]string{
		"SPACE_SUBSTRATE":                               "kubernetes",
		"KUBECONFIG":                                    srv.Kubeconfig,
		"SPACE_KUBERNETES_NAMESPACE":                    ns,
		"SPACE_KUBERNETES_READY_TIMEOUT":                res.ReadyTimeout.String(),
		"SPACE_KUBERNETES_CLIENT_QPS":                   fmt.Sprint(res.KubeQPS),
		"SPACE_KUBERNETES_CLIENT_BURST":                 fmt.Sprint(res.KubeBurst),
		"SPACE_TEMPLATES_FILE":                          templates,
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": fmt.Sprint(res.ClusterRefill),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      fmt.Sprint(res.ClusterBurst),
		"SPACE_LOG_LEVEL":                               "warn",
	}
	if sz.fleetReconcile > 0 {
		vars["SPACE_RECONCILE_INTERVAL"] = sz.fleetReconcile.String()
		vars["SPACE_RECONCILE_GRACE"] = (10 * sz.fleetReconcile).String()
	}
	replicas := make([]*apiServer, res.Replicas)
	defer func() {
		for _, r := range replicas {
			r.stop()
		}
	}()
	start := func(i int, name string) error {
		r, err := env.startServer(ctx, serverConfig{Name: name, DB: st.db, RedisAddr: st.redis.Addr, Flags: flags, Env: vars})
		replicas[i] = r
		return err
	}
	began := time.Now()
	for i := range res.Replicas {
		if err := start(i, fmt.Sprintf("fleet-%d", i)); err != nil {
			return nil, err
		}
	}
	for {
		ready, err := st.db.queryInt(ctx, "SELECT count(*) FROM pool_slots WHERE state = 'ready'")
		if err != nil {
			return nil, err
		}
		if int(ready) >= sz.fleetPool {
			break
		}
		if time.Since(began) > 10*time.Minute {
			return nil, fmt.Errorf("fleet: the pool of %d has %d slots ready after 10 minutes", sz.fleetPool, ready)
		}
		time.Sleep(200 * time.Millisecond)
	}
	res.PoolFill = time.Since(began)
	env.logf("fleet: pool of %d filled in %s; %d creates, %d at a time, a replica killed midway", sz.fleetPool, res.PoolFill.Round(time.Second), sz.fleetSandboxes, sz.fleetWorkers)

	before, err := srv.Counters(ctx)
	if err != nil {
		return nil, err
	}
	c := &fleetCreates{}
	startCreates := time.Now()
	if err := c.run(ctx, replicas, 0, sz.fleetSandboxes/2, sz.fleetWorkers); err != nil {
		return nil, err
	}
	// Midway, while the pool refills what the first half took: replica 0 dies with its
	// warm-ups wherever they were, and starts again.
	warming, err := st.db.queryInt(ctx, "SELECT count(*) FROM pool_slots WHERE state = 'warming'")
	if err != nil {
		return nil, err
	}
	replicas[0].kill()
	replicas[0] = nil
	if err := start(0, "fleet-0-again"); err != nil {
		return nil, err
	}
	if err := c.run(ctx, replicas, sz.fleetSandboxes/2, sz.fleetSandboxes, sz.fleetWorkers); err != nil {
		return nil, err
	}
	took := time.Since(startCreates)
	run := FleetRun{Took: took, Warm: c.warm, Cold: c.cold, Refused: c.refused, KilledWarming: int(warming),
		PerActivation: map[string]float64{}, PerActivationResource: map[string]float64{}}
	run.ColdP50, run.ColdP99 = percentile(c.coldLat, 50), percentile(c.coldLat, 99)
	created, lat, _ := pods.window(startCreates, startCreates.Add(took))
	run.PodsCreated = created
	run.ReadyP50, run.ReadyP99 = percentile(lat, 50), percentile(lat, 99)
	run.PodRate = float64(created) / took.Seconds()
	env.logf("fleet: %d creates (%d warm, %d cold, %d refused and retried) in %s, %d slots warming at the kill; %d pods created, ready p50 %s p99 %s",
		sz.fleetSandboxes, run.Warm, run.Cold, run.Refused, took.Round(time.Millisecond), warming, created, run.ReadyP50, run.ReadyP99)

	cycle, err := fleetCycle(ctx, replicas, c.ids[:res.Pauses], sz.fleetWorkers)
	if err != nil {
		return nil, err
	}
	res.Cycle = cycle
	after, err := srv.Counters(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	run.Dispatched, run.Rejected = after.Dispatched-before.Dispatched, after.Rejected-before.Rejected
	activations := float64(sz.fleetSandboxes + res.Pauses)
	for k, v := range after.Requests {
		d := (v - before.Requests[k]) / activations
		if d <= 0 {
			continue
		}
		verb := strings.SplitN(k, " ", 2)[0]
		run.PerActivation[verb] += d
		run.PerActivationResource[k] += d
	}
	env.logf("fleet: %d paused in %s, restored in %s (%d 429s retried), restore p50 %s p99 %s", res.Pauses,
		cycle.PauseTook.Round(time.Millisecond), cycle.RestoreTook.Round(time.Millisecond), cycle.Refused, cycle.RestoreP50, cycle.RestoreP99)

	cycled := time.Now()
	res.Account.Unsettled = fleetSettled(ctx, srv, st.db, ns, sz.fleetSandboxes, sz.fleetPool)
	for res.Account.Unsettled != "" && time.Since(cycled) < fleetSettle {
		time.Sleep(500 * time.Millisecond)
		res.Account.Unsettled = fleetSettled(ctx, srv, st.db, ns, sz.fleetSandboxes, sz.fleetPool)
	}
	res.Account.Settled = time.Since(cycled)
	_, _, peak := pods.window(startCreates, time.Now())
	run.PeakPodRate = float64(peak)
	res.Run = run
	res.Account = pods.account(c.made, c.ids[:res.Pauses], res.Account)
	env.logf("fleet: settled %s after the restores (%q); %d pods for %d cold starts, %d slots warmed and %d restores (%.3f an activation), %d owners with extra pods",
		res.Account.Settled.Round(time.Millisecond), res.Account.Unsettled, res.Account.Pods, res.Account.ColdStarts, res.Account.SlotsWarmed, res.Account.Restores,
		res.Account.PerActivation(), len(res.Account.Extra))
	return res, nil
}

// fleetCreates is the creates' tally, over both halves.
type fleetCreates struct {
	mu                  sync.Mutex
	made                map[string]bool // sandbox id -> warm
	ids                 []string        // in the order they were answered
	warm, cold, refused int
	coldLat             []time.Duration
}

// run creates sandboxes from..to-1 through replicas, workers at a time.
func (c *fleetCreates) run(ctx context.Context, replicas []*apiServer, from, to, workers int) error {
	c.mu.Lock()
	if c.made == nil {
		c.made = map[string]bool{}
	}
	c.mu.Unlock()
	return fleetEach(from, to, workers, func(w, _ int) error {
		code, body, refused, took, err := fleetPost(ctx, replicas[w%len(replicas)].PublicURL+"/v1/sandboxes", fleetBody, true)
		c.mu.Lock()
		c.refused += refused
		c.mu.Unlock()
		if err != nil {
			return err
		}
		if code != 201 {
			return fmt.Errorf("fleet: create = %d %s", code, body)
		}
		var sb space.Sandbox
		if err := json.Unmarshal(body, &sb); err != nil {
			return err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.made[sb.ID] = sb.Warm
		c.ids = append(c.ids, sb.ID)
		if sb.Warm {
			c.warm++
		} else {
			c.cold++
			c.coldLat = append(c.coldLat, took)
		}
		return nil
	})
}

// fleetCycle pauses ids, then restores them, workers at a time through the replicas.
func fleetCycle(ctx context.Context, replicas []*apiServer, ids []string, workers int) (FleetCycle, error) {
	var cy FleetCycle
	var mu sync.Mutex
	var lat []time.Duration
	each := func(verb string) error {
		restore := verb == "restore"
		return fleetEach(0, len(ids), workers, func(w, i int) error {
			code, body, refused, took, err := fleetPost(ctx, replicas[w%len(replicas)].PublicURL+"/v1/sandboxes/"+ids[i]+"/"+verb, "", restore)
			mu.Lock()
			defer mu.Unlock()
			cy.Refused += refused
			if err != nil {
				return err
			}
			if code != 200 {
				return fmt.Errorf("fleet: %s %s = %d %s", verb, ids[i], code, body)
			}
			if restore {
				lat = append(lat, took)
			}
			return nil
		})
	}
	began := time.Now()
	if err := each("pause"); err != nil {
		return cy, err
	}
	cy.PauseTook = time.Since(began)
	began = time.Now()
	if err := each("restore"); err != nil {
		return cy, err
	}
	cy.RestoreTook = time.Since(began)
	cy.RestoreP50, cy.RestoreP99 = percentile(lat, 50), percentile(lat, 99)
	return cy, nil
}

// fleetEach runs do(w, i) for each i in [from, to), workers at a time (w the worker's
// number), and returns the first error; a worker stops at its first.
func fleetEach(from, to, workers int, do func(w, i int) error) error {
	var next atomic.Int64
	next.Store(int64(from))
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < to; i = int(next.Add(1)) - 1 {
				if err := do(w, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// fleetPost POSTs body to url (fleetDo) and, with retry429, sends it again 100 ms
// after each 429. It returns the last answer, the 429s retried and how long the last
// attempt took.
func fleetPost(ctx context.Context, url, body string, retry429 bool) (code int, answer []byte, refused int, took time.Duration, err error) {
	for {
		sent := time.Now()
		code, answer, err = fleetDo(ctx, url, body)
		took = time.Since(sent)
		if err != nil || code != 429 || !retry429 {
			return code, answer, refused, took, err
		}
		refused++
		time.Sleep(100 * time.Millisecond)
	}
}

// fleetSettled says what keeps the namespace from holding exactly the running
// sandboxes' and ready slots' Pods and claims, every Pod Ready and named by a row's
// substrate reference; "" once it does.
func fleetSettled(ctx context.Context, srv *kubeenv.Server, db *database, ns string, sandboxes, pool int) string {
	refs, err := db.queryStrings(ctx, `SELECT substrate_ref FROM sandboxes WHERE state = 'running'
		UNION ALL SELECT substrate_ref FROM pool_slots WHERE state = 'ready'`)
	if err != nil {
		return err.Error()
	}
	owned := map[string]bool{}
	for _, r := range refs {
		owned[r] = true
	}
	live, err := srv.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	claims, err := srv.Clientset.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var wrong []string
	running, err := db.queryInt(ctx, "SELECT count(*) FROM sandboxes WHERE state = 'running'")
	if err != nil {
		return err.Error()
	}
	ready, err := db.queryInt(ctx, "SELECT count(*) FROM pool_slots WHERE state = 'ready'")
	if err != nil {
		return err.Error()
	}
	if int(running) != sandboxes || int(ready) != pool {
		wrong = append(wrong, fmt.Sprintf("%d sandboxes running and %d slots ready, want %d and %d", running, ready, sandboxes, pool))
	}
	unowned := 0
	for _, p := range live.Items {
		if !owned[p.Name] || !podReady(&p) {
			unowned++
		}
	}
	if unowned > 0 {
		wrong = append(wrong, fmt.Sprintf("%d pods not ready or named by no running sandbox or ready slot", unowned))
	}
	if len(live.Items) != sandboxes+pool || len(claims.Items) != sandboxes+pool {
		wrong = append(wrong, fmt.Sprintf("%d pods and %d claims, want %d each", len(live.Items), len(claims.Items), sandboxes+pool))
	}
	return strings.Join(wrong, "; ")
}

// fleetFloor makes n claims and Pods straight through the API, workers at a time,
// as the substrate makes a sandbox's (the fleet's scheduler, the default class's
// claim, a core and 2 GiB), waits for every Pod to be Ready, deletes them all and
// returns their readiness's p50 and p99 as the watch saw it.
func fleetFloor(ctx context.Context, srv *kubeenv.Server, ns string, pods *fleetPods, n, workers int) (p50, p99 time.Duration, err error) {
	cs := srv.Clientset.CoreV1()
	name := func(i int) string { return fmt.Sprintf("%s%d", fleetFloorPrefix, i) }
	began := time.Now()
	err = fleetEach(0, n, workers, func(_, i int) error {
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name(i)}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		}}
		if _, err := cs.PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("fleet floor: %w", err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name(i)}, Spec: corev1.PodSpec{
			SchedulerName: kubeenv.FleetScheduler,
			Containers: []corev1.Container{{Name: "sandbox", Image: "python:3.12-slim", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("2Gi")},
			}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name(i)},
			}}},
		}}
		if _, err := cs.Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("fleet floor: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	var lat []time.Duration
	for {
		lat = pods.readiness(fleetFloorPrefix)
		if len(lat) == n {
			break
		}
		if time.Since(began) > 3*time.Minute {
			return 0, 0, fmt.Errorf("fleet floor: %d of %d pods ready after 3 minutes", len(lat), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := range n {
		if err := cs.Pods(ns).Delete(ctx, name(i), metav1.DeleteOptions{}); err != nil {
			return 0, 0, fmt.Errorf("fleet floor: %w", err)
		}
		if err := cs.PersistentVolumeClaims(ns).Delete(ctx, name(i), metav1.DeleteOptions{}); err != nil {
			return 0, 0, fmt.Errorf("fleet floor: %w", err)
		}
	}
	for {
		left, err := cs.Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, 0, err
		}
		if len(left.Items) == 0 {
			break
		}
		if time.Since(began) > 5*time.Minute {
			return 0, 0, fmt.Errorf("fleet floor: %d pods left 5 minutes after they were made", len(left.Items))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return percentile(lat, 50), percentile(lat, 99), nil
}

// fleetFloorPrefix names the floor's Pods and claims; the accounting leaves them out.
const fleetFloorPrefix = "floor-"

// fleetPods records when each Pod of a namespace was created and first Ready, from a
// watch.
type fleetPods struct {
	mu      sync.Mutex
	created map[string]time.Time
	ready   map[string]time.Time
	stop    func()
}

func watchFleetPods(ctx context.Context, srv *kubeenv.Server, ns string) (*fleetPods, error) {
	list, err := srv.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := srv.Clientset.CoreV1().Pods(ns).Watch(wctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		cancel()
		return nil, err
	}
	p := &fleetPods{created: map[string]time.Time{}, ready: map[string]time.Time{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			now := time.Now()
			p.mu.Lock()
			if ev.Type == watch.Added {
				p.created[pod.Name] = now
			}
			if _, seen := p.ready[pod.Name]; !seen && podReady(pod) {
				p.ready[pod.Name] = now
			}
			p.mu.Unlock()
		}
	}()
	p.stop = func() {
		cancel()
		w.Stop()
		<-done
	}
	return p, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// window returns the Pods created within [from, to], the readiness latencies of
// those that became Ready, and the most created in one second.
func (p *fleetPods) window(from, to time.Time) (created int, ready []time.Duration, peak int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	perSecond := map[int64]int{}
	for name, at := range p.created {
		if at.Before(from) || at.After(to) {
			continue
		}
		created++
		perSecond[int64(at.Sub(from)/time.Second)]++
		if r, ok := p.ready[name]; ok {
			ready = append(ready, r.Sub(at))
		}
	}
	for _, n := range perSecond {
		peak = max(peak, n)
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i] < ready[j] })
	return created, ready, peak
}

// readiness returns, for the Pods whose name starts with prefix and that were seen
// Ready, the time from their creation to it.
func (p *fleetPods) readiness(prefix string) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for name, at := range p.created {
		if r, ok := p.ready[name]; ok && strings.HasPrefix(name, prefix) {
			out = append(out, r.Sub(at))
		}
	}
	return out
}

// account tallies every Pod created but the floor's by owner (its name without the
// random suffix): a sandbox started cold is owed one Pod, one adopting a slot none of
// its own, a restored one one more; a slot one. It fills acc's counts and Extra.
func (p *fleetPods) account(made map[string]bool, restored []string, acc FleetAccount) FleetAccount {
	p.mu.Lock()
	defer p.mu.Unlock()
	owed := map[string]int{}
	for id, warm := range made {
		if !warm {
			owed["sbx-"+id]++
			acc.ColdStarts++
		}
	}
	for _, id := range restored {
		owed["sbx-"+id]++
		acc.Restores++
	}
	got := map[string]int{}
	for name := range p.created {
		if strings.HasPrefix(name, fleetFloorPrefix) {
			continue
		}
		acc.Pods++
		owner := name[:strings.LastIndex(name, "-")]
		got[owner]++
		if strings.HasPrefix(owner, "slot-") && got[owner] == 1 {
			owed[owner] = 1
			acc.SlotsWarmed++
		}
	}
	for owner, n := range got {
		if n > owed[owner] {
			acc.Extra = append(acc.Extra, fmt.Sprintf("%s: %d pods for %d activations", owner, n, owed[owner]))
		}
	}
	sort.Strings(acc.Extra)
	return acc
}

func (r *Report) fleetMarkdown(b *strings.Builder) {
	f := r.Fleet
	if f == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	run, cy, acc := f.Run, f.Cycle, f.Account
	w("### 13. Fleet: space-api on a real scheduler and simulated nodes\n\n")
	w("%d `space-api` replicas with the kubernetes substrate on a real kube-apiserver (priority and fairness on), kube-scheduler and kwok (%d simulated nodes; `internal/testenv/kubeenv`), a warm pool of %d (filled from empty in %s before the creates), then %d sandboxes created %d at a time, a 429 retried 100 ms later; after the first half one replica is killed (SIGKILL, with %d slots warming) and started again; then %d of the sandboxes are paused and restored. ",
		f.Replicas, f.Nodes, f.Pool, f.PoolFill.Round(time.Second), f.Sandboxes, f.Workers, run.KilledWarming, f.Pauses)
	w("Cluster activation bucket %g/s, burst %d; each replica's API client %g requests/s, burst %d (the chart's defaults); `SPACE_KUBERNETES_READY_TIMEOUT` %s. One run: its size makes it minutes.\n\n", f.ClusterRefill, f.ClusterBurst, f.KubeQPS, f.KubeBurst, f.ReadyTimeout)
	w("| creates | warm | cold | 429s retried | took | pods created | pods/s (peak in 1 s) | pod ready p50 | p99 | cold create answered p50 | p99 |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	w("| %d | %d | %d | %d | %s | %d | %.1f (%.0f) | %s | %s | %s | %s |\n\n", f.Sandboxes, run.Warm, run.Cold, run.Refused, run.Took.Round(time.Millisecond), run.PodsCreated, run.PodRate, run.PeakPodRate,
		run.ReadyP50.Round(time.Millisecond), run.ReadyP99.Round(time.Millisecond), run.ColdP50.Round(time.Millisecond), run.ColdP99.Round(time.Millisecond))
	w("The floor: %d Pods made straight through the API before space-api started, each with a claim of the default class as the substrate makes them, were Ready %s (p50) and %s (p99) after their creation: the scheduler, the claims' provisioning and kwok with nothing else running. ",
		f.FloorPods, f.FloorP50.Round(time.Millisecond), f.FloorP99.Round(time.Millisecond))
	w("A cold create's answer (its 201 is sent once its Pod is ready) is the time from admission to a ready Pod. The peak Pods a second counts from the first create until the namespace settled: warm-ups, restores and the restart's sweep included.\n\n")
	w("Pauses and restores: %d paused in %s, then restored in %s (%d 429s retried); a restore answered (its new Pod ready) %s p50, %s p99.\n\n",
		f.Pauses, cy.PauseTook.Round(time.Millisecond), cy.RestoreTook.Round(time.Millisecond), cy.Refused, cy.RestoreP50.Round(time.Millisecond), cy.RestoreP99.Round(time.Millisecond))
	settled := fmt.Sprintf("settled %s after the last restore", acc.Settled.Round(time.Second))
	if acc.Unsettled != "" {
		settled = fmt.Sprintf("**not settled %s after the last restore: %s**", acc.Settled.Round(time.Second), acc.Unsettled)
	}
	w("Every Pod the namespace's watch saw created, by what it was made for: **%d Pods for %d activations (%.3f an activation)**: %d sandboxes started cold, %d slots warmed (a slot's Pod becomes the sandbox that adopts it) and %d restores; %d owners given more Pods than their activations. The namespace %s: exactly the running sandboxes' and ready slots' Pods and claims, each Pod Ready and named by a row, nothing orphaned by the kill.\n\n",
		acc.Pods, acc.ColdStarts+acc.SlotsWarmed+acc.Restores, acc.PerActivation(), acc.ColdStarts, acc.SlotsWarmed, acc.Restores, len(acc.Extra), settled)
	w("API server requests per activation (a create or a restore; `apiserver_request_total` from the first create to the last restore, every client: space-api, the scheduler, kwok, the test provisioner, the bench's watch; the restart and the pauses included), by verb: ")
	var verbs []string
	for v := range run.PerActivation {
		verbs = append(verbs, v)
	}
	sort.Strings(verbs)
	var parts []string
	for _, v := range verbs {
		parts = append(parts, fmt.Sprintf("%s %.2f", v, run.PerActivation[v]))
	}
	w("%s.\n\n", strings.Join(parts, ", "))
	w("The API server's priority and fairness over the same span: %.0f requests dispatched through its queues, **%.0f rejected** (`apiserver_flowcontrol_rejected_requests_total`, every priority level and reason).\n\n", run.Dispatched, run.Rejected)
	w("| verb resource | per activation |\n|---|---:|\n")
	var keys []string
	for k := range run.PerActivationResource {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return run.PerActivationResource[keys[i]] > run.PerActivationResource[keys[j]] })
	for _, k := range keys {
		if run.PerActivationResource[k] >= 0.01 {
			w("| %s | %.2f |\n", k, run.PerActivationResource[k])
		}
	}
	w("\n")
}

// fleetTargets are the fleet's: exactly one Pod per activation and nothing left that
// no row accounts for, the control plane never refusing the fleet's requests, and no
// second seeing more Pods created than the cluster bucket lets through in a second
// (its burst and a second of refill), warm-ups included.
func (r *Report) fleetTargets() []Target {
	f := r.Fleet
	if f == nil {
		return nil
	}
	acc := f.Account
	most := float64(f.ClusterBurst) + f.ClusterRefill
	settled := "settled, nothing orphaned"
	if acc.Unsettled != "" {
		settled = acc.Unsettled
	}
	return []Target{
		{"Pods created per activation (a cold start, a slot warmed, a restore) = 1, no owner given two",
			fmt.Sprintf("%d for %d (%.3f), %d owners with extra", acc.Pods, acc.ColdStarts+acc.SlotsWarmed+acc.Restores, acc.PerActivation(), len(acc.Extra)),
			acc.PerActivation() == 1 && len(acc.Extra) == 0},
		{"after a replica's kill, the namespace settles to exactly the rows' Pods and claims",
			settled, acc.Unsettled == ""},
		{"the API server's priority and fairness rejects none of the fleet's requests",
			fmt.Sprintf("%.0f rejected of %.0f dispatched", f.Run.Rejected, f.Run.Dispatched), f.Run.Rejected == 0 && f.Run.Dispatched > 0},
		{fmt.Sprintf("Pods created in any one second ≤ the cluster bucket's burst and a second's refill (%.0f)", most),
			fmt.Sprintf("at most %.0f in a second, %.1f a second over the creates", f.Run.PeakPodRate, f.Run.PodRate), f.Run.PeakPodRate <= most},
	}
}

// requests is the API server's requests per activation, every verb.
func (r FleetRun) requests() float64 {
	var n float64
	for _, v := range r.PerActivation {
		n += v
	}
	return n
}

// fleetClient waits as long as a cold start may: the substrate's ready timeout.
var fleetClient = &http.Client{Timeout: 3 * time.Minute}

// fleetDo POSTs body (none when empty) to url as the bench client, with fleetClient.
func fleetDo(ctx context.Context, url, body string) (int, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("X-Client-ID", "bench")
	resp, err := fleetClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
