package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

const testNamespace = "sandboxes"

var testShape = space.Shape{Template: "python-3.12", CPUMillis: 1500, MemoryMiB: 2048, DiskGiB: 10}

// testTemplate has a pod spec with a sidecar, a GPU limit and an image that the
// template's own image replaces.
var testTemplate = substrate.Template{
	Name:  "python-3.12",
	Image: "python:3.12-slim",
	Pod: json.RawMessage(`{
		"containers": [
			{"name": "runner", "image": "replaced:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
			{"name": "proxy", "image": "envoy:1"}
		],
		"nodeSelector": {"pool": "sandboxes"}
	}`),
}

func testSpec(id string) substrate.Spec {
	return substrate.Spec{SandboxID: id, Client: "acme", Shape: testShape, Template: testTemplate}
}

// kubelet decides the status a Pod gets once created; nil leaves it Pending forever.
type kubelet func(*corev1.Pod) *corev1.PodStatus

func readyKubelet(*corev1.Pod) *corev1.PodStatus {
	return &corev1.PodStatus{
		Phase:      corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
}

func pendingKubelet(*corev1.Pod) *corev1.PodStatus { return nil }

type bundle struct {
	sub *Substrate
	cs  *fake.Clientset
	ctx context.Context
}

type setupConfig struct {
	kubelet      kubelet
	readyTimeout time.Duration
	snapshotter  Snapshotter
	objects      []runtime.Object
}

// setup returns a substrate over a fake clientset whose "kubelet" makes every new Pod
// Ready.
func setup(t *testing.T) bundle {
	t.Helper()
	return setupWith(t, setupConfig{})
}

func setupWith(t *testing.T, c setupConfig) bundle {
	t.Helper()
	if c.kubelet == nil {
		c.kubelet = readyKubelet
	}
	if c.readyTimeout == 0 {
		c.readyTimeout = 10 * time.Second // generous: only the deadline test waits it out
	}
	cs := fake.NewClientset(c.objects...)
	startKubelet(t, cs, c.kubelet)
	sub, err := New(Options{Clientset: cs, Namespace: testNamespace, ReadyTimeout: c.readyTimeout, Snapshotter: c.snapshotter})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return bundle{sub: sub, cs: cs, ctx: ctx}
}

// startKubelet plays the node: it watches Pods and sets the status k decides on each
// one as it is created, through UpdateStatus as a kubelet would.
func startKubelet(t *testing.T, cs *fake.Clientset, k kubelet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pods := cs.CoreV1().Pods(testNamespace)
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if ev.Type != watch.Added || !ok {
				continue
			}
			st := k(pod)
			if st == nil {
				continue
			}
			pod = pod.DeepCopy()
			pod.Status = *st
			if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
				t.Errorf("kubelet: update status of %s: %v", pod.Name, err)
			}
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
}

func (b bundle) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod, err := b.cs.CoreV1().Pods(testNamespace).Get(b.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return pod
}

func (b bundle) podCount(t *testing.T) int {
	t.Helper()
	list, err := b.cs.CoreV1().Pods(testNamespace).List(b.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// failOn makes every call verb on pods (with no subresource) fail with err.
func (b bundle) failOn(verb string, err error) {
	b.cs.PrependReactor(verb, "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "" {
			return false, nil, nil
		}
		return true, nil, err
	})
}

func TestStartColdCreatesAReadyPodFromTheTemplateWithLabelsAndResources(t *testing.T) {
	t.Parallel()
	b := setup(t)

	ref, err := b.sub.StartCold(b.ctx, testSpec("sbx_01J9ZK"))
	if err != nil {
		t.Fatal(err)
	}
	pod := b.pod(t, ref)
	if !podReady(pod) {
		t.Errorf("StartCold returned before the pod was ready: %+v", pod.Status)
	}
	if !strings.HasPrefix(ref, "sbx-sbx-01j9zk-") {
		t.Errorf("pod name %q does not start with the sandbox id", ref)
	}
	wantLabels := map[string]string{
		labelSandboxID: "sbx_01J9ZK",
		labelClient:    "acme",
		labelTemplate:  "python-3.12",
		labelCPU:       "1500",
		labelMemory:    "2048",
		labelDisk:      "10",
		labelManagedBy: "space-api",
	}
	for k, v := range wantLabels {
		if pod.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, pod.Labels[k], v)
		}
	}
	if _, ok := pod.Labels[labelPool]; ok {
		t.Errorf("a sandbox pod carries the pool label")
	}
	if pod.Annotations[annotationShape] != testShape.String() || pod.Annotations[annotationClient] != "acme" {
		t.Errorf("annotations = %v", pod.Annotations)
	}

	c := pod.Spec.Containers[0]
	if c.Name != "runner" || c.Image != "python:3.12-slim" {
		t.Errorf("first container = %s %s, want runner with the template's image", c.Name, c.Image)
	}
	for name, want := range map[corev1.ResourceName]string{
		corev1.ResourceCPU:              "1500m",
		corev1.ResourceMemory:           "2Gi",
		corev1.ResourceEphemeralStorage: "10Gi",
	} {
		if q := c.Resources.Requests[name]; q.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("request %s = %s, want %s", name, q.String(), want)
		}
		if q := c.Resources.Limits[name]; q.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("limit %s = %s, want %s", name, q.String(), want)
		}
	}
	if q := c.Resources.Limits["nvidia.com/gpu"]; q.Cmp(resource.MustParse("1")) != 0 {
		t.Errorf("the template's own limit was lost: %v", c.Resources.Limits)
	}
	if pod.Spec.Containers[1].Image != "envoy:1" || pod.Spec.NodeSelector["pool"] != "sandboxes" {
		t.Errorf("the rest of the template's pod spec was not kept: %+v", pod.Spec)
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("a sandbox pod gets an API token by default")
	}
}

func TestStartColdRunsOneContainerOfTheImageWhenTheTemplateHasNoPodSpec(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := testSpec("s1")
	spec.Template = substrate.Template{Name: "node-22", Image: "node:22-slim"}

	ref, err := b.sub.StartCold(b.ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	cs := b.pod(t, ref).Spec.Containers
	if len(cs) != 1 || cs[0].Name != "sandbox" || cs[0].Image != "node:22-slim" {
		t.Errorf("containers = %+v, want one named sandbox running node:22-slim", cs)
	}
}

func TestStartColdWaitsForAPodThatBecomesReadyLater(t *testing.T) {
	t.Parallel()
	// The kubelet first reports the pod scheduled but not ready, then ready: the wait
	// must follow the watch past the first update.
	b := setupWith(t, setupConfig{kubelet: func(p *corev1.Pod) *corev1.PodStatus {
		return &corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}}}
	}})
	pods := b.cs.CoreV1().Pods(testNamespace)
	w, err := pods.Watch(b.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if ev.Type == watch.Modified && ok && p.Status.Phase == corev1.PodPending {
				p = p.DeepCopy()
				p.Status = *readyKubelet(p)
				_, _ = pods.UpdateStatus(b.ctx, p, metav1.UpdateOptions{})
				return
			}
		}
	}()

	ref, err := b.sub.StartCold(b.ctx, testSpec("late"))
	if err != nil {
		t.Fatal(err)
	}
	if !podReady(b.pod(t, ref)) {
		t.Errorf("StartCold returned before the pod was ready")
	}
}

func TestStartColdDeletesAPodThatIsNotReadyByTheDeadlineAndFails(t *testing.T) {
	t.Parallel()
	b := setupWith(t, setupConfig{kubelet: pendingKubelet, readyTimeout: 50 * time.Millisecond})

	_, err := b.sub.StartCold(b.ctx, testSpec("stuck"))
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v, want ErrNotReady", err)
	}
	if !strings.Contains(err.Error(), "not ready after 50ms") || !strings.Contains(err.Error(), "stuck") {
		t.Errorf("the error does not say what timed out: %v", err)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("%d pods left behind, want the stuck one deleted", n)
	}
}

func TestStartColdFailsWithoutWaitingForTheDeadlineWhenThePodFails(t *testing.T) {
	t.Parallel()
	b := setupWith(t, setupConfig{kubelet: func(*corev1.Pod) *corev1.PodStatus {
		return &corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "node low on ephemeral-storage"}
	}, readyTimeout: time.Hour})

	_, err := b.sub.StartCold(b.ctx, testSpec("evicted"))
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "Evicted") {
		t.Fatalf("err = %v, want ErrNotReady naming the eviction", err)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("%d pods left behind", n)
	}
}

func TestStartColdDeletesThePodWhenTheCallerGivesUp(t *testing.T) {
	t.Parallel()
	b := setupWith(t, setupConfig{kubelet: pendingKubelet, readyTimeout: time.Hour})
	ctx, cancel := context.WithCancel(b.ctx)
	// Cancel as soon as the pod exists, signalled by the create itself.
	b.cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		cancel()
		return false, nil, nil
	})

	_, err := b.sub.StartCold(ctx, testSpec("abandoned"))
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v, want the caller's context.Canceled", err)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("%d pods left behind", n)
	}
}

func TestStartColdSurfacesACreateFailureFromTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.failOn("create", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("exceeded quota: sandboxes")))

	_, err := b.sub.StartCold(b.ctx, testSpec("s1"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") || !strings.Contains(err.Error(), "start sandbox s1") {
		t.Fatalf("err = %v, want the API's Forbidden wrapped with the sandbox", err)
	}
}

func TestStartColdReusesTheLivePodOfAnEarlierAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.sub.StartCold(b.ctx, testSpec("retried"))
	if err != nil {
		t.Fatal(err)
	}

	second, err := b.sub.StartCold(b.ctx, testSpec("retried"))
	if err != nil {
		t.Fatal(err)
	}
	if second != first || b.podCount(t) != 1 {
		t.Errorf("a retried start made pod %s next to %s (%d pods), want the first reused", second, first, b.podCount(t))
	}
}

func TestStartColdRefusesATemplatePodSpecWithAMisspeltField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := testSpec("s1")
	spec.Template.Pod = json.RawMessage(`{"containers": [{"name": "a", "imagePullPolcy": "Always"}]}`)

	_, err := b.sub.StartCold(b.ctx, spec)
	if err == nil || !strings.Contains(err.Error(), "imagePullPolcy") {
		t.Fatalf("err = %v, want the misspelt field named", err)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("%d pods created from a bad template", n)
	}
}

func TestWarmCreatesAReadyPoolSlotWithoutAnOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)

	ref, err := b.sub.Warm(b.ctx, "slot-7", testShape, testTemplate)
	if err != nil {
		t.Fatal(err)
	}
	pod := b.pod(t, ref)
	if pod.Labels[labelPool] != "true" || pod.Labels[labelSlotID] != "slot-7" || pod.Labels[labelCPU] != "1500" {
		t.Errorf("slot labels = %v", pod.Labels)
	}
	if _, ok := pod.Labels[labelSandboxID]; ok {
		t.Errorf("a fresh slot already has a sandbox label")
	}
	if !podReady(pod) {
		t.Errorf("Warm returned before the slot was ready")
	}
}

func TestAdoptRelabelsTheSlotAsTheSandbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
	if err != nil {
		t.Fatal(err)
	}

	ref, err := b.sub.Adopt(b.ctx, slot, testSpec("sbx-9"))
	if err != nil {
		t.Fatal(err)
	}
	if ref != slot {
		t.Errorf("ref = %s, want the slot's pod %s", ref, slot)
	}
	pod := b.pod(t, ref)
	if _, ok := pod.Labels[labelPool]; ok {
		t.Errorf("the adopted pod is still labelled a pool member: %v", pod.Labels)
	}
	if pod.Labels[labelSandboxID] != "sbx-9" || pod.Labels[labelClient] != "acme" || pod.Labels[labelSlotID] != "slot-1" {
		t.Errorf("labels = %v, want the sandbox, its client and the slot it came from", pod.Labels)
	}

	// Adopting again for the same sandbox (a retry) is fine; for another, taken.
	if _, err := b.sub.Adopt(b.ctx, slot, testSpec("sbx-9")); err != nil {
		t.Errorf("a retried adoption failed: %v", err)
	}
	if _, err := b.sub.Adopt(b.ctx, slot, testSpec("sbx-10")); !errors.Is(err, substrate.ErrSlotTaken) {
		t.Errorf("adopting another sandbox's pod: err = %v, want ErrSlotTaken", err)
	}
}

func TestAdoptReturnsErrSlotTakenWhenAnotherReplicaRelabelledTheSlotFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
	if err != nil {
		t.Fatal(err)
	}
	b.cs.PrependReactor("update", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, slot, errors.New("the object has been modified; please apply your changes to the latest version"))
	})

	_, err = b.sub.Adopt(b.ctx, slot, testSpec("sbx-1"))
	if !errors.Is(err, substrate.ErrSlotTaken) {
		t.Fatalf("err = %v, want ErrSlotTaken", err)
	}
}

func TestAdoptSendsTheResourceVersionItRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
	if err != nil {
		t.Fatal(err)
	}
	// The fake clientset does not version objects; give the slot one, as the API
	// server would, and check the Update carries it (that is what makes it optimistic).
	pod := b.pod(t, slot)
	pod.ResourceVersion = "4711"
	if err := b.cs.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, testNamespace); err != nil {
		t.Fatal(err)
	}
	sent := make(chan string, 1)
	b.cs.PrependReactor("update", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "" {
			sent <- a.(k8stesting.UpdateAction).GetObject().(*corev1.Pod).ResourceVersion
		}
		return false, nil, nil
	})

	if _, err := b.sub.Adopt(b.ctx, slot, testSpec("sbx-1")); err != nil {
		t.Fatal(err)
	}
	if rv := <-sent; rv != "4711" {
		t.Errorf("update sent resourceVersion %q, want the one read, 4711", rv)
	}
}

func TestAdoptOfAMissingSlotIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.sub.Adopt(b.ctx, "slot-gone-abcde", testSpec("sbx-1"))
	if !errors.Is(err, substrate.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

func TestAdoptRefusesASlotOfAnotherShape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	small := testShape
	small.CPUMillis = 500
	slot, err := b.sub.Warm(b.ctx, "slot-small", small, testTemplate)
	if err != nil {
		t.Fatal(err)
	}

	_, err = b.sub.Adopt(b.ctx, slot, testSpec("sbx-1"))
	if err == nil || errors.Is(err, substrate.ErrSlotTaken) || !strings.Contains(err.Error(), labelCPU) {
		t.Fatalf("err = %v, want a shape mismatch naming %s", err, labelCPU)
	}
	if b.pod(t, slot).Labels[labelPool] != "true" {
		t.Errorf("a refused slot was relabelled")
	}
}

func TestStopDeletesThePodAndAMissingPodIsNotAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ref, err := b.sub.StartCold(b.ctx, testSpec("s1"))
	if err != nil {
		t.Fatal(err)
	}

	if err := b.sub.Stop(b.ctx, ref); err != nil {
		t.Fatal(err)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("%d pods after Stop", n)
	}
	if err := b.sub.Stop(b.ctx, ref); err != nil {
		t.Errorf("stopping a pod already gone: %v", err)
	}
}

func TestStopSurfacesOtherDeleteErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.failOn("delete", apierrors.NewServiceUnavailable("etcd leader changed"))

	err := b.sub.Stop(b.ctx, "sbx-s1-abcde")
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "stop sbx-s1-abcde") {
		t.Fatalf("err = %v, want the API error wrapped with the pod", err)
	}
}

func TestSnapshotAndRestoreWithoutASnapshotterAreUnsupported(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.sub.Snapshot(b.ctx, "sbx-s1-abcde")
	if !errors.Is(err, substrate.ErrUnsupported) || !strings.Contains(err.Error(), "no snapshotter") {
		t.Errorf("Snapshot: err = %v, want ErrUnsupported saying no snapshotter is configured", err)
	}
	_, err = b.sub.Restore(b.ctx, "snap-1", "", testSpec("s1"))
	if !errors.Is(err, substrate.ErrUnsupported) || !strings.Contains(err.Error(), "no snapshotter") {
		t.Errorf("Restore: err = %v, want ErrUnsupported saying no snapshotter is configured", err)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("an unsupported restore created %d pods", n)
	}
}

// fakeSnapshotter records what it is asked; it prepares cold pods with a checkpoint
// image, as a checkpoint-image snapshotter would.
type fakeSnapshotter struct {
	mu          sync.Mutex
	saved       []string // pod names
	restored    map[string]string
	restoreErr  error
	preparedFor string
}

func (f *fakeSnapshotter) Snapshot(_ context.Context, pod *corev1.Pod) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saved = append(f.saved, pod.Name)
	return "snap-of-" + pod.Name, nil
}

func (f *fakeSnapshotter) Restore(_ context.Context, snap string, pod *corev1.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.restoreErr != nil {
		return f.restoreErr
	}
	if f.restored == nil {
		f.restored = map[string]string{}
	}
	f.restored[pod.Name] = snap
	return nil
}

func (f *fakeSnapshotter) PreparePod(_ context.Context, snap string, pod *corev1.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.preparedFor = snap
	pod.Spec.Containers[0].Image = "checkpoint/" + snap
	return nil
}

func TestSnapshotSavesThroughTheSnapshotterThenDeletesThePod(t *testing.T) {
	t.Parallel()
	snap := &fakeSnapshotter{}
	b := setupWith(t, setupConfig{snapshotter: snap})
	ref, err := b.sub.StartCold(b.ctx, testSpec("s1"))
	if err != nil {
		t.Fatal(err)
	}

	got, err := b.sub.Snapshot(b.ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got != "snap-of-"+ref || len(snap.saved) != 1 {
		t.Errorf("snapshot = %s (saved %v)", got, snap.saved)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("%d pods after the snapshot, want the sandbox stopped", n)
	}
}

func TestRestoreColdStartsAPreparedPodAndLoadsTheSnapshot(t *testing.T) {
	t.Parallel()
	snap := &fakeSnapshotter{}
	b := setupWith(t, setupConfig{snapshotter: snap})

	ref, err := b.sub.Restore(b.ctx, "snap-1", "", testSpec("s1"))
	if err != nil {
		t.Fatal(err)
	}
	if snap.restored[ref] != "snap-1" {
		t.Errorf("restored = %v, want snap-1 loaded into %s", snap.restored, ref)
	}
	if img := b.pod(t, ref).Spec.Containers[0].Image; img != "checkpoint/snap-1" {
		t.Errorf("image = %s, want the one PreparePod set", img)
	}
}

func TestRestoreIntoAWarmSlotAdoptsItAndLoadsTheSnapshot(t *testing.T) {
	t.Parallel()
	snap := &fakeSnapshotter{}
	b := setupWith(t, setupConfig{snapshotter: snap})
	slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
	if err != nil {
		t.Fatal(err)
	}

	ref, err := b.sub.Restore(b.ctx, "snap-1", slot, testSpec("s1"))
	if err != nil {
		t.Fatal(err)
	}
	if ref != slot || snap.restored[slot] != "snap-1" {
		t.Errorf("ref %s, restored %v: want snap-1 loaded into the slot %s", ref, snap.restored, slot)
	}
	if b.pod(t, slot).Labels[labelSandboxID] != "s1" || snap.preparedFor != "" {
		t.Errorf("the warm slot was not adopted, or a cold pod was prepared")
	}
}

func TestRestoreDeletesThePodWhenTheSnapshotDoesNotLoad(t *testing.T) {
	t.Parallel()
	snap := &fakeSnapshotter{restoreErr: errors.New("checkpoint corrupt")}
	b := setupWith(t, setupConfig{snapshotter: snap})

	_, err := b.sub.Restore(b.ctx, "snap-1", "", testSpec("s1"))
	if err == nil || !strings.Contains(err.Error(), "checkpoint corrupt") {
		t.Fatalf("err = %v, want the snapshotter's error", err)
	}
	if n := b.podCount(t); n != 0 {
		t.Errorf("%d pods left behind", n)
	}
}

func TestCheckListsPodsAndSurfacesAPIErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.sub.Check(b.ctx); err != nil {
		t.Fatalf("Check on a healthy API: %v", err)
	}

	b.failOn("list", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: access denied")))
	if err := b.sub.Check(b.ctx); !apierrors.IsForbidden(err) {
		t.Errorf("Check: err = %v, want Forbidden", err)
	}
}

func TestDescribeSaysKubernetesAndTheNamespace(t *testing.T) {
	t.Parallel()
	b := setup(t)

	d := b.sub.Describe()
	if !strings.Contains(d, "kubernetes") || !strings.Contains(d, `"sandboxes"`) || !strings.Contains(d, "no snapshotter") {
		t.Errorf("Describe() = %q", d)
	}
	if b.sub.Name() != "kubernetes" {
		t.Errorf("Name() = %q", b.sub.Name())
	}
}

func TestNewRefusesAMissingClientsetNamespaceOrReadyTimeout(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset()
	for name, opts := range map[string]Options{
		"clientset":    {Namespace: "x", ReadyTimeout: time.Minute},
		"namespace":    {Clientset: cs, ReadyTimeout: time.Minute},
		"ReadyTimeout": {Clientset: cs, Namespace: "x"},
		"negative":     {Clientset: cs, Namespace: "x", ReadyTimeout: -time.Second},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("New without a valid %s succeeded", name)
		}
	}
	s, err := New(Options{Clientset: cs, Namespace: "x", ReadyTimeout: time.Minute})
	if err != nil || s.readyTimeout != time.Minute {
		t.Errorf("New: %v, ready timeout %v", err, s.readyTimeout)
	}
}

func TestFindReturnsEveryPodOfASandboxReadyOrHalfMade(t *testing.T) {
	t.Parallel()
	// The node never gets to the half-made Pod.
	b := setupWith(t, setupConfig{kubelet: func(p *corev1.Pod) *corev1.PodStatus {
		if p.Labels["test/half-made"] == "true" {
			return nil
		}
		return readyKubelet(p)
	}})
	ready, err := b.sub.StartCold(b.ctx, testSpec("11111111-1111-4111-8111-111111111111"))
	if err != nil {
		t.Fatal(err)
	}
	// A Pod of the same sandbox left Pending by an attempt whose replica died: created,
	// never waited for.
	half, err := sandboxPod(testNamespace, testSpec("11111111-1111-4111-8111-111111111111"))
	if err != nil {
		t.Fatal(err)
	}
	half.Labels["test/half-made"] = "true"
	if _, err := b.cs.CoreV1().Pods(testNamespace).Create(b.ctx, half, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.sub.StartCold(b.ctx, testSpec("22222222-2222-4222-8222-222222222222")); err != nil {
		t.Fatal(err)
	}
	testenvEventually(t, func() bool {
		f, err := b.sub.Find(b.ctx, "11111111-1111-4111-8111-111111111111")
		return err == nil && len(f.Resources) == 2
	})
	f, err := b.sub.Find(b.ctx, "11111111-1111-4111-8111-111111111111")
	if err != nil {
		t.Fatal(err)
	}
	got, ok := f.Ready()
	if !ok || got.Ref != ready || got.SandboxID != "11111111-1111-4111-8111-111111111111" || f.Snapshot != "" {
		t.Fatalf("finding %+v, want the ready pod %s among two and no snapshot", f, ready)
	}
	for _, r := range f.Resources {
		if r.Ref != ready && r.Ready {
			t.Fatalf("the pending pod %s reads as ready", r.Ref)
		}
	}
}

func TestListReturnsEverySandboxAndSlotPodItManages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sbRef, err := b.sub.StartCold(b.ctx, testSpec("33333333-3333-4333-8333-333333333333"))
	if err != nil {
		t.Fatal(err)
	}
	slotRef, err := b.sub.Warm(b.ctx, "44444444-4444-4444-8444-444444444444", testShape, testTemplate)
	if err != nil {
		t.Fatal(err)
	}
	// A Pod of someone else's in the namespace is not space's to list, or stop.
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "not-ours", Namespace: testNamespace}}
	if _, err := b.cs.CoreV1().Pods(testNamespace).Create(b.ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	list, err := b.sub.List(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	byRef := map[string]substrate.Resource{}
	for _, r := range list {
		byRef[r.Ref] = r
	}
	if len(list) != 2 || byRef[sbRef].SandboxID != "33333333-3333-4333-8333-333333333333" ||
		byRef[slotRef].SlotID != "44444444-4444-4444-8444-444444444444" || byRef[slotRef].SandboxID != "" {
		t.Fatalf("listed %+v, want the sandbox and the unadopted slot only", list)
	}
	if b.sub.Timeout() <= 10*time.Second {
		t.Fatalf("timeout %v does not cover the ready timeout of 10s", b.sub.Timeout())
	}
}

// testenvEventually polls cond for a few seconds: the fake clientset's watchers apply
// status updates asynchronously.
func testenvEventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
