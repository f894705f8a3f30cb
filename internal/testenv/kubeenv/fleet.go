package kubeenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/internal/testenv/kubebin"
)

// FleetScheduler is the scheduler name of the fleet's kube-scheduler: only Pods whose
// spec names it (schedulerName) are scheduled by it, so that the Pods of the tests
// whose Kubelet plays the scheduler are never raced for.
const FleetScheduler = "space-fleet"

// kwokNode is the annotation that hands a Node to kwok.
const kwokNode = "kwok.x-k8s.io/node"

// kwokStages are kwok's own stages, from its module (as the CRDs are): nodes become
// Ready and keep a heartbeat; Pods bound to them become Running and Ready, and are
// removed once deleted.
var kwokStages = []string{
	"kustomize/stage/node/fast/node-initialize.yaml",
	"kustomize/stage/node/heartbeat/node-heartbeat.yaml",
	"kustomize/stage/pod/fast/pod-ready.yaml",
	"kustomize/stage/pod/fast/pod-complete.yaml",
	"kustomize/stage/pod/fast/pod-delete.yaml",
}

type fleetOnce struct {
	once sync.Once
	err  error
}

// StartFleet starts, once per test process, a real kube-scheduler (profile
// FleetScheduler) and kwok, built from their modules (kubebin.FindOrBuildFleet), and
// adds nodes simulated nodes of the test's own, each with the capacity given (kwok
// keeps them Ready). They are deleted when the test ends. Pods reach them only by
// naming FleetScheduler; give the namespace a Kubelet with Scheduled set for the
// claims. It fails the test when the binaries cannot be had; it never skips.
func (s *Server) StartFleet(t testing.TB, nodes int, capacity corev1.ResourceList) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kubebin.BuildTimeout+startTimeout)
	defer cancel()
	if err := s.LaunchFleet(ctx); err != nil {
		t.Fatalf("kube-scheduler and kwok for the fleet tests: %v\n(the binaries are built with\n\t%s)", err, kubebin.BuildCommand)
	}
	names, err := s.AddNodes(testenv.Context(t), nodes, capacity)
	t.Cleanup(func() { s.DeleteNodes(names) })
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// LaunchFleet starts the process's kube-scheduler and kwok, once (StartFleet does for
// a test); later calls return the first one's error.
func (s *Server) LaunchFleet(ctx context.Context) error {
	s.fleet.once.Do(func() { s.fleet.err = s.startFleet(ctx) })
	return s.fleet.err
}

// AddNodes creates nodes simulated nodes of the given capacity, named apart from
// every other call's, and returns once kwok made them Ready and they are schedulable.
// The names are returned with an error too, for DeleteNodes.
func (s *Server) AddNodes(ctx context.Context, nodes int, capacity corev1.ResourceList) ([]string, error) {
	prefix := "fleet-" + strings.ToLower(testenv.RandomID(5))
	var names []string
	for i := range nodes {
		name := fmt.Sprintf("%s-%d", prefix, i)
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kwokNode: "fake"},
				Labels: map[string]string{"kubernetes.io/hostname": name, "type": "kwok"}},
			Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}
		if _, err := s.Clientset.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return names, fmt.Errorf("create node %s: %w", name, err)
		}
		names = append(names, name)
	}
	// kwok makes the nodes Ready; the API server's admission gave each the
	// node.kubernetes.io/not-ready taint at creation, which the node lifecycle
	// controller (there is no controller manager) would remove once they are.
	deadline := time.Now().Add(time.Minute)
	for _, name := range names {
		for {
			n, err := s.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err == nil && nodeReady(n) {
				if len(n.Spec.Taints) == 0 {
					break
				}
				n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
				if _, err = s.Clientset.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err == nil {
					break
				} // a conflict with kwok's heartbeat: again
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return names, fmt.Errorf("node %s not Ready and schedulable within a minute (last: %v); kwok's log is %v", name, err, s.fleetLogs)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return names, nil
}

// DeleteNodes deletes the nodes named.
func (s *Server) DeleteNodes(names []string) {
	for _, name := range names {
		_ = s.Clientset.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// FleetCapacity is a node of 32 cores, 128 GiB, 110 Pods and 1 TiB of ephemeral
// storage.
func FleetCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("128Gi"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
	}
}

func (s *Server) startFleet(ctx context.Context) error {
	bins, err := kubebin.FindOrBuildFleet(ctx, func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "kubeenv: "+format+"\n", args...)
	})
	if err != nil {
		return err
	}
	dir := filepath.Join(s.dir, "fleet")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// kwok's stages, from its module.
	kwokDir, err := moduleDir(ctx, "sigs.k8s.io/kwok", bins.KwokVersion)
	if err != nil {
		return err
	}
	var stages bytes.Buffer
	for _, f := range kwokStages {
		b, err := os.ReadFile(filepath.Join(kwokDir, f))
		if err != nil {
			return fmt.Errorf("kwok stage: %w", err)
		}
		stages.WriteString("---\n")
		stages.Write(b)
	}
	stagesFile := filepath.Join(dir, "kwok-stages.yaml")
	if err := os.WriteFile(stagesFile, stages.Bytes(), 0o600); err != nil {
		return err
	}
	schedConfig := filepath.Join(dir, "scheduler.yaml")
	if err := os.WriteFile(schedConfig, []byte(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: `+s.Kubeconfig+`
  qps: 500
  burst: 1000
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: `+FleetScheduler+`
`), 0o600); err != nil {
		return err
	}
	sched, err := spawn(ctx, filepath.Join(dir, "kube-scheduler.log"), bins.Scheduler,
		"--config="+schedConfig,
		// No HTTPS endpoint: nothing scrapes or probes it.
		"--secure-port=0",
		"--v=1",
	)
	if err != nil {
		return err
	}
	kwok, err := spawn(ctx, filepath.Join(dir, "kwok.log"), bins.Kwok,
		"--config="+stagesFile,
		"--kubeconfig="+s.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+kwokNode+"=fake",
		"--node-ip=10.0.0.1",
		"--cidr=10.128.0.0/10",
	)
	if err != nil {
		sched.stop()
		return err
	}
	// Both are ready when they act: the callers wait for their nodes to be Ready and
	// their Pods to be scheduled. Here, only that neither exits at once.
	select {
	case <-sched.done:
		return fmt.Errorf("kube-scheduler exited at start: %v; its log %s ends:\n%s", sched.err, sched.log, tail(sched.log))
	case <-kwok.done:
		return fmt.Errorf("kwok exited at start: %v; its log %s ends:\n%s", kwok.err, kwok.log, tail(kwok.log))
	case <-time.After(2 * time.Second):
	}
	s.fleetLogs = []string{sched.log, kwok.log}
	return nil
}

// FleetLogs are the paths of the kube-scheduler's and kwok's logs, for a failing test
// to point at.
func (s *Server) FleetLogs() []string { return s.fleetLogs }

// provision makes a claim the scheduler picked a node for (WaitForFirstConsumer: the
// volume.kubernetes.io/selected-node annotation) Bound to a PersistentVolume made for
// it, as a CSI provisioner and the PV controller would; the scheduler binds the Pod
// once it sees both.
func (k *Kubelet) provision(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	if c.Spec.VolumeName != "" || c.DeletionTimestamp != nil || c.Annotations[annSelectedNode] == "" {
		return nil
	}
	size := c.Spec.Resources.Requests[corev1.ResourceStorage]
	pvName := "pv-" + string(c.UID)
	fs := corev1.PersistentVolumeFilesystem
	class := ""
	if c.Spec.StorageClassName != nil {
		class = *c.Spec.StorageClassName
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Labels: map[string]string{"kubeenv.space.dev/namespace": k.namespace},
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": fakeDriver}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			VolumeMode:                    &fs,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: c.Namespace, Name: c.Name, UID: c.UID, APIVersion: "v1"},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: fakeDriver, VolumeHandle: pvName}},
		},
	}
	pvs := k.s.Clientset.CoreV1().PersistentVolumes()
	if _, err := pvs.Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	pv.Status = corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}
	if _, err := pvs.UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		// A conflict: the PV existed (a retry), its status is written already or next round.
		return err
	}
	c = c.DeepCopy()
	c.Spec.VolumeName = pvName
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[annBindCompleted] = "yes"
	c.Annotations[annBoundByController] = "yes"
	updated, err := k.s.Clientset.CoreV1().PersistentVolumeClaims(k.namespace).Update(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	return k.bindClaim(ctx, updated)
}

// deleteVolumes deletes the PersistentVolumes made for this namespace's claims that
// are gone, as the reclaim policy Delete has a provisioner do.
func (k *Kubelet) deleteVolumes(ctx context.Context, live map[types.UID]bool) error {
	pvs, err := k.s.Clientset.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{LabelSelector: "kubeenv.space.dev/namespace=" + k.namespace})
	if err != nil {
		return err
	}
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef != nil && !live[pv.Spec.ClaimRef.UID] {
			if err := k.s.Clientset.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

const (
	annSelectedNode      = "volume.kubernetes.io/selected-node"
	annBindCompleted     = "pv.kubernetes.io/bind-completed"
	annBoundByController = "pv.kubernetes.io/bound-by-controller"
)
