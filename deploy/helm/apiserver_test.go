package helm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/substrate/kubernetes"
	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/internal/testenv/kubeenv"
)

// The chart against a real kube-apiserver (internal/testenv/kubeenv): what the offline
// tests above cannot know, the server's validation and admission of every rendered
// object, and its RBAC evaluation of the chart's Role.

// renderFor renders the chart into release namespace ns with sandboxes in sbx, and
// returns the documents as the server takes them.
func renderFor(t *testing.T, ns, sbx string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"--namespace", ns, "--set", "kubernetes.namespace=" + sbx}, extra...)
	out, err := runHelm(t, templateArgs(args...)...)
	if err != nil {
		t.Fatal(err)
	}
	decodeAll(t, out) // strictly, as every other render
	return unstructuredAll(t, out)
}

// unstructuredAll splits helm's output into its documents, as the server takes them.
func unstructuredAll(t *testing.T, out string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, chunk := range separator.Split(out, -1) {
		j, err := yaml.YAMLToJSON([]byte(chunk))
		if err != nil {
			t.Fatal(err)
		}
		if string(j) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(j, &u.Object); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, u)
	}
	return objs
}

// apply creates obj through the dynamic client, as a dry run when dryRun, with unknown
// fields refused (strict field validation).
func apply(ctx context.Context, srv *kubeenv.Server, mapper *restmapper.DeferredDiscoveryRESTMapper, obj *unstructured.Unstructured, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: %w", gvk, err)
	}
	opts := metav1.CreateOptions{FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = srv.Dynamic.Resource(m.Resource).Namespace(obj.GetNamespace()).Create(ctx, obj, opts)
	return err
}

func newMapper(srv *kubeenv.Server) *restmapper.DeferredDiscoveryRESTMapper {
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(srv.Clientset.Discovery()))
}

func TestChartOnAnAPIServer(t *testing.T) {
	t.Parallel()

	t.Run("every manifest, each optional part on, is accepted by the server's dry run", func(t *testing.T) {
		t.Parallel()
		srv := kubeenv.Start(t)
		srv.RequireCRDs(t, kubeenv.MonitoringCRDs)
		srv.RequireCRDs(t, kubeenv.GatewayCRDs)
		ns, sbx := srv.Namespace(t), srv.Namespace(t)
		objs := renderFor(t, ns, sbx, "-f", fullValues, "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true")
		kinds := map[string]bool{}
		mapper := newMapper(srv)
		ctx := testenv.Context(t)
		for _, obj := range objs {
			kinds[obj.GetKind()] = true
			if err := apply(ctx, srv, mapper, obj, true); err != nil {
				t.Errorf("%s %s/%s refused by the server: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
			}
		}
		for _, k := range []string{"Deployment", "Service", "Secret", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget",
			"HorizontalPodAutoscaler", "NetworkPolicy", "Ingress", "HTTPRoute", "ServiceMonitor", "PrometheusRule", "Pod"} {
			if !kinds[k] {
				t.Errorf("no %s rendered: the full render must switch every optional part on", k)
			}
		}
		// The dry run is not a formality: a broken object is refused.
		var broken *unstructured.Unstructured
		for _, o := range objs {
			if o.GetKind() == "Deployment" {
				broken = o.DeepCopy()
			}
		}
		if err := unstructured.SetNestedField(broken.Object, "not-a-policy", "spec", "strategy", "type"); err != nil {
			t.Fatal(err)
		}
		if err := apply(ctx, srv, mapper, broken, true); !apierrors.IsInvalid(err) {
			t.Errorf("a Deployment with a bad strategy: %v, want it refused as invalid", err)
		}
	})

	t.Run("as the chart's service account the substrate does all it does, pause and restore included", func(t *testing.T) {
		t.Parallel()
		r := installRBAC(t, nil)
		if err := exercise(r.ctx, r.sub); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the chart's role grants exactly the verbs the substrate uses", func(t *testing.T) {
		t.Parallel()
		r := installRBAC(t, nil)
		// Every verb on what the substrate touches, and on what it must not.
		verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
		resources := []struct{ group, resource, sub string }{
			{"", "pods", ""}, {"", "persistentvolumeclaims", ""}, {"snapshot.storage.k8s.io", "volumesnapshots", ""},
			{"", "pods", "exec"}, {"", "pods", "log"}, {"", "pods", "status"}, {"", "pods", "binding"}, {"", "persistentvolumeclaims", "status"},
			{"", "secrets", ""}, {"", "configmaps", ""}, {"", "serviceaccounts", ""}, {"", "services", ""},
			{"snapshot.storage.k8s.io", "volumesnapshotcontents", ""}, {"rbac.authorization.k8s.io", "roles", ""},
		}
		for _, ns := range []string{r.sbx, r.release} {
			for _, res := range resources {
				for _, verb := range verbs {
					want := ns == r.sbx && res.sub == "" && slices.Contains(substrateVerbs[res.resource], verb)
					if got := r.can(t, ns, res.group, res.resource, res.sub, verb); got != want {
						t.Errorf("the chart's service account may %s %s/%s in %s: %v, want %v", verb, res.resource, res.sub, ns, got, want)
					}
				}
			}
		}
		// Each of them is needed: without it, what the substrate does fails.
		for resource, vs := range substrateVerbs {
			for _, verb := range vs {
				t.Run(fmt.Sprintf("without %s on %s the substrate fails", verb, resource), func(t *testing.T) {
					t.Parallel()
					r := installRBAC(t, func(rule *rbacv1.PolicyRule) {
						if slices.Contains(rule.Resources, resource) {
							rule.Verbs = slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == verb })
						}
					})
					err := exercise(r.ctx, r.sub)
					if !apierrors.IsForbidden(err) && !errors.Is(err, errNoSnapshot) {
						t.Fatalf("err = %v, want a Forbidden (or a pause without its snapshot)", err)
					}
					if apierrors.IsForbidden(err) && !strings.Contains(err.Error(), fmt.Sprintf("cannot %s resource %q", verb, resource)) {
						t.Fatalf("err = %v, want it to be the missing %s on %s", err, verb, resource)
					}
				})
			}
		}
	})
}

// substrateVerbs is what the kubernetes substrate does in its namespace, by resource;
// the Role must grant these and nothing else (TestChartOnAnAPIServer checks both ways).
var substrateVerbs = map[string][]string{
	"pods":                   {"get", "list", "watch", "create", "update", "delete"},
	"persistentvolumeclaims": {"get", "list", "create", "patch", "delete"},
	"volumesnapshots":        {"list", "watch", "create", "delete"},
}

// rbacRun is the chart's ServiceAccount, Role and RoleBinding applied for real, and a
// substrate that authenticates with the service account's token.
type rbacRun struct {
	srv          *kubeenv.Server
	release, sbx string
	sub          *kubernetes.Substrate
	cs           k8s.Interface
	ctx          context.Context
}

// installRBAC renders the chart with the kubernetes substrate and a snapshot class,
// edits its Role's rules with edit (when not nil), and applies its ServiceAccount, Role
// and RoleBinding.
func installRBAC(t *testing.T, edit func(*rbacv1.PolicyRule)) rbacRun {
	t.Helper()
	srv := kubeenv.Start(t)
	r := rbacRun{srv: srv, release: srv.Namespace(t), sbx: srv.Namespace(t), ctx: testenv.Context(t)}
	srv.StartKubelet(t, r.sbx, kubeenv.KubeletOptions{})
	objs := renderFor(t, r.release, r.sbx, "--set", "substrate=kubernetes", "--set", "kubernetes.volumeSnapshotClass="+kubeenv.SnapshotClass)
	mapper := newMapper(srv)
	saName := ""
	for _, obj := range objs {
		switch obj.GetKind() {
		case "ServiceAccount":
			saName = obj.GetName()
		case "Role":
			if edit != nil {
				var role rbacv1.Role
				if err := runtimeFromUnstructured(obj, &role); err != nil {
					t.Fatal(err)
				}
				for i := range role.Rules {
					edit(&role.Rules[i])
				}
				m, err := toUnstructured(&role)
				if err != nil {
					t.Fatal(err)
				}
				obj = m
			}
		case "RoleBinding":
		default:
			continue
		}
		if err := apply(r.ctx, srv, mapper, obj, false); err != nil {
			t.Fatalf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	if saName == "" {
		t.Fatal("the chart rendered no ServiceAccount")
	}
	cfg := srv.TokenConfig(srv.ServiceAccountToken(t, r.release, saName))
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.cs = cs
	// The substrate as space-api builds it, from the chart's defaults, authenticated
	// as the chart's service account.
	k := config.Default().Kubernetes
	cluster := kubernetes.Cluster{Kubeconfig: srv.TokenKubeconfig(t, r.sbx, cfg.BearerToken), Namespace: r.sbx, QPS: k.QPS, Burst: k.Burst}
	if r.sub, err = kubernetes.Connect(cluster, kubernetes.Options{ReadyTimeout: 30 * time.Second,
		SnapshotClass: kubeenv.SnapshotClass, MountPath: k.MountPath}); err != nil {
		t.Fatal(err)
	}
	return r
}

// can asks the server, as the service account (a SelfSubjectAccessReview), whether it
// may verb resource/subresource in namespace.
func (r rbacRun) can(t *testing.T, namespace, group, resource, subresource, verb string) bool {
	t.Helper()
	review, err := r.cs.AuthorizationV1().SelfSubjectAccessReviews().Create(r.ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Group: group, Resource: resource, Subresource: subresource, Verb: verb,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return review.Status.Allowed
}

var errNoSnapshot = errors.New("the pause took no volume snapshot")

var exerciseShape = space.Shape{Template: "python-3.12", CPUMillis: 500, MemoryMiB: 512, DiskGiB: 2}

// exercise does, through the substrate, everything it does for the flow: check, warm,
// adopt, cold start and its retry, pause (with a snapshot) twice, restore, find, list,
// and stop of a slot, a sandbox and its storage. It returns the first failure.
func exercise(ctx context.Context, sub *kubernetes.Substrate) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tmpl := substrate.Template{Name: "python-3.12", Image: "python:3.12-slim"}
	spec := func(id string) substrate.Spec {
		return substrate.Spec{SandboxID: id, Client: "acme", Shape: exerciseShape, Template: tmpl}
	}
	const warmID, coldID = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
	if err := sub.Check(ctx); err != nil {
		return err
	}
	slot, err := sub.Warm(ctx, "33333333-3333-4333-8333-333333333333", exerciseShape, tmpl)
	if err != nil {
		return err
	}
	ref, err := sub.Adopt(ctx, slot, spec(warmID))
	if err != nil {
		return err
	}
	if _, err := sub.StartCold(ctx, spec(coldID)); err != nil {
		return err
	}
	if _, err := sub.StartCold(ctx, spec(coldID)); err != nil { // a retry: the claim exists
		return err
	}
	for range 2 {
		snap, err := sub.Snapshot(ctx, ref)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(snap, "volumesnapshot/") {
			return fmt.Errorf("%w: paused onto %s", errNoSnapshot, snap)
		}
		if ref, err = sub.Restore(ctx, snap, "", spec(warmID)); err != nil {
			return err
		}
	}
	if _, err := sub.List(ctx); err != nil {
		return err
	}
	other, err := sub.Warm(ctx, "44444444-4444-4444-8444-444444444444", exerciseShape, tmpl)
	if err != nil {
		return err
	}
	if err := sub.Stop(ctx, other); err != nil {
		return err
	}
	for _, id := range []string{warmID, coldID} {
		f, err := sub.Find(ctx, id)
		if err != nil {
			return err
		}
		for _, r := range append(f.Resources, f.Storage...) {
			if err := sub.Stop(ctx, r.Ref); err != nil {
				return err
			}
		}
	}
	return nil
}

func runtimeFromUnstructured(u *unstructured.Unstructured, into any) error {
	b, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &u.Object); err != nil {
		return nil, err
	}
	gv := schema.GroupVersion{Group: rbacv1.GroupName, Version: "v1"}
	u.SetAPIVersion(gv.String())
	u.SetKind("Role")
	return u, nil
}
