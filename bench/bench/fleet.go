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
// (internal/testenv/kubeenv), creating Sandboxes sandboxes with a warm pool of Pool.
type FleetResult struct {
	Sandboxes, Pool, Nodes, Replicas, Workers int
	// ClusterRefill and ClusterBurst are the cluster activation bucket's; KubeQPS and
	// KubeBurst each replica's API client limit (the chart's defaults, all four).
	ClusterRefill float64
	ClusterBurst  int64
	KubeQPS       float64
	KubeBurst     int
	// PoolFill is how long the pool took to fill from empty before the creates.
	PoolFill time.Duration
	Run      FleetRun
}

// FleetRun is what one run of the creates measured.
type FleetRun struct {
	Took        time.Duration // from the first create sent to the last answered
	Warm, Cold  int
	Refused     int // 429s (retried after Retry-After)
	PodsCreated int // Pods created in the namespace while the creates ran
	// PerActivation are the API server's requests while the creates ran (every
	// client: space-api, the scheduler, kwok, the provisioner, the bench's watch), by
	// verb and by verb and resource, divided by the sandboxes created.
	PerActivation         map[string]float64
	PerActivationResource map[string]float64
	// ReadyP50 and ReadyP99 are from a Pod's creation to its first Ready, as the
	// bench's watch saw both.
	ReadyP50, ReadyP99 time.Duration
	// PodRate is the Pods created a second over Took; PeakPodRate the most created in
	// one second.
	PodRate, PeakPodRate float64
	// Dispatched and Rejected are the API server's own priority and fairness counts
	// over the creates (apiserver_flowcontrol_dispatched_requests_total and
	// apiserver_flowcontrol_rejected_requests_total, every priority level): requests it
	// served through its queues, and requests it refused with a 429 for want of seats.
	Dispatched, Rejected float64
}

const fleetTemplates = `{"templates": {"fleet": {"image": "python:3.12-slim",
	"pod": {"schedulerName": "` + kubeenv.FleetScheduler + `", "containers": [{"name": "sandbox"}]}}}}`

const fleetBody = `{"template":"fleet","cpu_millis":1000,"memory_mib":2048,"disk_gib":1}`

// runFleet creates the sandboxes through two replicas, Workers at a time, retrying a
// 429 100 ms later, once the pool is full, and measures the API server's
// requests, the Pods' readiness and their creation rate.
func runFleet(ctx context.Context, env *Env, sz sizes) (*FleetResult, error) {
	res := &FleetResult{Sandboxes: sz.fleetSandboxes, Pool: sz.fleetPool, Nodes: sz.fleetNodes, Replicas: 2, Workers: sz.fleetWorkers,
		ClusterRefill: 100, ClusterBurst: 200, KubeQPS: 50, KubeBurst: 100}
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
		"SPACE_KUBERNETES_READY_TIMEOUT":                "2m",
		"SPACE_KUBERNETES_CLIENT_QPS":                   fmt.Sprint(res.KubeQPS),
		"SPACE_KUBERNETES_CLIENT_BURST":                 fmt.Sprint(res.KubeBurst),
		"SPACE_TEMPLATES_FILE":                          templates,
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": fmt.Sprint(res.ClusterRefill),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      fmt.Sprint(res.ClusterBurst),
		"SPACE_LOG_LEVEL":                               "warn",
	}
	var replicas []*apiServer
	defer func() {
		for _, r := range replicas {
			r.stop()
		}
	}()
	began := time.Now()
	for i := range res.Replicas {
		r, err := env.startServer(ctx, serverConfig{Name: fmt.Sprintf("fleet-%d", i), DB: st.db, RedisAddr: st.redis.Addr, Flags: flags, Env: vars})
		if err != nil {
			return nil, err
		}
		replicas = append(replicas, r)
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
	env.logf("fleet: pool of %d filled in %s; %d creates, %d at a time", sz.fleetPool, res.PoolFill.Round(time.Second), sz.fleetSandboxes, sz.fleetWorkers)

	before, err := srv.Counters(ctx)
	if err != nil {
		return nil, err
	}
	var next, warm, cold, refused atomic.Int64
	errs := make(chan error, sz.fleetWorkers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range sz.fleetWorkers {
		wg.Go(func() {
			base := replicas[w%len(replicas)].PublicURL
			for next.Add(1) <= int64(sz.fleetSandboxes) {
				for {
					code, body, err := fleetCreate(ctx, base)
					if err != nil {
						errs <- err
						return
					}
					if code == 429 {
						refused.Add(1)
						time.Sleep(100 * time.Millisecond)
						continue
					}
					if code != 201 {
						errs <- fmt.Errorf("fleet: create = %d %s", code, body)
						return
					}
					var sb space.Sandbox
					if err := json.Unmarshal(body, &sb); err != nil {
						errs <- err
						return
					}
					if sb.Warm {
						warm.Add(1)
					} else {
						cold.Add(1)
					}
					break
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	after, err := srv.Counters(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	run := FleetRun{Took: took, Warm: int(warm.Load()), Cold: int(cold.Load()), Refused: int(refused.Load()),
		PerActivation: map[string]float64{}, PerActivationResource: map[string]float64{},
		Dispatched: after.Dispatched - before.Dispatched, Rejected: after.Rejected - before.Rejected}
	for k, v := range after.Requests {
		d := (v - before.Requests[k]) / float64(sz.fleetSandboxes)
		if d <= 0 {
			continue
		}
		verb := strings.SplitN(k, " ", 2)[0]
		run.PerActivation[verb] += d
		run.PerActivationResource[k] += d
	}
	created, lat, peak := pods.window(start, start.Add(took))
	run.PodsCreated = created
	if len(lat) > 0 {
		run.ReadyP50, run.ReadyP99 = percentile(lat, 50), percentile(lat, 99)
	}
	run.PodRate = float64(created) / took.Seconds()
	run.PeakPodRate = float64(peak)
	res.Run = run
	env.logf("fleet: %d creates (%d warm, %d cold, %d refused and retried) in %s; %d pods created, ready p50 %s p99 %s",
		sz.fleetSandboxes, run.Warm, run.Cold, run.Refused, took.Round(time.Millisecond), created, run.ReadyP50, run.ReadyP99)
	return res, nil
}

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

func (r *Report) fleetMarkdown(b *strings.Builder) {
	f := r.Fleet
	if f == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	run := f.Run
	w("### 13. Fleet: space-api on a real scheduler and simulated nodes\n\n")
	w("%d `space-api` replicas with the kubernetes substrate on a real kube-apiserver, kube-scheduler and kwok (%d simulated nodes; `internal/testenv/kubeenv`), a warm pool of %d (filled from empty in %s before the creates), then %d sandboxes created %d at a time, a 429 retried 100 ms later. ",
		f.Replicas, f.Nodes, f.Pool, f.PoolFill.Round(time.Second), f.Sandboxes, f.Workers)
	w("Cluster activation bucket %g/s, burst %d; each replica's API client %g requests/s, burst %d (the chart's defaults). One run: its size makes it minutes.\n\n", f.ClusterRefill, f.ClusterBurst, f.KubeQPS, f.KubeBurst)
	w("| creates | warm | cold | 429s retried | took | pods created | pods/s (peak in 1 s) | pod ready p50 | p99 |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	w("| %d | %d | %d | %d | %s | %d | %.1f (%.0f) | %s | %s |\n\n", f.Sandboxes, run.Warm, run.Cold, run.Refused, run.Took.Round(time.Millisecond), run.PodsCreated, run.PodRate, run.PeakPodRate,
		run.ReadyP50.Round(time.Millisecond), run.ReadyP99.Round(time.Millisecond))
	w("API server requests per sandbox created while the creates ran (`apiserver_request_total`, every client: space-api, the scheduler, kwok, the test provisioner, the bench's watch), by verb: ")
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
	w("The API server's priority and fairness over the creates: %.0f requests dispatched through its queues, **%.0f rejected** (`apiserver_flowcontrol_rejected_requests_total`, every priority level and reason): the cluster bucket's rate and the replicas' client limits keep the control plane within its own seats.\n\n", run.Dispatched, run.Rejected)
	w("| verb resource | per sandbox |\n|---|---:|\n")
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

// fleetTargets are the fleet's: the control plane never refuses the fleet's requests,
// and no second sees more Pods created than the cluster bucket lets through in a
// second (its burst and a second of refill), warm-ups included.
func (r *Report) fleetTargets() []Target {
	f := r.Fleet
	if f == nil {
		return nil
	}
	most := float64(f.ClusterBurst) + f.ClusterRefill
	return []Target{
		{"the API server's priority and fairness rejects none of the fleet's requests",
			fmt.Sprintf("%.0f rejected of %.0f dispatched", f.Run.Rejected, f.Run.Dispatched), f.Run.Rejected == 0 && f.Run.Dispatched > 0},
		{fmt.Sprintf("Pods created in any one second ≤ the cluster bucket's burst and a second's refill (%.0f)", most),
			fmt.Sprintf("at most %.0f in a second, %.1f a second over the run", f.Run.PeakPodRate, f.Run.PodRate), f.Run.PeakPodRate <= most},
	}
}

// requests is the API server's requests per sandbox, every verb.
func (r FleetRun) requests() float64 {
	var n float64
	for _, v := range r.PerActivation {
		n += v
	}
	return n
}

// fleetClient waits as long as a cold start may: the substrate's ready timeout.
var fleetClient = &http.Client{Timeout: 3 * time.Minute}

// fleetCreate is createOnce with fleetClient.
func fleetCreate(ctx context.Context, base string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/sandboxes", strings.NewReader(fleetBody))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client-ID", "bench")
	resp, err := fleetClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s/v1/sandboxes: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
