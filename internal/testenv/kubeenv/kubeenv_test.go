package kubeenv

import (
	"crypto/tls"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/space-sandbox/space/internal/testenv"
)

func TestServer(t *testing.T) {
	t.Parallel()

	t.Run("serves the built version on loopback and refuses an anonymous request", func(t *testing.T) {
		t.Parallel()
		s := Start(t)
		u, err := url.Parse(s.URL)
		if err != nil || u.Hostname() != "127.0.0.1" {
			t.Fatalf("URL %s, want loopback", s.URL)
		}
		v, err := s.Clientset.Discovery().ServerVersion()
		if err != nil || v.GitVersion != s.Version {
			t.Fatalf("server version %+v (%v), want %s", v, err, s.Version)
		}
		// No client certificate, no token: the server must not take it as anyone.
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // only the status is read
		resp, err := client.Get(s.URL + "/api/v1/namespaces")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("an anonymous request got %d, want 401", resp.StatusCode)
		}
	})

	t.Run("a service account token authenticates as the service account, which RBAC confines", func(t *testing.T) {
		t.Parallel()
		s := Start(t)
		ns := s.Namespace(t)
		cs, err := kubernetes.NewForConfig(s.TokenConfig(s.ServiceAccountToken(t, ns, "default")))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cs.CoreV1().Pods(ns).List(testenv.Context(t), metav1.ListOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "system:serviceaccount:"+ns+":default") {
			t.Fatalf("err = %v, want the service account refused by RBAC", err)
		}
	})

	t.Run("a watch from a compacted resource version is 410 Gone", func(t *testing.T) {
		t.Parallel()
		s := Start(t)
		s.WaitCompacted(t, "1")
		ns := s.Namespace(t)
		w, err := s.Clientset.CoreV1().Pods(ns).Watch(testenv.Context(t), metav1.ListOptions{ResourceVersion: "1"})
		if err == nil {
			defer w.Stop()
			select {
			case ev := <-w.ResultChan():
				err = apierrors.FromObject(ev.Object)
				if ev.Type != watch.Error {
					t.Fatalf("first event %s, want an error", ev.Type)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no event on a watch from resourceVersion 1")
			}
		}
		if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			t.Fatalf("err = %v, want 410 Gone", err)
		}
	})
}

func TestKubelet(t *testing.T) {
	t.Parallel()

	t.Run("binds a pod whose claim exists, makes it ready, and removes it once deleted", func(t *testing.T) {
		t.Parallel()
		s := Start(t)
		ns := s.Namespace(t)
		s.StartKubelet(t, ns, KubeletOptions{})
		ctx := testenv.Context(t)
		claims, pods := s.Clientset.CoreV1().PersistentVolumeClaims(ns), s.Clientset.CoreV1().Pods(ns)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes:    []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		}}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the pod to be unschedulable for its missing claim", func() bool {
			p, err := pods.Get(ctx, "p", metav1.GetOptions{})
			return err == nil && len(p.Status.Conditions) == 1 && p.Status.Conditions[0].Reason == corev1.PodReasonUnschedulable &&
				strings.Contains(p.Status.Conditions[0].Message, `"data" not found`)
		})
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
		}}
		if _, err := claims.Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var ready *corev1.Pod
		testenv.Eventually(t, 30*time.Second, "the pod to be ready", func() bool {
			p, err := pods.Get(ctx, "p", metav1.GetOptions{})
			ready = p
			return err == nil && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == NodeName && p.Status.PodIP != ""
		})
		c, err := claims.Get(ctx, "data", metav1.GetOptions{})
		if err != nil || c.Status.Phase != corev1.ClaimBound || *c.Spec.StorageClassName != DefaultStorageClass {
			t.Fatalf("claim %+v (%v), want bound, of the default class", c, err)
		}

		// A claim in use stays while its pod lives.
		if err := claims.Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if c, err := claims.Get(ctx, "data", metav1.GetOptions{}); err != nil || c.DeletionTimestamp == nil {
			t.Fatalf("a claim in use is gone at once (%v), want it terminating", err)
		}
		if err := pods.Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the pod and then the claim to go", func() bool {
			_, perr := pods.Get(ctx, "p", metav1.GetOptions{})
			_, cerr := claims.Get(ctx, "data", metav1.GetOptions{})
			return apierrors.IsNotFound(perr) && apierrors.IsNotFound(cerr)
		})
		if ready.Status.PodIP == "" || len(ready.Status.ContainerStatuses) != 1 || !ready.Status.ContainerStatuses[0].Ready {
			t.Errorf("ready status %+v", ready.Status)
		}
	})

	t.Run("makes a snapshot of an existing claim ready, sized as the claim", func(t *testing.T) {
		t.Parallel()
		s := Start(t)
		ns := s.Namespace(t)
		s.StartKubelet(t, ns, KubeletOptions{})
		ctx := testenv.Context(t)
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("3Gi")}},
		}}
		if _, err := s.Clientset.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		snaps := s.Dynamic.Resource(VolumeSnapshotGVR).Namespace(ns)
		snap := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
			"metadata": map[string]any{"name": "s"},
			"spec":     map[string]any{"volumeSnapshotClassName": SnapshotClass, "source": map[string]any{"persistentVolumeClaimName": "data"}},
		}}
		if _, err := snaps.Create(ctx, snap, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the snapshot to be ready", func() bool {
			got, err := snaps.Get(ctx, "s", metav1.GetOptions{})
			if err != nil {
				return false
			}
			ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse")
			size, _, _ := unstructured.NestedString(got.Object, "status", "restoreSize")
			return ready && size == "3Gi"
		})
	})
}
