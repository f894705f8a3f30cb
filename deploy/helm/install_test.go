package helm

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/substrate/kubernetes"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/internal/testenv/kubeenv"
)

// fieldManager is the field manager of the install, as helm's server-side apply names
// itself.
const fieldManager = "helm"

// serverSideApply applies obj with server-side apply, strict field validation and
// forced ownership, as `helm install --server-side` (or `kubectl apply
// --server-side`) does, into namespace when obj names none; it returns the object as
// stored.
func serverSideApply(ctx context.Context, srv *kubeenv.Server, mapper *restmapper.DeferredDiscoveryRESTMapper, obj *unstructured.Unstructured, namespace string) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	ns := obj.GetNamespace()
	if ns == "" && m.Scope.Name() == "namespace" {
		ns = namespace
	}
	body, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	force := true
	return srv.Dynamic.Resource(m.Resource).Namespace(ns).Patch(ctx, obj.GetName(), types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: fieldManager, Force: &force, FieldValidation: "Strict"})
}

// installValues is the full render (every optional part on) with the kubernetes
// substrate pointed at what the test server has: its default StorageClass and its
// VolumeSnapshotClass.
func installValues(sbx string) []string {
	return []string{"-f", fullValues, "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true",
		"--set", "kubernetes.storageClass=" + kubeenv.DefaultStorageClass, "--set", "kubernetes.volumeSnapshotClass=" + kubeenv.SnapshotClass,
		"--set", "kubernetes.namespace=" + sbx}
}

// TestChartInstalledForReal applies the whole chart server-side to the API server, the
// CRDs it needs (prometheus-operator's and the Gateway API's own manifests) installed
// first, and then works as the chart's service account: the substrate configured from
// the rendered Deployment's environment, authenticated with a token of that account,
// does what it does to sandboxes, and what the Role does not grant is refused 403.
func TestChartInstalledForReal(t *testing.T) {
	t.Parallel()
	srv := kubeenv.Start(t)
	srv.RequireCRDs(t, kubeenv.MonitoringCRDs)
	srv.RequireCRDs(t, kubeenv.GatewayCRDs)
	release, sbx := srv.Namespace(t), srv.Namespace(t)
	srv.StartKubelet(t, sbx, kubeenv.KubeletOptions{})
	ctx := testenv.Context(t)
	mapper := newMapper(srv)

	// Install: every rendered object, applied for real; helm's test Pod too (what
	// `helm test` creates), which nothing runs here.
	out := mustRender(t, release, sbx)
	objs := unstructuredAll(t, out)
	stored := map[string]*unstructured.Unstructured{}
	key := func(o *unstructured.Unstructured) string { return o.GetKind() + "/" + o.GetName() }
	for _, obj := range objs {
		got, err := serverSideApply(ctx, srv, mapper, obj, release)
		if err != nil {
			t.Fatalf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		if _, dup := stored[key(obj)]; dup {
			t.Fatalf("%s rendered twice", key(obj))
		}
		stored[key(obj)] = got
	}
	for _, k := range []string{"Deployment", "Service", "Secret", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget",
		"HorizontalPodAutoscaler", "NetworkPolicy", "Ingress", "HTTPRoute", "ServiceMonitor", "PrometheusRule", "Pod"} {
		if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == k }) {
			t.Errorf("no %s installed: the install must switch every optional part on", k)
		}
	}
	// Each object is stored where the chart meant it (the Role and its binding in the
	// sandbox namespace, the rest in the release's), owned by the install.
	for k, o := range stored {
		want := release
		if o.GetKind() == "Role" || o.GetKind() == "RoleBinding" {
			want = sbx
		}
		if o.GetNamespace() != want {
			t.Errorf("%s stored in namespace %q, want %q", k, o.GetNamespace(), want)
		}
		if !slices.ContainsFunc(o.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool {
			return f.Manager == fieldManager && f.Operation == metav1.ManagedFieldsOperationApply
		}) {
			t.Errorf("%s is not owned by the %s apply: %+v", k, fieldManager, o.GetManagedFields())
		}
	}

	// An upgrade with the same values, rendered afresh, changes nothing the server
	// stores: no random or time-dependent field, and nothing the server's defaulting
	// fights (either would move a resourceVersion and, on the Deployment, roll the
	// pods).
	for _, obj := range unstructuredAll(t, mustRender(t, release, sbx)) {
		got, err := serverSideApply(ctx, srv, mapper, obj, release)
		if err != nil {
			t.Fatalf("re-apply %s: %v", key(obj), err)
		}
		if before := stored[key(obj)]; got.GetResourceVersion() != before.GetResourceVersion() {
			t.Errorf("re-applying the same values changed %s (resourceVersion %s -> %s)", key(obj), before.GetResourceVersion(), got.GetResourceVersion())
		}
	}

	// The Deployment runs as the chart's service account, with its token mounted.
	var dep appsv1.Deployment
	depName := ""
	for k := range stored {
		if strings.HasPrefix(k, "Deployment/") {
			depName = strings.TrimPrefix(k, "Deployment/")
		}
	}
	if err := runtimeFromUnstructured(stored["Deployment/"+depName], &dep); err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	saName := pod.ServiceAccountName
	if stored["ServiceAccount/"+saName] == nil {
		t.Fatalf("the Deployment runs as service account %q, which the chart did not install", saName)
	}
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("the kubernetes substrate's pods do not mount the service account token (automount %v)", pod.AutomountServiceAccountToken)
	}

	// As the service account: a token from the TokenRequest API, as the kubelet mounts.
	token := srv.ServiceAccountToken(t, release, saName)
	cs, err := k8s.NewForConfig(srv.TokenConfig(token))
	if err != nil {
		t.Fatal(err)
	}
	who, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "system:serviceaccount:" + release + ":" + saName; who.Status.UserInfo.Username != want {
		t.Fatalf("authenticated as %q, want %q", who.Status.UserInfo.Username, want)
	}

	// The substrate as space-api builds it (internal/app/wire.go), from the rendered
	// container's environment, with the token's kubeconfig in place of the in-cluster
	// one.
	api := container(t, &dep, "space-api")
	env := asMounted(t, envOf(t, decodeAll(t, out), api, fullExternal))
	cfg, err := config.Load(getenv(env))
	if err != nil {
		t.Fatalf("the installed env does not load: %v", err)
	}
	k := cfg.Kubernetes
	if k.Namespace != sbx || k.SnapshotClass != kubeenv.SnapshotClass {
		t.Fatalf("the installed substrate: namespace %q, snapshot class %q; want %q, %q", k.Namespace, k.SnapshotClass, sbx, kubeenv.SnapshotClass)
	}
	sub, err := kubernetes.Connect(kubernetes.Cluster{Kubeconfig: srv.TokenKubeconfig(t, release, token), Namespace: k.Namespace, QPS: k.QPS, Burst: k.Burst},
		kubernetes.Options{ReadyTimeout: 30 * time.Second, StorageClass: k.StorageClass, SnapshotClass: k.SnapshotClass,
			MountPath: k.MountPath, SoftBreachPriorityClass: k.SoftBreachPriorityClass})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the substrate's calls succeed", func(t *testing.T) {
		// A cold start creates the sandbox's Pod and claim; the server has them as
		// the substrate labelled them; Stop deletes both.
		const id = "55555555-5555-4555-8555-555555555555"
		ref, err := sub.StartCold(ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: exerciseShape,
			Template: substrate.Template{Name: "python-3.12", Image: "python:3.12-slim"}})
		if err != nil {
			t.Fatalf("start as the chart's service account: %v", err)
		}
		p, err := cs.CoreV1().Pods(sbx).Get(ctx, ref, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get the sandbox's Pod as the service account: %v", err)
		}
		claim, err := cs.CoreV1().PersistentVolumeClaims(sbx).Get(ctx, "data-sbx-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get the sandbox's claim as the service account: %v", err)
		}
		if p.Labels["space.dev/sandbox-id"] != id || claim.Labels["space.dev/sandbox-id"] != id ||
			claim.Spec.StorageClassName == nil || *claim.Spec.StorageClassName != kubeenv.DefaultStorageClass {
			t.Errorf("pod labels %v, claim labels %v class %v", p.Labels, claim.Labels, claim.Spec.StorageClassName)
		}
		f, err := sub.Find(ctx, id)
		if err != nil || len(f.Resources) != 1 || len(f.Storage) != 1 {
			t.Fatalf("find: %+v, %v; want its one Pod and one claim", f, err)
		}
		for _, r := range append(f.Resources, f.Storage...) {
			if err := sub.Stop(ctx, r.Ref); err != nil {
				t.Fatalf("stop %s: %v", r.Ref, err)
			}
		}
		waitGone(t, func() error {
			_, err := srv.Clientset.CoreV1().PersistentVolumeClaims(sbx).Get(ctx, claim.Name, metav1.GetOptions{})
			return err
		})
		waitGone(t, func() error {
			_, err := srv.Clientset.CoreV1().Pods(sbx).Get(ctx, ref, metav1.GetOptions{})
			return err
		})
		// And everything else it does: warm, adopt, retry, pause with snapshots,
		// restore, list, stop.
		if err := exercise(ctx, sub); err != nil {
			t.Fatalf("the substrate as the installed service account: %v", err)
		}
	})

	t.Run("what the role does not grant is refused 403", func(t *testing.T) {
		secret := ""
		for k := range stored {
			if strings.HasPrefix(k, "Secret/") {
				secret = strings.TrimPrefix(k, "Secret/")
			}
		}
		role := ""
		for k := range stored {
			if strings.HasPrefix(k, "Role/") {
				role = strings.TrimPrefix(k, "Role/")
			}
		}
		for _, c := range []struct {
			what string
			call func() error
			// admin, when not nil, is the same call as the administrator, which
			// succeeds: the refusal is the RBAC's, not a missing object.
			admin func() error
		}{
			{"list secrets cluster-wide", func() error {
				_, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
				return err
			}, func() error {
				_, err := srv.Clientset.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
				return err
			}},
			{"read the chart's own Secret (the database and Redis addresses)", func() error {
				_, err := cs.CoreV1().Secrets(release).Get(ctx, secret, metav1.GetOptions{})
				return err
			}, func() error {
				_, err := srv.Clientset.CoreV1().Secrets(release).Get(ctx, secret, metav1.GetOptions{})
				return err
			}},
			{"list secrets in the sandbox namespace", func() error {
				_, err := cs.CoreV1().Secrets(sbx).List(ctx, metav1.ListOptions{})
				return err
			}, nil},
			{"list pods outside the sandbox namespace", func() error {
				_, err := cs.CoreV1().Pods(release).List(ctx, metav1.ListOptions{})
				return err
			}, func() error {
				_, err := srv.Clientset.CoreV1().Pods(release).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"delete the sandbox namespace", func() error {
				return cs.CoreV1().Namespaces().Delete(ctx, sbx, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			}, func() error {
				return srv.Clientset.CoreV1().Namespaces().Delete(ctx, sbx, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			}},
			{"widen its own Role", func() error {
				r, err := srv.Clientset.RbacV1().Roles(sbx).Get(ctx, role, metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("as the administrator: %w", err)
				}
				r.Rules = append(r.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"*"}})
				_, err = cs.RbacV1().Roles(sbx).Update(ctx, r, metav1.UpdateOptions{})
				return err
			}, nil},
			{"exec into a pod", func() error {
				return cs.CoreV1().RESTClient().Post().Namespace(sbx).Resource("pods").Name("any").SubResource("exec").Do(ctx).Error()
			}, nil},
			{"delete every pod at once", func() error {
				return cs.CoreV1().Pods(sbx).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			}, nil},
		} {
			err := c.call()
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s as the chart's service account: %v, want 403 Forbidden", c.what, err)
			} else if !strings.Contains(err.Error(), "system:serviceaccount:"+release+":"+saName) {
				t.Errorf("%s: refused, but not as the service account: %v", c.what, err)
			}
			if c.admin != nil {
				if err := c.admin(); err != nil {
					t.Errorf("%s as the administrator: %v, want it allowed (the object exists)", c.what, err)
				}
			}
		}
		if _, err := srv.Clientset.CoreV1().Namespaces().Get(ctx, sbx, metav1.GetOptions{}); err != nil {
			t.Errorf("the sandbox namespace: %v", err)
		}
	})
}

func mustRender(t *testing.T, release, sbx string) string {
	t.Helper()
	out, err := runHelm(t, templateArgs(append([]string{"--namespace", release}, installValues(sbx)...)...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitGone waits until get answers NotFound.
func waitGone(t *testing.T, get func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := get()
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still there after 30s (last: %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
