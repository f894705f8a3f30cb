package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/internal/testenv/kubeenv"
)

// Every test here runs against a real kube-apiserver and etcd (internal/testenv/kubeenv),
// shared by the package's tests, each in a namespace of its own, with kubeenv's
// Kubelet playing the node and the storage controllers.

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

type bundle struct {
	sub     *Substrate
	cs      k8s.Interface
	dyn     dynamic.Interface
	ns      string
	srv     *kubeenv.Server
	kubelet *kubeenv.Kubelet
	logs    *logRecorder
	ctx     context.Context
}

type setupConfig struct {
	// status is the kubelet's (kubeenv.KubeletOptions.PodStatus); nil: Ready.
	status          func(*corev1.Pod, string) *corev1.PodStatus
	keepTerminating bool
	readyTimeout    time.Duration
	// snapshots configures kubeenv's VolumeSnapshotClass.
	snapshots    bool
	storageClass string
}

// setup returns a substrate in a fresh namespace of the test API server, whose
// kubelet makes every Pod Ready.
func setup(t *testing.T) bundle {
	t.Helper()
	return setupWith(t, setupConfig{})
}

// testMountPath is where the tests mount a sandbox's claim: the default of
// SPACE_KUBERNETES_VOLUME_MOUNT_PATH.
const testMountPath = "/workspace"

func setupWith(t *testing.T, c setupConfig) bundle {
	t.Helper()
	srv := kubeenv.Start(t)
	ns := srv.Namespace(t)
	kubelet := srv.StartKubelet(t, ns, kubeenv.KubeletOptions{PodStatus: c.status, KeepTerminating: c.keepTerminating})
	if c.readyTimeout == 0 {
		c.readyTimeout = 30 * time.Second // generous: only the deadline test waits it out
	}
	opts := Options{Clientset: srv.Clientset, Namespace: ns, ReadyTimeout: c.readyTimeout, StorageClass: c.storageClass, MountPath: testMountPath}
	if c.snapshots {
		opts.SnapshotClass, opts.Dynamic = kubeenv.SnapshotClass, srv.Dynamic
	}
	logs := &logRecorder{}
	opts.Logger = slog.New(logs)
	sub, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return bundle{sub: sub, cs: srv.Clientset, dyn: srv.Dynamic, ns: ns, srv: srv, kubelet: kubelet, logs: logs, ctx: ctx}
}

func (b bundle) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod, err := b.cs.CoreV1().Pods(b.ns).Get(b.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return pod
}

func (b bundle) claim(t *testing.T, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Get(b.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get claim %s: %v", name, err)
	}
	return c
}

func (b bundle) pods(t *testing.T) []corev1.Pod {
	t.Helper()
	list, err := b.cs.CoreV1().Pods(b.ns).List(b.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func (b bundle) claims(t *testing.T) []corev1.PersistentVolumeClaim {
	t.Helper()
	list, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).List(b.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func (b bundle) snapshots(t *testing.T) []unstructured.Unstructured {
	t.Helper()
	list, err := b.dyn.Resource(volumeSnapshotGVR).Namespace(b.ns).List(b.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// settled waits until the namespace holds exactly pods Pods and claims claims: the
// kubelet removes deleted Pods and releases unused claims asynchronously.
func (b bundle) settled(t *testing.T, pods, claims int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the namespace to settle", func() bool {
		return len(b.pods(t)) == pods && len(b.claims(t)) == claims
	})
}

// logRecorder is a slog handler that keeps the messages the substrate logs.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
	seen chan struct{}
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	if l.seen != nil {
		select {
		case l.seen <- struct{}{}:
		default:
		}
	}
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, msg) {
			return true
		}
	}
	return false
}

func TestColdStart(t *testing.T) {
	t.Parallel()

	t.Run("a sandbox is a ready pod of its template on a claim of its own, sized by its shape", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		ref, err := b.sub.StartCold(b.ctx, testSpec("sbx_01J9ZK"))
		if err != nil {
			t.Fatal(err)
		}
		pod := b.pod(t, ref)
		if !podReady(pod) || pod.Spec.NodeName != kubeenv.NodeName || pod.Status.PodIP == "" {
			t.Errorf("StartCold returned before the pod was scheduled and ready: node %q, %+v", pod.Spec.NodeName, pod.Status)
		}
		if !strings.HasPrefix(ref, "sbx-sbx-01j9zk-") {
			t.Errorf("pod name %q does not start with the sandbox id", ref)
		}
		wantLabels := map[string]string{
			labelSandboxID: "sbx_01J9ZK", labelClient: "acme", labelTemplate: "python-3.12",
			labelCPU: "1500", labelMemory: "2048", labelDisk: "10", labelManagedBy: "space-api",
		}
		for k, v := range wantLabels {
			if pod.Labels[k] != v {
				t.Errorf("label %s = %q, want %q", k, pod.Labels[k], v)
			}
		}
		if _, ok := pod.Labels[labelPool]; ok {
			t.Errorf("a sandbox pod carries the pool label")
		}
		c := pod.Spec.Containers[0]
		if c.Name != "runner" || c.Image != "python:3.12-slim" {
			t.Errorf("first container = %s %s, want runner with the template's image", c.Name, c.Image)
		}
		for name, want := range map[corev1.ResourceName]string{
			corev1.ResourceCPU: "1500m", corev1.ResourceMemory: "2Gi", corev1.ResourceEphemeralStorage: "10Gi",
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
		if pod.Status.QOSClass != corev1.PodQOSBurstable { // the sidecar has no requests
			t.Errorf("QoS class %s set by the server, want Burstable", pod.Status.QOSClass)
		}

		claim := podClaim(pod)
		if want := "data-sbx-" + nameBase("sbx_01J9ZK"); claim != want || !strings.HasPrefix(claim, "data-sbx-sbx-01j9zk-") {
			t.Errorf("claim %q, want %s, named for the sandbox", claim, want)
		}
		var mounted bool
		for _, m := range c.VolumeMounts {
			mounted = mounted || m.Name == volumeName && m.MountPath == testMountPath
		}
		if !mounted {
			t.Errorf("the claim is not mounted at %s: %+v", testMountPath, c.VolumeMounts)
		}
		pvc := b.claim(t, claim)
		if q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; q.Cmp(resource.MustParse("10Gi")) != 0 {
			t.Errorf("claim requests %s, want the shape's 10Gi", q.String())
		}
		// The server's DefaultStorageClass admission gave it the cluster default.
		if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != kubeenv.DefaultStorageClass || pvc.Status.Phase != corev1.ClaimBound {
			t.Errorf("claim class %v phase %s, want the cluster default, bound", pvc.Spec.StorageClassName, pvc.Status.Phase)
		}
		if pvc.Labels[labelSandboxID] != "sbx_01J9ZK" || pvc.Annotations[annotationSandboxID] != "sbx_01J9ZK" || pvc.Labels[labelManagedBy] != managedBy {
			t.Errorf("claim labels %v annotations %v", pvc.Labels, pvc.Annotations)
		}
		if !hasFinalizer(pvc, "kubernetes.io/pvc-protection") {
			t.Errorf("the server's StorageObjectInUseProtection did not protect the claim: %v", pvc.Finalizers)
		}
	})

	t.Run("a configured storage class is the claim's", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{storageClass: kubeenv.DefaultStorageClass})
		spec := testSpec("s1")
		spec.Shape.DiskGiB = 0
		ref, err := b.sub.StartCold(b.ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		pvc := b.claim(t, podClaim(b.pod(t, ref)))
		if q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; q.Cmp(resource.MustParse("1Gi")) != 0 {
			t.Errorf("a shape without disk got a claim of %s, want the 1Gi minimum", q.String())
		}
	})

	t.Run("a template without a pod spec runs one container of its image", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		spec := testSpec("s1")
		spec.Template = substrate.Template{Name: "node-22", Image: "node:22-slim"}

		ref, err := b.sub.StartCold(b.ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		pod := b.pod(t, ref)
		if cs := pod.Spec.Containers; len(cs) != 1 || cs[0].Name != "sandbox" || cs[0].Image != "node:22-slim" {
			t.Errorf("containers = %+v, want one named sandbox running node:22-slim", cs)
		}
		if pod.Status.QOSClass != corev1.PodQOSGuaranteed {
			t.Errorf("QoS %s, want Guaranteed for one container with equal requests and limits", pod.Status.QOSClass)
		}
	})

	t.Run("a pod that becomes ready later is waited for through the watch", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{status: func(p *corev1.Pod, ip string) *corev1.PodStatus {
			return &corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}}}
		}})
		done := make(chan error, 1)
		var ref string
		go func() {
			var err error
			ref, err = b.sub.StartCold(b.ctx, testSpec("late"))
			done <- err
		}()
		var pending *corev1.Pod
		testenv.Eventually(t, 30*time.Second, "the pod to be reported not ready", func() bool {
			for _, p := range b.pods(t) {
				for _, c := range p.Status.Conditions {
					if c.Reason == "ContainersNotReady" {
						pending = &p
						return true
					}
				}
			}
			return false
		})
		select {
		case err := <-done:
			t.Fatalf("StartCold returned (%v) while the pod was not ready", err)
		default:
		}
		st := kubeenv.ReadyStatus(pending, "10.244.9.9")
		body, _ := json.Marshal(map[string]any{"status": st})
		if _, err := b.cs.CoreV1().Pods(b.ns).Patch(b.ctx, pending.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if ref != pending.Name || !podReady(b.pod(t, ref)) {
			t.Errorf("StartCold returned %s, want the pod %s once ready", ref, pending.Name)
		}
	})

	t.Run("a pod not ready by the deadline is deleted with its claim and fails", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{status: func(*corev1.Pod, string) *corev1.PodStatus { return nil }, readyTimeout: time.Second})

		_, err := b.sub.StartCold(b.ctx, testSpec("stuck"))
		if !errors.Is(err, ErrNotReady) {
			t.Fatalf("err = %v, want ErrNotReady", err)
		}
		if !strings.Contains(err.Error(), "not ready after 1s") || !strings.Contains(err.Error(), "stuck") {
			t.Errorf("the error does not say what timed out: %v", err)
		}
		b.settled(t, 0, 0)
	})

	t.Run("a pod whose claim is missing waits, unschedulable, and the error says so", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{readyTimeout: time.Second})
		pod, err := sandboxPod(b.ns, testSpec("orphan"), "data-nobody", testMountPath, "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.sub.createReady(b.ctx, pod, labelSandboxID, "orphan", testTemplate)
		if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "Unschedulable") || !strings.Contains(err.Error(), "data-nobody") {
			t.Fatalf("err = %v, want ErrNotReady naming the unschedulable pod's missing claim", err)
		}
	})

	t.Run("a pod that fails is given up at once", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{status: func(*corev1.Pod, string) *corev1.PodStatus {
			return &corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "node low on ephemeral-storage"}
		}, readyTimeout: time.Hour})

		_, err := b.sub.StartCold(b.ctx, testSpec("evicted"))
		if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "Evicted") {
			t.Fatalf("err = %v, want ErrNotReady naming the eviction", err)
		}
		b.settled(t, 0, 0)
	})

	t.Run("the caller giving up deletes the pod and its claim", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The node cancels the caller as soon as it sees the pod.
		b := setupWith(t, setupConfig{status: func(*corev1.Pod, string) *corev1.PodStatus { cancel(); return nil }, readyTimeout: time.Hour})

		_, err := b.sub.StartCold(ctx, testSpec("abandoned"))
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotReady) {
			t.Fatalf("err = %v, want the caller's context.Canceled", err)
		}
		b.settled(t, 0, 0)
	})

	t.Run("a pod the server rejects is a 422 naming the template, and nothing is left", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		spec := testSpec("s1")
		// Decodes as a PodSpec, and only the server's validation refuses it.
		spec.Template.Pod = json.RawMessage(`{"containers": [{"name": "Not_A_DNS_Label"}], "restartPolicy": "Sometimes"}`)

		_, err := b.sub.StartCold(b.ctx, spec)
		var serr *space.Error
		if space.ErrorCode(err) != space.EUNPROCESSABLE || !errors.As(err, &serr) || serr.Field != "template" {
			t.Fatalf("err = %v, want the product's 422 on the template field", err)
		}
		for _, want := range []string{`template "python-3.12"`, "spec.containers[0].name", "spec.restartPolicy"} {
			if !strings.Contains(serr.Message, want) {
				t.Errorf("the 422's message %q does not name %s", serr.Message, want)
			}
		}
		if !apierrors.IsInvalid(err) {
			t.Errorf("the server's 422 is not kept in the chain: %v", err)
		}
		b.settled(t, 0, 0)
	})

	t.Run("a start the service account may not make is the server's Forbidden, and its claim is removed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// May make and remove claims and read pods, but not create them.
		sub := b.restricted(t, []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"create", "get", "delete"}},
		})

		_, err := sub.StartCold(b.ctx, testSpec("s1"))
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "start sandbox s1") || !strings.Contains(err.Error(), `cannot create resource "pods"`) {
			t.Fatalf("err = %v, want the server's Forbidden wrapped with the sandbox", err)
		}
		b.settled(t, 0, 0)
	})

	t.Run("a second start of a sandbox reuses the first one's pod, and its claim through a 409", func(t *testing.T) {
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
		if second != first || len(b.pods(t)) != 1 || len(b.claims(t)) != 1 {
			t.Errorf("a retried start made pod %s next to %s (%d pods, %d claims), want the first reused", second, first, len(b.pods(t)), len(b.claims(t)))
		}
		if !b.logs.has("reusing the claim of an earlier attempt") {
			t.Errorf("the claim was not reused through the server's AlreadyExists")
		}
	})

	t.Run("a misspelt field in the template's pod spec is refused before anything is made", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		spec := testSpec("s1")
		spec.Template.Pod = json.RawMessage(`{"containers": [{"name": "a", "imagePullPolcy": "Always"}]}`)

		_, err := b.sub.StartCold(b.ctx, spec)
		if err == nil || !strings.Contains(err.Error(), "imagePullPolcy") {
			t.Fatalf("err = %v, want the misspelt field named", err)
		}
		b.settled(t, 0, 0)
	})
}

// restricted returns a substrate over the namespace that authenticates as a service
// account granted only rules.
func (b bundle) restricted(t *testing.T, rules []rbacv1.PolicyRule) *Substrate {
	t.Helper()
	rbac := b.cs.RbacV1()
	name := "restricted"
	if _, err := b.cs.CoreV1().ServiceAccounts(b.ns).Create(b.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.Roles(b.ns).Create(b.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(b.ns).Create(b.ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: b.ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(b.srv.TokenConfig(b.srv.ServiceAccountToken(t, b.ns, name)))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := New(Options{Clientset: cs, Namespace: b.ns, ReadyTimeout: 30 * time.Second, MountPath: testMountPath})
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

func hasFinalizer(c *corev1.PersistentVolumeClaim, f string) bool {
	for _, v := range c.Finalizers {
		if v == f {
			return true
		}
	}
	return false
}

func TestWarmPool(t *testing.T) {
	t.Parallel()

	t.Run("a warm slot is a ready pod and claim without an owner", func(t *testing.T) {
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
		if _, ok := pod.Labels[labelSandboxID]; ok || !podReady(pod) {
			t.Errorf("a fresh slot has a sandbox label, or is not ready: %v", pod.Labels)
		}
		pvc := b.claim(t, podClaim(pod))
		if pvc.Labels[labelPool] != "true" || pvc.Annotations[annotationSlotID] != "slot-7" || pvc.Annotations[annotationSandboxID] != "" {
			t.Errorf("slot claim labels %v annotations %v", pvc.Labels, pvc.Annotations)
		}
	})

	t.Run("adopting a slot relabels its pod and then its claim as the sandbox's", func(t *testing.T) {
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
		pod := b.pod(t, ref)
		if ref != slot || pod.Labels[labelSandboxID] != "sbx-9" || pod.Labels[labelClient] != "acme" || pod.Labels[labelSlotID] != "slot-1" {
			t.Errorf("ref %s labels %v, want the slot's pod with the sandbox, its client and the slot it came from", ref, pod.Labels)
		}
		if _, ok := pod.Labels[labelPool]; ok {
			t.Errorf("the adopted pod is still labelled a pool member: %v", pod.Labels)
		}
		pvc := b.claim(t, podClaim(pod))
		if _, ok := pvc.Labels[labelPool]; ok || pvc.Labels[labelSandboxID] != "sbx-9" || pvc.Annotations[annotationSandboxID] != "sbx-9" {
			t.Errorf("the claim was not made the sandbox's: labels %v annotations %v", pvc.Labels, pvc.Annotations)
		}

		// Adopting again for the same sandbox (a retry) is fine; for another, taken.
		if _, err := b.sub.Adopt(b.ctx, slot, testSpec("sbx-9")); err != nil {
			t.Errorf("a retried adoption failed: %v", err)
		}
		if _, err := b.sub.Adopt(b.ctx, slot, testSpec("sbx-10")); !errors.Is(err, substrate.ErrSlotTaken) {
			t.Errorf("adopting another sandbox's pod: err = %v, want ErrSlotTaken", err)
		}
	})

	t.Run("another replica adopting the slot between the read and the update is ErrSlotTaken", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
		if err != nil {
			t.Fatal(err)
		}
		other, err := New(Options{Clientset: b.cs, Namespace: b.ns, ReadyTimeout: 30 * time.Second, MountPath: testMountPath})
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		b.sub.beforeAdopt = func(*corev1.Pod) {
			once.Do(func() {
				if _, err := other.Adopt(b.ctx, slot, testSpec("sbx-other")); err != nil {
					t.Errorf("the other replica's adoption: %v", err)
				}
			})
		}

		_, err = b.sub.Adopt(b.ctx, slot, testSpec("sbx-1"))
		if !errors.Is(err, substrate.ErrSlotTaken) {
			t.Fatalf("err = %v, want ErrSlotTaken", err)
		}
		if owner := b.pod(t, slot).Labels[labelSandboxID]; owner != "sbx-other" {
			t.Errorf("the slot belongs to %q, want the replica that won", owner)
		}
	})

	t.Run("a status write between the read and the update is a conflict the adoption survives", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
		if err != nil {
			t.Fatal(err)
		}
		var conflicts int
		b.sub.beforeAdopt = func(read *corev1.Pod) {
			if conflicts++; conflicts > 2 {
				return
			}
			// The kubelet reports on the pod: its resourceVersion moves on.
			st := read.Status.DeepCopy()
			st.Message = "heartbeat " + time.Now().String()
			body, _ := json.Marshal(map[string]any{"status": st})
			if _, err := b.cs.CoreV1().Pods(b.ns).Patch(b.ctx, slot, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
				t.Errorf("status write: %v", err)
			}
		}

		ref, err := b.sub.Adopt(b.ctx, slot, testSpec("sbx-1"))
		if err != nil {
			t.Fatalf("err = %v, want the adoption to survive two conflicts", err)
		}
		if conflicts != 3 || b.pod(t, ref).Labels[labelSandboxID] != "sbx-1" {
			t.Errorf("%d reads, owner %q: want two conflicting updates, then the adoption", conflicts, b.pod(t, ref).Labels[labelSandboxID])
		}
	})

	t.Run("a missing slot is not found, and one of another shape is refused as it is", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.sub.Adopt(b.ctx, "slot-gone-abcde", testSpec("sbx-1")); !errors.Is(err, substrate.ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
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
	})

	t.Run("stopping an unadopted slot removes its claim, stopping a sandbox keeps it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
		if err != nil {
			t.Fatal(err)
		}
		sbx, err := b.sub.StartCold(b.ctx, testSpec("s1"))
		if err != nil {
			t.Fatal(err)
		}
		kept := podClaim(b.pod(t, sbx))

		for _, ref := range []string{slot, sbx, slot} {
			if err := b.sub.Stop(b.ctx, ref); err != nil {
				t.Fatalf("Stop(%s): %v", ref, err)
			}
		}
		b.settled(t, 0, 1)
		if got := b.claims(t)[0].Name; got != kept {
			t.Errorf("claim %s is left, want the sandbox's %s", got, kept)
		}
	})
}

func TestPauseAndRestore(t *testing.T) {
	t.Parallel()

	t.Run("a pause deletes the pod and keeps the claim, and a restore starts a pod on it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const id = "11111111-1111-4111-8111-111111111111"
		ref, err := b.sub.StartCold(b.ctx, testSpec(id))
		if err != nil {
			t.Fatal(err)
		}
		claim := podClaim(b.pod(t, ref))

		snap, err := b.sub.Snapshot(b.ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if snap != claimRefPrefix+claim {
			t.Errorf("snapshot ref %q, want the kept claim's", snap)
		}
		// The pod is gone when the pause returns, not merely terminating.
		if _, err := b.cs.CoreV1().Pods(b.ns).Get(b.ctx, ref, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the paused pod is still there: %v", err)
		}
		f, err := b.sub.Find(b.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Resources) != 0 || len(f.Storage) != 1 || f.Storage[0].Ref != snap || f.Snapshot != snap {
			t.Errorf("finding after the pause %+v, want no pod, the claim kept and named the snapshot", f)
		}

		restored, err := b.sub.Restore(b.ctx, snap, "", testSpec(id))
		if err != nil {
			t.Fatal(err)
		}
		pod := b.pod(t, restored)
		if restored == ref || podClaim(pod) != claim || !podReady(pod) {
			t.Errorf("restored pod %s on claim %q, want a new ready pod on %s", restored, podClaim(pod), claim)
		}
		if len(b.claims(t)) != 1 {
			t.Errorf("%d claims after the restore, want the one kept", len(b.claims(t)))
		}
	})

	t.Run("with a snapshot class a pause also takes a ready volume snapshot, and keeps only the newest", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{snapshots: true})
		const id = "22222222-2222-4222-8222-222222222222"
		ref, err := b.sub.StartCold(b.ctx, testSpec(id))
		if err != nil {
			t.Fatal(err)
		}
		claim := podClaim(b.pod(t, ref))
		var refs []string
		for range 2 {
			snap, err := b.sub.Snapshot(b.ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(snap, snapshotRefPrefix) {
				t.Fatalf("snapshot ref %q, want a volume snapshot", snap)
			}
			refs = append(refs, snap)
			if ref, err = b.sub.Restore(b.ctx, snap, "", testSpec(id)); err != nil {
				t.Fatal(err)
			}
			if podClaim(b.pod(t, ref)) != claim {
				t.Errorf("the restore did not start on the kept claim %s", claim)
			}
		}
		snaps := b.snapshots(t)
		if len(snaps) != 1 || snapshotRefPrefix+snaps[0].GetName() != refs[1] {
			t.Fatalf("snapshots %v, want only the newest, %s", names(snaps), refs[1])
		}
		sn := snapshotOf(&snaps[0])
		source, _, _ := unstructured.NestedString(snaps[0].Object, "spec", "source", "persistentVolumeClaimName")
		class, _, _ := unstructured.NestedString(snaps[0].Object, "spec", "volumeSnapshotClassName")
		if !sn.ready || sn.sandboxID != id || source != claim || class != kubeenv.SnapshotClass {
			t.Errorf("snapshot %+v of %s with class %s", sn, source, class)
		}
	})

	t.Run("a restore whose claim is gone makes one from the newest snapshot", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{snapshots: true})
		const id = "33333333-3333-4333-8333-333333333333"
		ref, err := b.sub.StartCold(b.ctx, testSpec(id))
		if err != nil {
			t.Fatal(err)
		}
		claim := podClaim(b.pod(t, ref))
		snap, err := b.sub.Snapshot(b.ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.sub.Stop(b.ctx, claimRefPrefix+claim); err != nil {
			t.Fatal(err)
		}
		b.settled(t, 0, 0)

		restored, err := b.sub.Restore(b.ctx, snap, "", testSpec(id))
		if err != nil {
			t.Fatal(err)
		}
		pvc := b.claim(t, podClaim(b.pod(t, restored)))
		ds := pvc.Spec.DataSource
		if ds == nil || ds.Kind != "VolumeSnapshot" || snapshotRefPrefix+ds.Name != snap || pvc.Annotations[annotationSandboxID] != id {
			t.Errorf("the restored claim's data source is %+v, want the snapshot %s", ds, snap)
		}
		if !b.logs.has("restoring a sandbox from its volume snapshot") {
			t.Errorf("the restore from a snapshot was not logged")
		}
	})

	t.Run("a restore with neither its claim nor a snapshot is not found", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{snapshots: true})
		_, err := b.sub.Restore(b.ctx, "pvc/data-sbx-gone", "", testSpec("gone"))
		if !errors.Is(err, substrate.ErrNotFound) || !strings.Contains(err.Error(), "neither its volume claim nor a ready volume snapshot") {
			t.Fatalf("err = %v, want ErrNotFound saying what is missing", err)
		}
		b.settled(t, 0, 0)
	})

	t.Run("a warm restore is refused and leaves the slot in the pool", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if substrate.RestoresWarm(b.sub) {
			t.Fatal("the kubernetes substrate says it restores into warm slots")
		}
		slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.sub.Restore(b.ctx, "pvc/data-sbx-s1", slot, testSpec("s1"))
		if !errors.Is(err, substrate.ErrUnsupported) || !strings.Contains(err.Error(), "cannot mount") {
			t.Fatalf("err = %v, want ErrUnsupported saying the slot cannot mount the sandbox's volume", err)
		}
		if pod := b.pod(t, slot); pod.Labels[labelPool] != "true" || !podReady(pod) {
			t.Errorf("the slot was touched: %v", pod.Labels)
		}
	})

	t.Run("an adopted slot whose claim was not relabelled is still found, and its pause makes the claim the sandbox's", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const id = "44444444-4444-4444-8444-444444444444"
		slot, err := b.sub.Warm(b.ctx, "slot-1", testShape, testTemplate)
		if err != nil {
			t.Fatal(err)
		}
		claim := podClaim(b.pod(t, slot))
		// An adoption whose replica died between relabelling the pod and the claim.
		pod := b.pod(t, slot)
		relabelForSandbox(pod, testSpec(id))
		if _, err := b.cs.CoreV1().Pods(b.ns).Update(b.ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f, err := b.sub.Find(b.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Storage) != 1 || f.Storage[0].Ref != claimRefPrefix+claim || f.Storage[0].SandboxID != id {
			t.Fatalf("storage %+v, want the slot's claim found through the pod that mounts it", f.Storage)
		}
		list, err := b.sub.List(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list {
			if r.Ref == claimRefPrefix+claim && r.SandboxID != id {
				t.Errorf("List reports the claim as %+v, want it the sandbox's", r)
			}
		}

		snap, err := b.sub.Snapshot(b.ctx, slot)
		if err != nil {
			t.Fatal(err)
		}
		pvc := b.claim(t, claim)
		if snap != claimRefPrefix+claim || pvc.Annotations[annotationSandboxID] != id || pvc.Labels[labelPool] != "" {
			t.Errorf("paused onto %s; claim labels %v annotations %v, want it the sandbox's", snap, pvc.Labels, pvc.Annotations)
		}
		if f, _ := b.sub.Find(b.ctx, id); f.Snapshot != snap {
			t.Errorf("after the pause Find names %q, want %s", f.Snapshot, snap)
		}
	})

	t.Run("a pod without a volume cannot be paused and keeps running", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pod, err := sandboxPod(b.ns, testSpec("old"), "unused", testMountPath, "")
		if err != nil {
			t.Fatal(err)
		}
		pod.Spec.Volumes = nil
		pod.Spec.Containers[0].VolumeMounts = nil
		ready, err := b.sub.createReady(b.ctx, pod, labelSandboxID, "old", testTemplate)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.sub.Snapshot(b.ctx, ready.Name)
		if !errors.Is(err, substrate.ErrUnsupported) {
			t.Fatalf("err = %v, want ErrUnsupported", err)
		}
		if !podReady(b.pod(t, ready.Name)) {
			t.Errorf("the pod of a refused pause is gone")
		}
	})

	t.Run("stopping a claim and a snapshot removes them, and what is gone already is no error", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{snapshots: true})
		ref, err := b.sub.StartCold(b.ctx, testSpec("s1"))
		if err != nil {
			t.Fatal(err)
		}
		claim := claimRefPrefix + podClaim(b.pod(t, ref))
		snap, err := b.sub.Snapshot(b.ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []string{snap, claim, snap, claim} {
			if err := b.sub.Stop(b.ctx, r); err != nil {
				t.Fatalf("Stop(%s): %v", r, err)
			}
		}
		b.settled(t, 0, 0)
		if n := len(b.snapshots(t)); n != 0 {
			t.Errorf("%d snapshots left", n)
		}
	})
}

func names(objs []unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetName())
	}
	return out
}

func TestWatch(t *testing.T) {
	t.Parallel()

	t.Run("an expired watch resumes by relisting", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{status: func(*corev1.Pod, string) *corev1.PodStatus { return nil }})
		pod, err := sandboxPod(b.ns, testSpec("s1"), "unused", testMountPath, "")
		if err != nil {
			t.Fatal(err)
		}
		pod.Spec.Volumes, pod.Spec.Containers[0].VolumeMounts = nil, nil
		created, err := b.cs.CoreV1().Pods(b.ns).Create(b.ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// A wait that last saw the pod at a version the server compacted long ago, as
		// one that lost its watch for minutes would be.
		b.srv.WaitCompacted(t, "1")
		stale := created.DeepCopy()
		stale.ResourceVersion = "1"
		b.logs.seen = make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() {
			_, err := b.sub.waitReady(b.ctx, stale)
			done <- err
		}()
		testenv.Eventually(t, 30*time.Second, "the expired watch to be relisted", func() bool { return b.logs.has("watch expired; relisting") })
		select {
		case err := <-done:
			t.Fatalf("the wait ended (%v) before the pod was ready", err)
		default:
		}
		st := kubeenv.ReadyStatus(b.pod(t, created.Name), "10.244.7.7")
		body, _ := json.Marshal(map[string]any{"status": st})
		if _, err := b.cs.CoreV1().Pods(b.ns).Patch(b.ctx, created.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("the wait after the relist: %v", err)
		}
	})

	t.Run("a pod deleted while it is awaited fails the wait", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{status: func(p *corev1.Pod, _ string) *corev1.PodStatus { return nil }})
		done := make(chan error, 1)
		go func() {
			_, err := b.sub.StartCold(b.ctx, testSpec("doomed"))
			done <- err
		}()
		testenv.Eventually(t, 30*time.Second, "the pod to exist", func() bool { return len(b.pods(t)) == 1 })
		if err := b.cs.CoreV1().Pods(b.ns).Delete(b.ctx, b.pods(t)[0].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "deleted before it became ready") {
			t.Fatalf("err = %v, want ErrNotReady saying the pod was deleted", err)
		}
	})
}

func TestFindListAndCheck(t *testing.T) {
	t.Parallel()

	t.Run("find reports every pod of a sandbox, ready or half made, and its claim as storage", func(t *testing.T) {
		t.Parallel()
		// The node never gets to the half-made Pod.
		b := setupWith(t, setupConfig{status: func(p *corev1.Pod, ip string) *corev1.PodStatus {
			if p.Labels["test/half-made"] == "true" {
				return nil
			}
			st := kubeenv.ReadyStatus(p, ip)
			return &st
		}})
		const id = "55555555-5555-4555-8555-555555555555"
		ready, err := b.sub.StartCold(b.ctx, testSpec(id))
		if err != nil {
			t.Fatal(err)
		}
		claim := podClaim(b.pod(t, ready))
		// A Pod of the same sandbox left Pending by an attempt whose replica died:
		// created, never waited for.
		half, err := sandboxPod(b.ns, testSpec(id), claim, testMountPath, "")
		if err != nil {
			t.Fatal(err)
		}
		half.Labels["test/half-made"] = "true"
		if _, err := b.cs.CoreV1().Pods(b.ns).Create(b.ctx, half, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.sub.StartCold(b.ctx, testSpec("66666666-6666-4666-8666-666666666666")); err != nil {
			t.Fatal(err)
		}
		f, err := b.sub.Find(b.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := f.Ready()
		if !ok || got.Ref != ready || got.SandboxID != id || len(f.Resources) != 2 {
			t.Fatalf("finding %+v, want the ready pod %s among two", f, ready)
		}
		for _, r := range f.Resources {
			if r.Ref != ready && r.Ready {
				t.Fatalf("the pending pod %s reads as ready", r.Ref)
			}
		}
		if len(f.Storage) != 1 || f.Storage[0].Ref != claimRefPrefix+claim || !f.Storage[0].Storage || f.Snapshot != claimRefPrefix+claim {
			t.Fatalf("storage %+v snapshot %q, want the sandbox's claim", f.Storage, f.Snapshot)
		}
	})

	t.Run("list reports the sandboxes, slots, claims and snapshots it manages, and nothing else", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{snapshots: true})
		const sbxID, slotID, pausedID = "77777777-7777-4777-8777-777777777777", "88888888-8888-4888-8888-888888888888", "99999999-9999-4999-8999-999999999999"
		sbRef, err := b.sub.StartCold(b.ctx, testSpec(sbxID))
		if err != nil {
			t.Fatal(err)
		}
		slotRef, err := b.sub.Warm(b.ctx, slotID, testShape, testTemplate)
		if err != nil {
			t.Fatal(err)
		}
		paused, err := b.sub.StartCold(b.ctx, testSpec(pausedID))
		if err != nil {
			t.Fatal(err)
		}
		snap, err := b.sub.Snapshot(b.ctx, paused)
		if err != nil {
			t.Fatal(err)
		}
		// A Pod and a claim of someone else's in the namespace are not space's to
		// list, or stop.
		other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "not-ours"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if _, err := b.cs.CoreV1().Pods(b.ns).Create(b.ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		otherClaim := baseClaim(b.ns, "x", "not-ours", testShape, "")
		otherClaim.Labels = nil
		if _, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Create(b.ctx, otherClaim, metav1.CreateOptions{}); err != nil {
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
		want := map[string]substrate.Resource{
			sbRef:   {SandboxID: sbxID, Ready: true},
			slotRef: {SlotID: slotID, Ready: true},
			claimRefPrefix + podClaim(b.pod(t, sbRef)):   {SandboxID: sbxID, Ready: true, Storage: true},
			claimRefPrefix + podClaim(b.pod(t, slotRef)): {SlotID: slotID, Ready: true, Storage: true},
			claimRefPrefix + "data-sbx-" + pausedID:      {SandboxID: pausedID, Ready: true, Storage: true},
			snap:                                         {SandboxID: pausedID, Ready: true, Storage: true},
		}
		if len(list) != len(want) {
			t.Errorf("listed %d resources, want %d: %+v", len(list), len(want), list)
		}
		for ref, w := range want {
			got, ok := byRef[ref]
			got.Ref, got.Created = "", time.Time{}
			if !ok || got != w {
				t.Errorf("%s: listed %+v (found %v), want %+v", ref, got, ok, w)
			}
		}
		if b.sub.Timeout() <= 30*time.Second {
			t.Errorf("timeout %v does not cover the ready timeout of 30s", b.sub.Timeout())
		}
	})

	t.Run("check lists pods and claims, and reports a service account that may not", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{snapshots: true})
		if err := b.sub.Check(b.ctx); err != nil {
			t.Fatalf("Check as the administrator: %v", err)
		}
		sub := b.restricted(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}})
		if err := sub.Check(b.ctx); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "persistentvolumeclaims") {
			t.Errorf("Check without the right to list claims: err = %v, want Forbidden naming them", err)
		}
	})

	t.Run("describe says where sandboxes run and what a pause keeps", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupConfig{snapshots: true})
		d := b.sub.Describe()
		for _, want := range []string{"kubernetes", `"` + b.ns + `"`, "default StorageClass", testMountPath, kubeenv.SnapshotClass, "memory and processes do not"} {
			if !strings.Contains(d, want) {
				t.Errorf("Describe() = %q, want it to say %s", d, want)
			}
		}
		if b.sub.Name() != "kubernetes" {
			t.Errorf("Name() = %q", b.sub.Name())
		}
	})
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	cs := k8s.New(nil)
	for name, opts := range map[string]Options{
		"a clientset":                         {Namespace: "x", ReadyTimeout: time.Minute, MountPath: testMountPath},
		"a namespace":                         {Clientset: cs, ReadyTimeout: time.Minute, MountPath: testMountPath},
		"a ready timeout":                     {Clientset: cs, Namespace: "x", MountPath: testMountPath},
		"a positive timeout":                  {Clientset: cs, Namespace: "x", ReadyTimeout: -time.Second, MountPath: testMountPath},
		"a mount path":                        {Clientset: cs, Namespace: "x", ReadyTimeout: time.Minute},
		"a dynamic client for snapshots with": {Clientset: cs, Namespace: "x", ReadyTimeout: time.Minute, MountPath: testMountPath, SnapshotClass: "csi"},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("New without %s succeeded", name)
		}
	}
	s, err := New(Options{Clientset: cs, Namespace: "x", ReadyTimeout: time.Minute, MountPath: testMountPath})
	if err != nil || s.readyTimeout != time.Minute || s.mountPath != testMountPath {
		t.Errorf("New: %v, ready timeout %v, mount path %s", err, s.readyTimeout, s.mountPath)
	}
}
