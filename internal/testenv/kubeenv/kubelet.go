package kubeenv

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Kubelet plays, for one namespace, what a cluster's nodes and controllers do and
// this API server lacks:
//
//   - the scheduler: a Pod whose claims all exist (and, for a claim made from a
//     snapshot, whose snapshot is ready) is bound to NodeName; one whose claim is
//     missing or being deleted stays Pending, PodScheduled False with reason
//     Unschedulable, as the scheduler reports it;
//   - the kubelet: a bound Pod gets the status KubeletOptions.PodStatus decides
//     (Running and Ready with a Pod IP by default), written through the status
//     subresource; a bound Pod being deleted is removed (deleted again with a grace
//     period of 0), as a kubelet does once its containers stopped;
//   - the volume binder: the claims of a bound Pod become Bound with their requested
//     capacity;
//   - the snapshot controller: a VolumeSnapshot of an existing claim becomes ready to
//     use, its restore size the claim's;
//   - the PVC protection controller: a claim being deleted keeps its
//     kubernetes.io/pvc-protection finalizer while a Pod uses it, and loses it
//     after, so that it is then removed.
//
// It reacts to watches (informers), never polls. It writes a Pod's status once; a
// test may write it again itself.
type Kubelet struct {
	s         *Server
	namespace string
	opts      KubeletOptions
	pods      corelisters.PodLister
	claims    corelisters.PersistentVolumeClaimLister
	snapshots cache.GenericLister
	kick      chan struct{}

	mu      sync.Mutex
	written map[types.UID]bool   // Pods whose status this wrote
	pending map[types.UID]string // Pods held Pending, with the message written
	nextIP  int
}

// KubeletOptions change what Kubelet does.
type KubeletOptions struct {
	// PodStatus decides the status of a Pod once it is bound; a nil status leaves it
	// Pending on its node, and PodStatus is asked again at the next change in the
	// namespace (or Poke). Unset: ReadyStatus.
	PodStatus func(pod *corev1.Pod, ip string) *corev1.PodStatus
	// KeepTerminating leaves Pods being deleted as they are (terminating until the
	// test ends), as a node that stopped answering would.
	KeepTerminating bool
	// Scheduled leaves the Pods to the fleet (StartFleet): kube-scheduler binds
	// them, kwok starts and removes them. The Kubelet then only provisions the
	// claims the scheduler picked a node for (a PersistentVolume each, deleted with
	// its claim), readies snapshots and releases claims no Pod uses.
	Scheduled bool
}

// VolumeSnapshotGVR is snapshot.storage.k8s.io/v1 volumesnapshots.
var VolumeSnapshotGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

var volumeSnapshotClassGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}

const pvcProtection = "kubernetes.io/pvc-protection"

// StartKubelet starts a Kubelet for namespace, stopped when the test ends.
func (s *Server) StartKubelet(t testing.TB, namespace string, opts KubeletOptions) *Kubelet {
	t.Helper()
	k, stop, err := s.runKubelet(namespace, opts, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return k
}

// RunKubelet is StartKubelet for a program that is no test: the Kubelet runs until
// stop is called, and logf (nil: nothing) is told of writes that raced and are tried
// again.
func (s *Server) RunKubelet(namespace string, opts KubeletOptions, logf func(format string, args ...any)) (k *Kubelet, stop func(), err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return s.runKubelet(namespace, opts, logf)
}

func (s *Server) runKubelet(namespace string, opts KubeletOptions, logf func(format string, args ...any)) (*Kubelet, func(), error) {
	if opts.PodStatus == nil {
		opts.PodStatus = func(pod *corev1.Pod, ip string) *corev1.PodStatus {
			st := ReadyStatus(pod, ip)
			return &st
		}
	}
	k := &Kubelet{s: s, namespace: namespace, opts: opts, kick: make(chan struct{}, 1),
		written: map[types.UID]bool{}, pending: map[types.UID]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	core := informers.NewSharedInformerFactoryWithOptions(s.Clientset, 0, informers.WithNamespace(namespace))
	dyn := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.Dynamic, 0, namespace, nil)
	podInformer := core.Core().V1().Pods()
	claimInformer := core.Core().V1().PersistentVolumeClaims()
	snapInformer := dyn.ForResource(VolumeSnapshotGVR)
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.poke() },
		UpdateFunc: func(any, any) { k.poke() },
		DeleteFunc: func(any) { k.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{podInformer.Informer(), claimInformer.Informer(), snapInformer.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			cancel()
			return nil, nil, err
		}
	}
	k.pods, k.claims, k.snapshots = podInformer.Lister(), claimInformer.Lister(), snapInformer.Lister()
	core.Start(ctx.Done())
	dyn.Start(ctx.Done())
	stopInformers := func() {
		cancel()
		core.Shutdown()
		dyn.Shutdown()
	}
	for typ, ok := range core.WaitForCacheSync(ctx.Done()) {
		if !ok {
			stopInformers()
			return nil, nil, fmt.Errorf("kubelet: %v cache did not sync", typ)
		}
	}
	for typ, ok := range dyn.WaitForCacheSync(ctx.Done()) {
		if !ok {
			stopInformers()
			return nil, nil, fmt.Errorf("kubelet: %v cache did not sync", typ)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-k.kick:
				if err := k.sync(ctx); err != nil && ctx.Err() == nil {
					// A write raced with another: the change it raced with is an
					// event too, but say what happened and look again shortly.
					logf("kubelet %s: %v (trying again)", namespace, err)
					time.AfterFunc(100*time.Millisecond, k.poke)
				}
			}
		}
	}()
	k.poke()
	return k, func() {
		stopInformers()
		<-done
	}, nil
}

func (k *Kubelet) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// ReadyStatus is a Running Pod with every container ready, at ip.
func ReadyStatus(pod *corev1.Pod, ip string) corev1.PodStatus {
	now := metav1.Now()
	st := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    "10.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "10.0.0.1"}},
		PodIP:     ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		StartTime: &now,
		QOSClass:  pod.Status.QOSClass,
	}
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "kubeenv://" + c.Image, ContainerID: "kubeenv://" + string(pod.UID) + "/" + c.Name,
			Ready: true, Started: ptr(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	return st
}

func ptr[T any](v T) *T { return &v }

// sync looks at every object of the namespace and does what is due.
func (k *Kubelet) sync(ctx context.Context) error {
	pods, err := k.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	claims, err := k.claims.List(labels.Everything())
	if err != nil {
		return err
	}
	snaps, err := k.snapshots.List(labels.Everything())
	if err != nil {
		return err
	}
	claimByName := map[string]*corev1.PersistentVolumeClaim{}
	for _, c := range claims {
		claimByName[c.Name] = c
	}
	snapReady := map[string]bool{}
	var errs []error
	for _, o := range snaps {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		snapReady[u.GetName()] = ready
		if !ready && u.GetDeletionTimestamp() == nil {
			errs = append(errs, k.readySnapshot(ctx, u, claimByName))
		}
	}
	usedClaims := map[string]bool{}
	for _, pod := range pods {
		for _, name := range podClaims(pod) {
			if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
				usedClaims[name] = true
			}
		}
		if !k.opts.Scheduled {
			errs = append(errs, k.syncPod(ctx, pod, claimByName, snapReady))
		}
	}
	if k.opts.Scheduled {
		live := map[types.UID]bool{}
		for _, c := range claims {
			live[c.UID] = true
			errs = append(errs, k.provision(ctx, c))
		}
		errs = append(errs, k.deleteVolumes(ctx, live))
	}
	for _, c := range claims {
		if c.DeletionTimestamp != nil && !usedClaims[c.Name] && hasString(c.Finalizers, pvcProtection) {
			errs = append(errs, k.releaseClaim(ctx, c))
		}
	}
	for _, err := range errs {
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

func (k *Kubelet) syncPod(ctx context.Context, pod *corev1.Pod, claims map[string]*corev1.PersistentVolumeClaim, snapReady map[string]bool) error {
	pods := k.s.Clientset.CoreV1().Pods(k.namespace)
	if pod.DeletionTimestamp != nil {
		if pod.Spec.NodeName == "" || k.opts.KeepTerminating {
			return nil // the API server deletes an unbound Pod at once
		}
		zero := int64(0)
		return pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	}
	if pod.Spec.NodeName == "" {
		if why := unschedulable(pod, claims, snapReady); why != "" {
			return k.holdPending(ctx, pod, why)
		}
		for _, name := range podClaims(pod) {
			if err := k.bindClaim(ctx, claims[name]); err != nil {
				return err
			}
		}
		return pods.Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: NodeName},
		}, metav1.CreateOptions{})
	}
	k.mu.Lock()
	done := k.written[pod.UID]
	ip := fmt.Sprintf("10.244.%d.%d", k.nextIP/250, k.nextIP%250+2)
	k.mu.Unlock()
	if done {
		return nil
	}
	st := k.opts.PodStatus(pod, ip)
	if st == nil {
		return nil // asked again at the next change in the namespace, or Poke
	}
	if err := patchStatus(ctx, k, pod.Name, st); err != nil {
		return err
	}
	k.mu.Lock()
	k.written[pod.UID] = true
	k.nextIP++
	k.mu.Unlock()
	return nil
}

// Poke makes the Kubelet look at the namespace again: for a PodStatus whose answer
// changed without a change in the namespace (a test opening a gate).
func (k *Kubelet) Poke() { k.poke() }

// unschedulable says why the scheduler would not bind pod yet, or "".
func unschedulable(pod *corev1.Pod, claims map[string]*corev1.PersistentVolumeClaim, snapReady map[string]bool) string {
	for _, name := range podClaims(pod) {
		c, ok := claims[name]
		switch {
		case !ok:
			return fmt.Sprintf("persistentvolumeclaim %q not found", name)
		case c.DeletionTimestamp != nil:
			return fmt.Sprintf("persistentvolumeclaim %q is being deleted", name)
		}
		if ds := c.Spec.DataSource; ds != nil && ds.Kind == "VolumeSnapshot" && !snapReady[ds.Name] {
			return fmt.Sprintf("persistentvolumeclaim %q waits for volume snapshot %q to be ready", name, ds.Name)
		}
	}
	return ""
}

func (k *Kubelet) holdPending(ctx context.Context, pod *corev1.Pod, why string) error {
	k.mu.Lock()
	same := k.pending[pod.UID] == why
	k.pending[pod.UID] = why
	k.mu.Unlock()
	if same {
		return nil
	}
	return patchStatus(ctx, k, pod.Name, &corev1.PodStatus{
		Phase: corev1.PodPending,
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/1 nodes are available: " + why + ".", LastTransitionTime: metav1.Now()}},
	})
}

func patchStatus(ctx context.Context, k *Kubelet, name string, st *corev1.PodStatus) error {
	body, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return err
	}
	_, err = k.s.Clientset.CoreV1().Pods(k.namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	return err
}

func (k *Kubelet) bindClaim(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	if c.Status.Phase == corev1.ClaimBound {
		return nil
	}
	size := c.Spec.Resources.Requests[corev1.ResourceStorage]
	st := map[string]any{"status": map[string]any{
		"phase":       corev1.ClaimBound,
		"accessModes": c.Spec.AccessModes,
		"capacity":    corev1.ResourceList{corev1.ResourceStorage: size},
	}}
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = k.s.Clientset.CoreV1().PersistentVolumeClaims(k.namespace).Patch(ctx, c.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	return err
}

func (k *Kubelet) releaseClaim(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	c = c.DeepCopy()
	var keep []string
	for _, f := range c.Finalizers {
		if f != pvcProtection {
			keep = append(keep, f)
		}
	}
	c.Finalizers = keep
	_, err := k.s.Clientset.CoreV1().PersistentVolumeClaims(k.namespace).Update(ctx, c, metav1.UpdateOptions{})
	return err
}

// readySnapshot makes a snapshot of an existing claim ready to use.
func (k *Kubelet) readySnapshot(ctx context.Context, snap *unstructured.Unstructured, claims map[string]*corev1.PersistentVolumeClaim) error {
	source, _, _ := unstructured.NestedString(snap.Object, "spec", "source", "persistentVolumeClaimName")
	c, ok := claims[source]
	if !ok || c.DeletionTimestamp != nil {
		return nil // a real controller reports an error and retries; it stays not ready
	}
	size := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if size.IsZero() {
		size = resource.MustParse("1Gi")
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{
		"boundVolumeSnapshotContentName": "snapcontent-" + string(snap.GetUID()),
		"creationTime":                   time.Now().UTC().Format(time.RFC3339),
		"readyToUse":                     true,
		"restoreSize":                    size.String(),
	}})
	if err != nil {
		return err
	}
	_, err = k.s.Dynamic.Resource(VolumeSnapshotGVR).Namespace(k.namespace).Patch(ctx, snap.GetName(), types.MergePatchType, body, metav1.PatchOptions{}, "status")
	return err
}

func (s *Server) createSnapshotClass(ctx context.Context) error {
	cls := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion":     "snapshot.storage.k8s.io/v1",
		"kind":           "VolumeSnapshotClass",
		"metadata":       map[string]any{"name": SnapshotClass},
		"driver":         fakeDriver,
		"deletionPolicy": "Delete",
	}}
	_, err := s.Dynamic.Resource(volumeSnapshotClassGVR).Create(ctx, cls, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("volume snapshot class: %w", err)
	}
	return nil
}

func podClaims(pod *corev1.Pod) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		}
	}
	return out
}

func hasString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
