package kubeenv

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/space-sandbox/space/internal/testenv"
)

func TestFleet(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ns := s.Namespace(t)
	s.StartKubelet(t, ns, KubeletOptions{Scheduled: true})
	// Nodes of 2 cores: two Pods of 1500m cannot share one.
	capacity := FleetCapacity()
	capacity[corev1.ResourceCPU] = resource.MustParse("2")
	nodes := s.StartFleet(t, 2, capacity)
	ctx := testenv.Context(t)
	pods, claims := s.Clientset.CoreV1().Pods(ns), s.Clientset.CoreV1().PersistentVolumeClaims(ns)

	mk := func(name string) {
		t.Helper()
		if _, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "data-" + name},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cpu := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}
		if _, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{SchedulerName: FleetScheduler,
				Containers: []corev1.Container{{Name: "c", Image: "busybox:1", Resources: corev1.ResourceRequirements{Requests: cpu, Limits: cpu},
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-" + name}}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ready := func(name string) *corev1.Pod {
		t.Helper()
		var p *corev1.Pod
		t.Cleanup(func() {
			if t.Failed() {
				c, _ := claims.Get(ctx, "data-"+name, metav1.GetOptions{})
				t.Logf("pod %s: %+v %+v\nclaim %+v\nlogs %v", name, p.Spec.NodeName, p.Status, c, s.FleetLogs())
			}
		})
		testenv.Eventually(t, time.Minute, "pod "+name+" to be scheduled and Ready", func() bool {
			var err error
			p, err = pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true
				}
			}
			return false
		})
		return p
	}
	mk("one")
	mk("two")
	p1, p2 := ready("one"), ready("two")
	// The scheduler spread them by CPU: one per node, both nodes the fleet's.
	if p1.Spec.NodeName == p2.Spec.NodeName || (p1.Spec.NodeName != nodes[0] && p1.Spec.NodeName != nodes[1]) ||
		(p2.Spec.NodeName != nodes[0] && p2.Spec.NodeName != nodes[1]) {
		t.Fatalf("pods on %q and %q, want one on each of %v", p1.Spec.NodeName, p2.Spec.NodeName, nodes)
	}
	if p1.Status.PodIP == "" {
		t.Errorf("kwok gave the pod no IP: %+v", p1.Status)
	}
	c, err := claims.Get(ctx, "data-one", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Phase != corev1.ClaimBound || c.Spec.VolumeName == "" || c.Annotations["volume.kubernetes.io/selected-node"] != p1.Spec.NodeName {
		t.Fatalf("claim %+v, want bound on the pod's node", c)
	}
	// A third does not fit: Pending, Unschedulable, as the scheduler says.
	mk("three")
	testenv.Eventually(t, time.Minute, "the third pod to be unschedulable", func() bool {
		p, err := pods.Get(ctx, "three", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return p.Spec.NodeName == ""
			}
		}
		return false
	})
	// Deleting one makes room: kwok removes it, the third is scheduled. The claim
	// goes once no pod uses it, and its volume with it.
	if err := pods.Delete(ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := claims.Delete(ctx, "data-one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ready("three")
	testenv.Eventually(t, time.Minute, "the claim and its volume to go", func() bool {
		_, errC := claims.Get(ctx, "data-one", metav1.GetOptions{})
		_, errV := s.Clientset.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
		return apierrors.IsNotFound(errC) && apierrors.IsNotFound(errV)
	})
}
