// Package helm tests the space-api Helm chart (deploy/helm/space-api) with a real helm
// binary and no cluster: `helm lint`, and `helm template` whose every rendered document
// is decoded strictly into its k8s.io/api type (a misspelt field is an error), checked
// for valid metadata, and asserted on.
//
// The test sits outside the chart directory so that `helm package` never ships it.
package helm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/substrate/kubernetes"
)

const (
	// helmVersion is built with `go install` into .services/bin (git-ignored) the first
	// time: there is no Debian package for helm. Minutes on 2 cores, cached after.
	helmVersion = "v3.22.0"
	// kubeVersion is the cluster version helm renders for. A go-installed helm defaults
	// to an old one (its build does not stamp the real default), which the chart's
	// kubeVersion constraint (>= 1.30, for the preStop sleep action) refuses.
	kubeVersion = "1.34.0"
	release     = "space"
	namespace   = "space-system"
	chartDir    = "space-api"
	fullValues  = "testdata/full-values.yaml"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary returns the helm binary, installing it into <repo>/.services/bin when it
// is missing. An install failure fails the test: it is never skipped.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			helmErr = err
			return
		}
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
			helmErr = fmt.Errorf("repository root not found from %s: %w", root, err)
			return
		}
		bin := filepath.Join(root, ".services", "bin")
		helmPath = filepath.Join(bin, "helm")
		if _, err := os.Stat(helmPath); err == nil {
			return
		}
		cmd := exec.Command("go", "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+bin)
		if out, err := cmd.CombinedOutput(); err != nil {
			helmErr = fmt.Errorf("helm is missing and could not be installed; run `GOBIN=%s go install helm.sh/helm/v3/cmd/helm@%s`: %w\n%s", bin, helmVersion, err, out)
		}
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

// runHelm runs helm with its home directories in a temporary directory, so that the
// test neither reads nor writes the user's helm configuration.
func runHelm(t *testing.T, args ...string) (stdout string, err error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// values writes a values file for one test and returns its path.
func values(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// templateArgs are the arguments of `helm template` for extra (-f, --set...).
func templateArgs(extra ...string) []string {
	return append([]string{"template", release, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, extra...)
}

// render runs helm template and decodes every document strictly.
func render(t *testing.T, extra ...string) manifests {
	t.Helper()
	out, err := runHelm(t, templateArgs(extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAll(t, out)
}

// renderFails runs helm template expecting it to fail, and returns its error text.
func renderFails(t *testing.T, extra ...string) string {
	t.Helper()
	_, err := runHelm(t, templateArgs(extra...)...)
	if err == nil {
		t.Fatalf("helm template %v succeeded, want a failure", extra)
	}
	return err.Error()
}

// doc is one rendered manifest.
type doc struct {
	kind, name string
	obj        any
}

type manifests []doc

// decoders are the types rendered documents are decoded into, by apiVersion/kind. A
// kind missing here fails the test, so a new template cannot skip validation.
var decoders = map[string]func() any{
	"v1/ConfigMap":                             func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                func() any { return &corev1.Secret{} },
	"v1/Service":                               func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                        func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                       func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":            func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":   func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"rbac.authorization.k8s.io/v1/Role":        func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any { return &rbacv1.RoleBinding{} },
	"networking.k8s.io/v1/NetworkPolicy":       func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor":  func() any { return &serviceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule":  func() any { return &prometheusRule{} },
	"networking.k8s.io/v1/Ingress":             func() any { return &networkingv1.Ingress{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":   func() any { return &httpRoute{} },
	"v1/Pod":                                   func() any { return &corev1.Pod{} },
}

// serviceMonitor is the part of prometheus-operator's monitoring.coreos.com/v1
// ServiceMonitor that the chart uses, decoded as strictly as the k8s.io/api types.
// It is written here because the operator's Go module would pull controller-runtime
// and newer shared Kubernetes modules into go.mod; a field the chart starts using
// must be added here, checked against the CRD's reference.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port,omitempty"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// httpRoute is the part of the Gateway API's gateway.networking.k8s.io/v1 HTTPRoute
// that the chart renders, decoded strictly, like serviceMonitor and for the same
// reason: sigs.k8s.io/gateway-api would pull controller-runtime into go.mod. Fields
// follow the v1 API reference; one the chart starts using must be added here.
type httpRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ParentRefs []struct {
			Group       *string `json:"group,omitempty"`
			Kind        *string `json:"kind,omitempty"`
			Namespace   *string `json:"namespace,omitempty"`
			Name        string  `json:"name"`
			SectionName *string `json:"sectionName,omitempty"`
			Port        *int32  `json:"port,omitempty"`
		} `json:"parentRefs"`
		Hostnames []string `json:"hostnames,omitempty"`
		Rules     []struct {
			Matches []struct {
				Path *struct {
					Type  string `json:"type"`
					Value string `json:"value"`
				} `json:"path,omitempty"`
				Headers     []httpRouteMatch `json:"headers,omitempty"`
				QueryParams []httpRouteMatch `json:"queryParams,omitempty"`
				Method      string           `json:"method,omitempty"`
			} `json:"matches,omitempty"`
			BackendRefs []struct {
				Group     *string `json:"group,omitempty"`
				Kind      *string `json:"kind,omitempty"`
				Name      string  `json:"name"`
				Namespace *string `json:"namespace,omitempty"`
				Port      *int32  `json:"port,omitempty"`
				Weight    *int32  `json:"weight,omitempty"`
			} `json:"backendRefs"`
		} `json:"rules"`
	} `json:"spec"`
}

type httpRouteMatch struct {
	Type  string `json:"type,omitempty"`
	Name  string `json:"name"`
	Value string `json:"value"`
}

var separator = regexp.MustCompile(`(?m)^---\s*$`)

func decodeAll(t *testing.T, out string) manifests {
	t.Helper()
	ms, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// decode splits helm's output into documents and decodes each strictly into its type,
// then validates its metadata (name, namespace, label and annotation syntax).
func decode(out string) (manifests, error) {
	var ms manifests
	for _, chunk := range separator.Split(out, -1) {
		j, err := yaml.YAMLToJSONStrict([]byte(chunk))
		if err != nil {
			return nil, fmt.Errorf("rendered YAML does not parse: %w\n%s", err, chunk)
		}
		if string(j) == "null" {
			continue // only comments
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(j, &tm); err != nil {
			return nil, err
		}
		newObj, ok := decoders[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			return nil, fmt.Errorf("no strict decoder for %s %s: add one to decoders", tm.APIVersion, tm.Kind)
		}
		obj := newObj()
		dec := json.NewDecoder(bytes.NewReader(j))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			return nil, fmt.Errorf("%s does not decode as a %s: %w\n%s", tm.Kind, tm.APIVersion, err, chunk)
		}
		om := objectMeta(obj)
		if errs := apivalidation.ValidateObjectMeta(om, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata")); len(errs) > 0 {
			return nil, fmt.Errorf("%s %s: %w", tm.Kind, om.Name, errs.ToAggregate())
		}
		ms = append(ms, doc{kind: tm.Kind, name: om.Name, obj: obj})
	}
	return ms, nil
}

func objectMeta(obj any) *metav1.ObjectMeta {
	type metaHaver interface{ GetObjectMeta() metav1.Object }
	if sm, ok := obj.(*serviceMonitor); ok {
		return &sm.ObjectMeta
	}
	if r, ok := obj.(*httpRoute); ok {
		return &r.ObjectMeta
	}
	if r, ok := obj.(*prometheusRule); ok {
		return &r.ObjectMeta
	}
	return obj.(metaHaver).GetObjectMeta().(*metav1.ObjectMeta)
}

func (ms manifests) all(kind string) []doc {
	var out []doc
	for _, d := range ms {
		if d.kind == kind {
			out = append(out, d)
		}
	}
	return out
}

// get returns the object of kind named name (or the only one of its kind when name is
// empty), failing the test when there is none.
func get[T any](t *testing.T, ms manifests, kind, name string) T {
	t.Helper()
	var found []doc
	for _, d := range ms.all(kind) {
		if name == "" || d.name == name {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %q, rendered %d", kind, name, len(found))
	}
	return found[0].obj.(T)
}

func deployment(t *testing.T, ms manifests) *appsv1.Deployment {
	t.Helper()
	return get[*appsv1.Deployment](t, ms, "Deployment", "")
}

func container(t *testing.T, d *appsv1.Deployment, name string) corev1.Container {
	t.Helper()
	all := append(slices.Clone(d.Spec.Template.Spec.InitContainers), d.Spec.Template.Spec.Containers...)
	for _, c := range all {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// envOf resolves a container's environment as the kubelet would: values as they are,
// secretKeyRefs from the rendered Secrets or from external, keyed "secret/key".
func envOf(t *testing.T, ms manifests, c corev1.Container, external map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("%s is set twice", e.Name)
		}
		if errs := validation.IsEnvVarName(e.Name); len(errs) > 0 {
			t.Errorf("env %s: %v", e.Name, errs)
		}
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if v, ok := external[ref.Name+"/"+ref.Key]; ok {
				env[e.Name] = v
				continue
			}
			s := get[*corev1.Secret](t, ms, "Secret", ref.Name)
			v, ok := s.Data[ref.Key]
			if !ok {
				t.Fatalf("%s refers to key %s missing from Secret %s", e.Name, ref.Key, ref.Name)
			}
			env[e.Name] = string(v)
		case e.ValueFrom.FieldRef != nil:
			// The downward API: what the kubelet would fill in is not known here.
			env[e.Name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
		default:
			t.Fatalf("%s: unexpected valueFrom %+v", e.Name, e.ValueFrom)
		}
	}
	return env
}

func getenv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// asMounted returns env with the files the pod would find at the rendered paths
// (SPACE_REDIS_PASSWORD_FILE, SPACE_REDIS_TLS_CA_FILE) written to a temporary
// directory and the variables pointing there, as the kubelet's mounts would provide
// them: config.Load may read them. TestRedisPasswordIsAFileFromTheExistingSecret
// checks the rendered paths are inside the right mounts.
func asMounted(t *testing.T, env map[string]string) map[string]string {
	t.Helper()
	out := maps.Clone(env)
	dir := t.TempDir()
	write := func(variable string, body []byte) {
		if _, ok := env[variable]; !ok {
			return
		}
		p := filepath.Join(dir, strings.ToLower(variable))
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
		out[variable] = p
	}
	write("SPACE_REDIS_PASSWORD_FILE", []byte("s3cret\n"))
	write("SPACE_REDIS_TLS_CA_FILE", selfSignedCA(t))
	return out
}

// selfSignedCA is a PEM CA certificate, as a mounted CA bundle would hold.
func selfSignedCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test redis CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func fileMode(m *int32) string {
	if m == nil {
		return "unset (0644)"
	}
	return fmt.Sprintf("%#o", *m)
}

// chartAppVersion is the chart's appVersion: the default image tag, and the version
// `make image` builds unless told otherwise.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %q, %v", chart.AppVersion, err)
	}
	return chart.AppVersion
}

// volumeOf returns the pod volume a container mounts at dir, and the mount.
func volumeOf(t *testing.T, d *appsv1.Deployment, c corev1.Container, dir string) (corev1.Volume, corev1.VolumeMount) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name {
				return v, m
			}
		}
		t.Fatalf("%s: mount %s names no volume", c.Name, m.Name)
	}
	t.Fatalf("%s mounts nothing at %s (mounts %+v)", c.Name, dir, c.VolumeMounts)
	return corev1.Volume{}, corev1.VolumeMount{}
}

// notRendered are the variables space-api reads that the chart renders on purpose
// never: a password in the environment (the chart mounts SPACE_REDIS_PASSWORD_FILE
// instead), a URL that may carry one (the chart renders SPACE_REDIS_ADDRS and the
// separate variables), and KUBECONFIG (in its cluster, the substrate uses the service
// account).
var notRendered = []string{"SPACE_REDIS_PASSWORD", "SPACE_REDIS_URL", "KUBECONFIG"}

// The Secret the full values point at for the database.
var fullExternal = map[string]string{"pg-app/uri": "postgres://space:secret@pg-rw.db:5432/space"}

func TestChartLintsCleanWithTheDefaultAndTheFullValues(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"default": {"lint", "--strict", chartDir, "--kube-version", kubeVersion},
		"full":    {"lint", "--strict", chartDir, "--kube-version", kubeVersion, "-f", fullValues},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := runHelm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Errorf("lint output:\n%s", out)
			}
		})
	}
}

func TestDefaultRenderIsAValidHighlyAvailableDeployment(t *testing.T) {
	t.Parallel()
	ms := render(t)
	d := deployment(t, ms)
	spec := d.Spec.Template.Spec

	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas = %v, want at least 2", d.Spec.Replicas)
	}
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxUnavailable.String() != "0" {
		t.Errorf("strategy = %+v, want a rolling update with maxUnavailable 0", d.Spec.Strategy)
	}
	api := container(t, d, "space-api")
	// Readiness follows the dependencies (/readyz); liveness and startup only the
	// process (/healthz): a Postgres outage must not restart every replica.
	for name, c := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"startup": {api.StartupProbe, "/healthz"}, "readiness": {api.ReadinessProbe, "/readyz"}, "liveness": {api.LivenessProbe, "/healthz"}} {
		if c.p == nil || c.p.HTTPGet == nil || c.p.HTTPGet.Path != c.path || c.p.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe = %+v, want %s on the http port", name, c.p, c.path)
		}
	}
	if p := api.StartupProbe; p != nil && p.PeriodSeconds*p.FailureThreshold < 120 {
		t.Errorf("the startup probe allows %ds to start, want at least 2 minutes (migrations, a slow Postgres)", p.PeriodSeconds*p.FailureThreshold)
	}
	if api.Resources.Requests.Cpu().IsZero() || api.Resources.Requests.Memory().IsZero() || api.Resources.Limits.Cpu().IsZero() || api.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want cpu and memory requests and limits", api.Resources)
	}
	wantPorts := map[string]int32{"http": 8080, "internal": 8081}
	if len(api.Ports) != 2 {
		t.Errorf("ports = %+v, want http and internal", api.Ports)
	}
	for _, p := range api.Ports {
		if wantPorts[p.Name] != p.ContainerPort {
			t.Errorf("port %s = %d", p.Name, p.ContainerPort)
		}
		if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
			t.Errorf("port name %s: %v", p.Name, errs)
		}
	}

	// Drain: preStop sleep, then SIGTERM and SPACE_SHUTDOWN_TIMEOUT, all within the
	// grace period.
	if api.Lifecycle == nil || api.Lifecycle.PreStop == nil || api.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("no preStop sleep: %+v", api.Lifecycle)
	}
	env := envOf(t, ms, api, nil)
	cfg, err := config.Load(getenv(env))
	if err != nil {
		t.Fatalf("the rendered env does not load: %v", err)
	}
	drain := int64(cfg.ShutdownTimeout.Seconds()) + api.Lifecycle.PreStop.Sleep.Seconds
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= drain || *g != drain+5 {
		t.Errorf("terminationGracePeriodSeconds = %v, want shutdown + preStop + 5 = %d", g, drain+5)
	}

	sc := api.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("securityContext = %+v, want non-root, read-only root, no escalation, ALL dropped", sc)
	}
	if spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot {
		t.Errorf("pod securityContext = %+v, want runAsNonRoot", spec.SecurityContext)
	}

	// Migrations run first, with the same configuration.
	mig := container(t, d, "migrate")
	if !slices.Equal(mig.Args, []string{"migrate"}) || !slices.Equal(api.Args, []string{"serve"}) {
		t.Errorf("args: migrate %v, api %v", mig.Args, api.Args)
	}
	if _, err := config.Load(getenv(envOf(t, ms, mig, nil))); err != nil {
		t.Errorf("the migrate container's env does not load: %v", err)
	}

	if cfg.Auth.Mode != config.AuthAPIKey || cfg.Sandbox.Substrate != "simulated" || len(cfg.Redis.Addrs) != 1 || cfg.Admission.Client != nil {
		t.Errorf("default config = %+v", cfg)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("the simulated substrate mounts an API token")
	}
	if pdb := get[*policyv1.PodDisruptionBudget](t, ms, "PodDisruptionBudget", ""); pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB = %+v", pdb.Spec)
	}
	for _, kind := range []string{"HorizontalPodAutoscaler", "ServiceMonitor", "NetworkPolicy", "Role", "RoleBinding", "Ingress", "HTTPRoute"} {
		if n := len(ms.all(kind)); n != 0 {
			t.Errorf("%d %s rendered by default, want none", n, kind)
		}
	}
	templates := get[*corev1.ConfigMap](t, ms, "ConfigMap", release+"-space-api-templates")
	if _, err := substrate.ParseTemplates([]byte(templates.Data["templates.json"])); err != nil {
		t.Errorf("templates.json: %v", err)
	}
}

func TestFullRenderSetsEveryOptionalPart(t *testing.T) {
	t.Parallel()
	ms := render(t, "-f", fullValues)
	d := deployment(t, ms)
	api := container(t, d, "space-api")
	env := envOf(t, ms, api, fullExternal)

	cfg, err := config.Load(getenv(asMounted(t, env)))
	if err != nil {
		t.Fatalf("the rendered env does not load: %v", err)
	}
	if cfg.Admission.Client == nil || cfg.Admission.Client.RefillRPS != 0.5 || cfg.Admission.Client.Burst != 20 {
		t.Errorf("client rate = %+v, want 0.5/s burst 20", cfg.Admission.Client)
	}
	if !slices.Equal(cfg.Redis.Addrs, []string{"redis-0.redis:6379", "redis-1.redis:6379", "redis-2.redis:6379"}) {
		t.Errorf("redis addrs = %v, want the three cluster nodes", cfg.Redis.Addrs)
	}
	if cfg.DatabaseURL != fullExternal["pg-app/uri"] {
		t.Errorf("database URL = %q, want the existing Secret's", cfg.DatabaseURL)
	}
	if cfg.Auth.FailureRate.RefillRPS != 0.5 || cfg.Auth.FailureRate.Burst != 50 {
		t.Errorf("failed-auth rate = %+v, want 0.5/s burst 50", cfg.Auth.FailureRate)
	}
	if cfg.Auth.Mode != config.AuthTrustedHeader || len(cfg.Auth.TrustedProxyCIDRs) != 2 || cfg.Admission.FailureMode != config.FailClosed || !cfg.Admission.Shadow {
		t.Errorf("config = %+v", cfg)
	}
	if cfg.Sandbox.MaxBodyBytes != 1048576 || cfg.Admission.Cluster.RefillRPS != 2500 || cfg.Dispatcher.Workers != 32 || cfg.ShutdownTimeout.Seconds() != 40 {
		t.Errorf("numbers = body %d, rps %v, workers %d, shutdown %s", cfg.Sandbox.MaxBodyBytes, cfg.Admission.Cluster.RefillRPS, cfg.Dispatcher.Workers, cfg.ShutdownTimeout)
	}
	if cfg.Pool.RefillReserve != 0.3 {
		t.Errorf("refill reserve = %v, want 0.3", cfg.Pool.RefillReserve)
	}
	if cfg.IdempotencyKeyTTL.Hours() != 72 {
		t.Errorf("idempotency key TTL = %s, want 72h", cfg.IdempotencyKeyTTL)
	}
	if env["GOMEMLIMIT"] != "450MiB" {
		t.Errorf("extraEnv not rendered")
	}

	if k := cfg.Kubernetes; k.Namespace != "sandboxes" || k.ReadyTimeout.Seconds() != 90 || k.QPS != 100 || k.Burst != 200 ||
		k.MountPath != "/home/user" || k.StorageClass != "fast.ssd" || k.SnapshotClass != "csi-snapshots" {
		t.Errorf("kubernetes config = %+v", k)
	}
	if sa := d.Spec.Template.Spec.AutomountServiceAccountToken; sa == nil || !*sa {
		t.Errorf("the kubernetes substrate has no API token")
	}
	templates := get[*corev1.ConfigMap](t, ms, "ConfigMap", release+"-space-api-templates")
	ts, err := substrate.ParseTemplates([]byte(templates.Data["templates.json"]))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubernetes.CheckTemplates(ts); err != nil {
		t.Errorf("templates do not build pods: %v", err)
	}

	if d.Spec.Replicas != nil {
		t.Errorf("replicas = %d with an HPA, want it left to the HPA", *d.Spec.Replicas)
	}
	hpa := get[*autoscalingv2.HorizontalPodAutoscaler](t, ms, "HorizontalPodAutoscaler", "")
	if hpa.Spec.ScaleTargetRef.Name != d.Name || hpa.Spec.MaxReplicas != 12 || len(hpa.Spec.Metrics) != 2 {
		t.Errorf("HPA = %+v", hpa.Spec)
	}
	if pdb := get[*policyv1.PodDisruptionBudget](t, ms, "PodDisruptionBudget", ""); pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("PDB = %+v, want minAvailable 2 only", pdb.Spec)
	}
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 60 {
		t.Errorf("terminationGracePeriodSeconds = %v, want 60", g)
	}
	if n := len(ms.all("Secret")); n != 1 {
		t.Errorf("%d Secrets, want the chart's one for Redis", n)
	}
}

func TestEveryConfigVariableIsRendered(t *testing.T) {
	t.Parallel()
	// The full values switch on everything but the simulated substrate's knob, which
	// the second render sets.
	rendered := map[string]bool{}
	for _, args := range [][]string{{"-f", fullValues}, {"--set", "simulated.coldStart=300ms,simulated.timeout=5s,simulated.stateDir=/tmp/sim"}} {
		ms := render(t, args...)
		for _, e := range container(t, deployment(t, ms), "space-api").Env {
			rendered[e.Name] = true
		}
	}
	for _, v := range config.Vars() {
		name := v.Name
		if slices.Contains(notRendered, name) {
			if rendered[name] {
				t.Errorf("%s is rendered: the chart must never put it in the environment", name)
			}
			continue
		}
		if !rendered[name] {
			t.Errorf("%s is read by space-api but no chart value renders it", name)
		}
	}
}

func TestClientRateEnvIsAbsentUnlessBothHalvesAreSet(t *testing.T) {
	t.Parallel()
	const rps, burst = "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS", "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST"

	ms := render(t)
	for _, c := range []string{"space-api", "migrate"} {
		env := envOf(t, ms, container(t, deployment(t, ms), c), nil)
		for _, name := range []string{rps, burst} {
			if _, ok := env[name]; ok {
				t.Errorf("%s: %s rendered with no per-client rate in the values", c, name)
			}
		}
	}

	ms = render(t, "--set", "admission.clientRefillRps=3", "--set", "admission.clientBurst=9")
	env := envOf(t, ms, container(t, deployment(t, ms), "space-api"), nil)
	if env[rps] != "3" || env[burst] != "9" {
		t.Errorf("client rate env = %q/%q, want 3/9", env[rps], env[burst])
	}

	for _, half := range []string{"admission.clientRefillRps=3", "admission.clientBurst=9"} {
		msg := renderFails(t, "--set", half)
		if !strings.Contains(msg, "admission.clientRefillRps and admission.clientBurst must be set together") {
			t.Errorf("--set %s: %s", half, msg)
		}
	}
}

func TestFlagsConfigMapIsADirectoryMountThatSpaceFlagsFilePointsInto(t *testing.T) {
	t.Parallel()
	ms := render(t, "-f", fullValues)
	d := deployment(t, ms)
	api := container(t, d, "space-api")
	env := envOf(t, ms, api, fullExternal)

	var volume string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == release+"-space-api-flags" {
			volume = v.Name
			if len(v.ConfigMap.Items) != 0 {
				t.Errorf("the flags volume projects items %v: keep the whole directory", v.ConfigMap.Items)
			}
		}
	}
	if volume == "" {
		t.Fatal("no volume of the flags ConfigMap")
	}
	var mount *corev1.VolumeMount
	for i, m := range api.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("mount %s uses subPath: it would never see a ConfigMap update", m.Name)
		}
		if m.Name == volume {
			mount = &api.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatal("the flags volume is not mounted")
	}
	file := env["SPACE_FLAGS_FILE"]
	if filepath.Dir(file) != mount.MountPath {
		t.Errorf("SPACE_FLAGS_FILE = %s, want a file directly in the mount %s", file, mount.MountPath)
	}
	cm := get[*corev1.ConfigMap](t, ms, "ConfigMap", release+"-space-api-flags")
	body, ok := cm.Data[filepath.Base(file)]
	if !ok {
		t.Fatalf("the ConfigMap has no key %s: %v", filepath.Base(file), cm.Data)
	}

	// flagd format, static defaultVariant, and the demo's quota shape.
	var flags struct {
		Flags map[string]struct {
			State          string                     `json:"state"`
			Variants       map[string]json.RawMessage `json:"variants"`
			DefaultVariant string                     `json:"defaultVariant"`
		} `json:"flags"`
	}
	if err := json.Unmarshal([]byte(body), &flags); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"space-api-client-concurrency-quotas", "space-api-warm-pool"} {
		f, ok := flags.Flags[key]
		if !ok || f.State != "ENABLED" || f.Variants[f.DefaultVariant] == nil {
			t.Errorf("flag %s = %+v", key, f)
		}
	}
	var quotas struct {
		Clients map[string]json.RawMessage `json:"clients"`
		Rate    map[string]*struct {
			RefillRPS float64 `json:"refill_rps"`
			Burst     int64   `json:"burst"`
		} `json:"rate"`
	}
	q := flags.Flags["space-api-client-concurrency-quotas"]
	if err := json.Unmarshal(q.Variants[q.DefaultVariant], &quotas); err != nil {
		t.Fatal(err)
	}
	if len(quotas.Clients) != 2 || quotas.Rate["acme"] == nil || quotas.Rate["acme"].Burst != 40 || quotas.Rate["globex"] != nil {
		t.Errorf("quotas = %+v", quotas)
	}
	if _, ok := quotas.Rate["globex"]; !ok {
		t.Errorf("the null rate of globex (exempt) was dropped")
	}
}

func TestAFlagsChangeLeavesThePodTemplateAloneWhileAConfigChangeRollsIt(t *testing.T) {
	t.Parallel()
	podTemplate := func(ms manifests) (string, string) {
		d := deployment(t, ms)
		b, err := json.Marshal(d.Spec.Template)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), d.Spec.Template.Annotations["checksum/config"]
	}
	base := render(t, "-f", fullValues)
	baseTemplate, baseSum := podTemplate(base)
	if len(baseSum) != 64 {
		t.Fatalf("checksum/config = %q, want a sha256", baseSum)
	}

	flagsChanged := render(t, "-f", fullValues, "-f", values(t, `
flags:
  quotas:
    clients: {acme: {concurrency: 99}, initech: {}}
    default: {concurrency: 1, live_sandboxes: 1}
    rate: {acme: {refill_rps: 1000, burst: 1}, unknown: {refill_rps: 0.1, burst: 1}}
  warmPool:
    shapes: [{template: python-3.12, cpu_millis: 500, memory_mib: 512, disk_gib: 1, target: 50}]
`))
	if tmpl, _ := podTemplate(flagsChanged); tmpl != baseTemplate {
		t.Errorf("a flags-only change altered the pod template, which would restart every pod")
	}
	name := release + "-space-api-flags"
	if get[*corev1.ConfigMap](t, flagsChanged, "ConfigMap", name).Data["flags.json"] == get[*corev1.ConfigMap](t, base, "ConfigMap", name).Data["flags.json"] {
		t.Errorf("the flags change did not reach the ConfigMap")
	}

	// Templates are reloaded live too: a template change reaches the ConfigMap and
	// leaves the pods running.
	templateChanged := render(t, "-f", fullValues, "--set", "sandboxTemplates.python-3\\.12.image=python:3.13-slim")
	if tmpl, _ := podTemplate(templateChanged); tmpl != baseTemplate {
		t.Errorf("a template-only change altered the pod template, which would restart every pod")
	}
	tname := release + "-space-api-templates"
	if get[*corev1.ConfigMap](t, templateChanged, "ConfigMap", tname).Data["templates.json"] == get[*corev1.ConfigMap](t, base, "ConfigMap", tname).Data["templates.json"] {
		t.Errorf("the template change did not reach the ConfigMap")
	}

	for what, args := range map[string][]string{
		"cluster rate":    {"--set", "admission.refillRps=10"},
		"redis addresses": {"--set", "redis.addrs={redis-a:6379}"},
	} {
		_, sum := podTemplate(render(t, append([]string{"-f", fullValues}, args...)...))
		if sum == baseSum {
			t.Errorf("changing the %s left checksum/config unchanged: pods would keep the old config", what)
		}
	}
	// The database URL only lives in the chart's Secret: the checksum is all that
	// rolls the pods.
	_, a := podTemplate(render(t))
	_, b := podTemplate(render(t, "--set", "database.url=postgres://other@db:5432/space"))
	if a == b {
		t.Errorf("changing database.url left checksum/config unchanged")
	}
}

func TestRBACIsRenderedOnlyForTheKubernetesSubstrate(t *testing.T) {
	t.Parallel()
	if ms := render(t); len(ms.all("Role"))+len(ms.all("RoleBinding")) != 0 {
		t.Errorf("RBAC rendered with the simulated substrate")
	}
	if ms := render(t, "--set", "substrate=kubernetes", "--set", "rbac.create=false"); len(ms.all("Role")) != 0 {
		t.Errorf("RBAC rendered with rbac.create=false")
	}

	ms := render(t, "--set", "substrate=kubernetes")
	role := get[*rbacv1.Role](t, ms, "Role", "")
	if role.Namespace != namespace {
		t.Errorf("role namespace = %s, want the release's when kubernetes.namespace is empty", role.Namespace)
	}
	// Without a snapshot class, no verb on volume snapshots (what each verb is for is
	// checked against an API server: TestChartOnAnAPIServer).
	for _, r := range role.Rules {
		if !slices.Equal(r.APIGroups, []string{""}) || len(r.Resources) != 1 || (r.Resources[0] != "pods" && r.Resources[0] != "persistentvolumeclaims") {
			t.Errorf("rule = %+v, want core pods and persistentvolumeclaims only", r)
		}
	}
	if len(role.Rules) != 2 {
		t.Errorf("rules = %+v, want one for pods and one for claims", role.Rules)
	}
	rb := get[*rbacv1.RoleBinding](t, ms, "RoleBinding", "")
	sa := get[*corev1.ServiceAccount](t, ms, "ServiceAccount", "")
	if rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != sa.Name || rb.Subjects[0].Namespace != namespace {
		t.Errorf("binding = %+v, want the role bound to service account %s", rb, sa.Name)
	}
	if d := deployment(t, ms); d.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as %s, not the bound account %s", d.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}

	full := render(t, "-f", fullValues)
	if role := get[*rbacv1.Role](t, full, "Role", ""); role.Namespace != "sandboxes" {
		t.Errorf("role namespace = %s, want kubernetes.namespace", role.Namespace)
	}
}

func TestTheInternalPortIsNeverOnThePublicService(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{"default": nil, "full": {"-f", fullValues}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ms := render(t, args...)
			public := get[*corev1.Service](t, ms, "Service", release+"-space-api")
			internal := get[*corev1.Service](t, ms, "Service", release+"-space-api-internal")
			for _, p := range public.Spec.Ports {
				if p.TargetPort.String() != "http" || p.Port == 8081 {
					t.Errorf("public Service port %+v: only http belongs there", p)
				}
			}
			if len(internal.Spec.Ports) != 1 || internal.Spec.Ports[0].TargetPort.String() != "internal" || internal.Spec.Type != corev1.ServiceTypeClusterIP {
				t.Errorf("internal Service = %+v, want a ClusterIP on the internal port", internal.Spec)
			}
			if internal.Labels["space.dev/listener"] == public.Labels["space.dev/listener"] {
				t.Errorf("the Services share their listener label: a ServiceMonitor could select both")
			}
			if name != "full" {
				return
			}
			sm := get[*serviceMonitor](t, ms, "ServiceMonitor", "")
			for k, v := range sm.Spec.Selector.MatchLabels {
				if internal.Labels[k] != v {
					t.Errorf("the ServiceMonitor selector %s=%s misses the internal Service", k, v)
				}
			}
			if public.Labels["space.dev/listener"] == sm.Spec.Selector.MatchLabels["space.dev/listener"] {
				t.Errorf("the ServiceMonitor selects the public Service")
			}
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "internal" || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoints = %+v", sm.Spec.Endpoints)
			}
			np := get[*networkingv1.NetworkPolicy](t, ms, "NetworkPolicy", "")
			for _, rule := range np.Spec.Ingress {
				for _, p := range rule.Ports {
					if p.Port != nil && p.Port.String() == "internal" && len(rule.From) == 0 {
						t.Errorf("the NetworkPolicy opens the internal port to everyone")
					}
				}
			}
			if len(np.Spec.Ingress) != 2 || len(np.Spec.Ingress[1].From) != 2 {
				t.Errorf("NetworkPolicy ingress = %+v, want public and internal rules", np.Spec.Ingress)
			}
		})
	}
}

func TestEverySelectorSelectsThePods(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{"default": nil, "full": {"-f", fullValues}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ms := render(t, args...)
			d := deployment(t, ms)
			pod := d.Spec.Template.Labels
			selects := func(what string, sel map[string]string) {
				t.Helper()
				if len(sel) == 0 {
					t.Errorf("%s has an empty selector", what)
				}
				for k, v := range sel {
					if pod[k] != v {
						t.Errorf("%s selects %s=%s, which the pods (%v) do not carry", what, k, v, pod)
					}
				}
			}
			selects("the Deployment", d.Spec.Selector.MatchLabels)
			for _, svc := range ms.all("Service") {
				selects("Service "+svc.name, svc.obj.(*corev1.Service).Spec.Selector)
			}
			selects("the PodDisruptionBudget", get[*policyv1.PodDisruptionBudget](t, ms, "PodDisruptionBudget", "").Spec.Selector.MatchLabels)
			for _, np := range ms.all("NetworkPolicy") {
				selects("the NetworkPolicy", np.obj.(*networkingv1.NetworkPolicy).Spec.PodSelector.MatchLabels)
			}
			if spread := d.Spec.Template.Spec.TopologySpreadConstraints; len(spread) == 1 {
				selects("the topology spread", spread[0].LabelSelector.MatchLabels)
			}
		})
	}
}

func TestExistingSecretsReplaceTheChartSecret(t *testing.T) {
	t.Parallel()
	ms := render(t, "-f", fullValues, "--set", "redis.existingSecret=redis-cluster", "--set", "redis.existingSecretKey=addrs")
	if n := len(ms.all("Secret")); n != 0 {
		t.Errorf("%d Secrets rendered with both values in existing Secrets", n)
	}
	env := envOf(t, ms, container(t, deployment(t, ms), "space-api"), map[string]string{
		"pg-app/uri":          fullExternal["pg-app/uri"],
		"redis-cluster/addrs": "r0:6379,r1:6379,r2:6379",
	})
	cfg, err := config.Load(getenv(asMounted(t, env)))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Redis.Addrs) != 3 {
		t.Errorf("redis addrs = %v", cfg.Redis.Addrs)
	}
}

func TestSchemaRejectsWrongTypesWithAMessageNamingTheValue(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ set, want string }{
		{"replicas=two", "/replicas"},
		{"admission.clientRefillRps=fast", "/admission/clientRefillRps"},
		{"admission.burst=0", "/admission/burst"},
		{"auth.mode=none", "/auth/mode"},
		{"substrate=docker", "/substrate"},
		{"redis.timeout=100", "/redis/timeout"},
		{"redis.mode=sentinel", "/redis/mode"},
		{"redis.tls.caFile=ca.crt", "/redis/tls/caFile"},
		{"redis.auth.password=hunter2", "/redis/auth"},
		{"image.digest=latest", "/image/digest"},
		{"startupProbe.failureThreshold=0", "/startupProbe/failureThreshold"},
		{"ingress.className=Nginx_Class", "/ingress/className"},
		{"replicaCount=3", "replicaCount"},
	} {
		t.Run(c.set, func(t *testing.T) {
			t.Parallel()
			msg := renderFails(t, "--set", c.set)
			if !strings.Contains(msg, "schema") || !strings.Contains(msg, c.want) {
				t.Errorf("template: %s", msg)
			}
			_, err := runHelm(t, "lint", chartDir, "--kube-version", kubeVersion, "--set", c.set)
			if err == nil {
				t.Errorf("helm lint passed --set %s", c.set)
			}
		})
	}
}

func TestRenderFailsClearlyOnValuesThatCannotWorkTogether(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"trusted header without proxies", []string{"--set", "auth.mode=trusted_header"}, "auth.trustedProxyCIDRs is required"},
		{"grace shorter than the drain", []string{"--set", "terminationGracePeriodSeconds=20"}, "terminationGracePeriodSeconds (20) must exceed"},
		{"no database", []string{"--set", "database.url="}, "set database.url or database.existingSecret"},
		{"no redis", []string{"--set", "redis.addrs=null"}, "set redis.addrs or redis.existingSecret"},
		{"one port for both listeners", []string{"--set", "ports.internal=8080"}, "ports.http and ports.internal must differ"},
		{"internal port open to all", []string{"--set", "networkPolicy.enabled=true", "--set", "networkPolicy.internalFrom=null"}, "networkPolicy.internalFrom needs at least one peer"},
		{"a Redis CA without TLS", []string{"--set", "redis.tls.caFile=/etc/ca.crt"}, "redis.tls.caFile and redis.tls.serverName need redis.tls.enabled"},
		{"a Redis server name without TLS", []string{"--set", "redis.tls.serverName=redis.example.com"}, "need redis.tls.enabled"},
		{"extraEnv over a chart variable", []string{"--set-json", `extraEnv=[{"name":"GOMEMLIMIT","value":"1GiB"},{"name":"SPACE_REDIS_TLS","value":"true"}]`}, "extraEnv[1] sets SPACE_REDIS_TLS, which the chart already sets"},
		{"an extra volume named like the chart's", []string{"--set-json", `extraVolumes=[{"name":"tmp","emptyDir":{}}]`}, "extraVolumes[0] is named tmp"},
		{"an Ingress without hosts", []string{"--set", "ingress.enabled=true", "--set", "ingress.hosts=null"}, "ingress.hosts needs at least one host"},
		{"an HTTPRoute without a Gateway", []string{"--set", "httpRoute.enabled=true"}, "httpRoute.parentRefs needs the Gateway"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if msg := renderFails(t, c.args...); !strings.Contains(msg, c.want) {
				t.Errorf("error = %s, want %q", msg, c.want)
			}
		})
	}
}

func TestDecodeRefusesAMisspeltFieldAndAnUnknownKind(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ doc, want string }{
		"misspelt field": {"apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: ns}\nspec: {prots: []}\n", "prots"},
		"unknown kind":   {"apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n", "no strict decoder"},
		"bad label":      {"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: ns, labels: {a: 'no spaces'}}\n", "metadata.labels"},
		"duplicate key":  {"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: ns}\ndata: {a: b, a: c}\n", "already set"},
	} {
		if _, err := decode("---\n" + c.doc); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to mention %q", name, err, c.want)
		}
	}
}

func TestTheDefaultImageIsWhatMakeImageBuilds(t *testing.T) {
	t.Parallel()
	// tools/image tags space-sandbox/space-api:<appVersion> by default (its test checks
	// it against values.yaml); the chart must ask for exactly that.
	want := "space-sandbox/space-api:" + chartAppVersion(t)
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"by default", nil, want},
		{"pinned by digest", []string{"--set", "image.digest=" + digest}, "space-sandbox/space-api@" + digest},
		{"pinned by digest with a tag", []string{"--set", "image.digest=" + digest, "--set", "image.tag=0.1.0"}, "space-sandbox/space-api:0.1.0@" + digest},
		{"with the full values", []string{"-f", fullValues}, "registry.example.com/space/space-api:1.2.3@" + digest},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := deployment(t, render(t, c.args...))
			for _, name := range []string{"migrate", "space-api"} {
				if img := container(t, d, name).Image; img != c.want {
					t.Errorf("%s runs %s, want %s", name, img, c.want)
				}
			}
		})
	}
}

func TestRedisPasswordIsAFileFromTheExistingSecretNeverAValue(t *testing.T) {
	t.Parallel()
	ms := render(t, "-f", fullValues)
	d := deployment(t, ms)
	for _, name := range []string{"space-api", "migrate"} {
		c := container(t, d, name)
		env := envOf(t, ms, c, fullExternal)

		// The password: a file in a read-only directory mount (no subPath, so a rotated
		// Secret reaches it) of the existing Secret's key, readable by group 65532 only.
		file := env["SPACE_REDIS_PASSWORD_FILE"]
		if !filepath.IsAbs(file) {
			t.Fatalf("%s: SPACE_REDIS_PASSWORD_FILE = %q, want an absolute path", name, file)
		}
		v, m := volumeOf(t, d, c, filepath.Dir(file))
		if !m.ReadOnly || m.SubPath != "" {
			t.Errorf("%s: password mount %+v, want a read-only directory", name, m)
		}
		if v.Secret == nil || v.Secret.SecretName != "redis-auth" || len(v.Secret.Items) != 1 ||
			v.Secret.Items[0].Key != "password" || v.Secret.Items[0].Path != filepath.Base(file) {
			t.Errorf("%s: password volume %+v, want key password of Secret redis-auth at %s", name, v.VolumeSource, filepath.Base(file))
		}
		if v.Secret != nil {
			if mode := v.Secret.DefaultMode; mode == nil || *mode != 0o440 {
				t.Errorf("%s: password file mode %s, want 0440 (root, group fsGroup)", name, fileMode(mode))
			}
		}
		for _, e := range c.Env {
			if strings.Contains(e.Name, "PASSWORD") && e.Name != "SPACE_REDIS_PASSWORD_FILE" {
				t.Errorf("%s: %s renders a password into the environment", name, e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "redis-auth" {
				t.Errorf("%s: %s reads the Redis password Secret into the environment", name, e.Name)
			}
		}

		// The CA: a file in one of extraVolumeMounts.
		ca := env["SPACE_REDIS_TLS_CA_FILE"]
		if v, _ := volumeOf(t, d, c, filepath.Dir(ca)); v.ConfigMap == nil || v.ConfigMap.Name != "redis-ca" {
			t.Errorf("%s: SPACE_REDIS_TLS_CA_FILE = %s is not in the redis-ca ConfigMap volume: %+v", name, ca, v)
		}
		for k, want := range map[string]string{
			"SPACE_REDIS_USERNAME":        "space",
			"SPACE_REDIS_TLS":             "true",
			"SPACE_REDIS_TLS_SERVER_NAME": "redis.internal.example.com",
			"SPACE_REDIS_MODE":            "cluster",
		} {
			if env[k] != want {
				t.Errorf("%s: %s = %q, want %q", name, k, env[k], want)
			}
		}
	}

	// The defaults: plain TCP, no auth, mode auto, and no password volume.
	ms = render(t)
	d = deployment(t, ms)
	env := envOf(t, ms, container(t, d, "space-api"), nil)
	if env["SPACE_REDIS_TLS"] != "false" || env["SPACE_REDIS_MODE"] != "auto" {
		t.Errorf("default TLS %q mode %q, want false and auto", env["SPACE_REDIS_TLS"], env["SPACE_REDIS_MODE"])
	}
	for _, k := range []string{"SPACE_REDIS_USERNAME", "SPACE_REDIS_PASSWORD_FILE", "SPACE_REDIS_TLS_CA_FILE", "SPACE_REDIS_TLS_SERVER_NAME"} {
		if _, ok := env[k]; ok {
			t.Errorf("%s rendered by default", k)
		}
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			t.Errorf("volume %s mounts a Secret by default", v.Name)
		}
	}

	// Another key of another Secret.
	ms = render(t, "--set", "redis.auth.existingSecret=elasticache", "--set", "redis.auth.existingSecretPasswordKey=auth-token")
	d = deployment(t, ms)
	c := container(t, d, "space-api")
	v, _ := volumeOf(t, d, c, filepath.Dir(envOf(t, ms, c, nil)["SPACE_REDIS_PASSWORD_FILE"]))
	if v.Secret == nil || v.Secret.SecretName != "elasticache" || v.Secret.Items[0].Key != "auth-token" {
		t.Errorf("password volume %+v, want key auth-token of Secret elasticache", v.VolumeSource)
	}
}

func TestExtraVolumesAndEnvReachBothContainers(t *testing.T) {
	t.Parallel()
	ms := render(t, "-f", fullValues)
	d := deployment(t, ms)
	for _, name := range []string{"space-api", "migrate"} {
		c := container(t, d, name)
		// migrate connects to Postgres too: a CA for sslmode=verify-full must be there.
		for _, dir := range []string{"/etc/space/redis-ca", "/etc/space/db-ca"} {
			if _, m := volumeOf(t, d, c, dir); !m.ReadOnly {
				t.Errorf("%s: %s is writable", name, dir)
			}
		}
		env := envOf(t, ms, c, fullExternal)
		if env["GOMEMLIMIT"] != "450MiB" || env["OTEL_SERVICE_NAME"] == "" {
			t.Errorf("%s: extraEnv missing: GOMEMLIMIT=%q OTEL_SERVICE_NAME=%q", name, env["GOMEMLIMIT"], env["OTEL_SERVICE_NAME"])
		}
	}
}

func TestIngressAndHTTPRouteReachOnlyThePublicService(t *testing.T) {
	t.Parallel()
	ms := render(t, "-f", fullValues)
	public := get[*corev1.Service](t, ms, "Service", release+"-space-api")
	internal := get[*corev1.Service](t, ms, "Service", release+"-space-api-internal")
	if len(public.Spec.Ports) != 1 || public.Spec.Ports[0].TargetPort.String() != "http" {
		t.Fatalf("public Service ports = %+v", public.Spec.Ports)
	}
	port := public.Spec.Ports[0]

	ing := get[*networkingv1.Ingress](t, ms, "Ingress", "")
	if ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" || len(ing.Spec.Rules) != 2 {
		t.Errorf("Ingress spec = %+v", ing.Spec)
	}
	if len(ing.Spec.TLS) != 1 || ing.Spec.TLS[0].SecretName != "space-tls" || len(ing.Spec.TLS[0].Hosts) != 2 {
		t.Errorf("Ingress TLS = %+v", ing.Spec.TLS)
	}
	paths := 0
	for _, r := range ing.Spec.Rules {
		for _, p := range r.HTTP.Paths {
			paths++
			b := p.Backend.Service
			if b == nil || b.Name != public.Name || b.Port.Name != port.Name || b.Port.Number != 0 {
				t.Errorf("Ingress path %s %s goes to %+v, want the public Service's %s port", r.Host, p.Path, b, port.Name)
			}
		}
	}
	if paths != 3 {
		t.Errorf("Ingress has %d paths, want the full values' 3", paths)
	}

	route := get[*httpRoute](t, ms, "HTTPRoute", "")
	if route.APIVersion != "gateway.networking.k8s.io/v1" || route.Kind != "HTTPRoute" || route.Namespace != namespace {
		t.Errorf("HTTPRoute type = %+v in %s", route.TypeMeta, route.Namespace)
	}
	if len(route.Spec.ParentRefs) != 1 || route.Spec.ParentRefs[0].Name != "public" || !slices.Equal(route.Spec.Hostnames, []string{"space.example.com"}) {
		t.Errorf("HTTPRoute parents %+v hostnames %v", route.Spec.ParentRefs, route.Spec.Hostnames)
	}
	if len(route.Spec.Rules) != 1 || len(route.Spec.Rules[0].Matches) != 2 {
		t.Fatalf("HTTPRoute rules = %+v", route.Spec.Rules)
	}
	for _, b := range route.Spec.Rules[0].BackendRefs {
		if b.Name != public.Name || b.Port == nil || *b.Port != port.Port || *b.Port == internal.Spec.Ports[0].Port || (b.Kind != nil && *b.Kind != "Service") {
			t.Errorf("HTTPRoute backend %+v, want Service %s port %d", b, public.Name, port.Port)
		}
	}

	// Off by default; on with defaults, the HTTPRoute sends every path to the public port.
	ms = render(t, "--set", "httpRoute.enabled=true", "--set-json", `httpRoute.parentRefs=[{"name":"gw"}]`, "--set", "service.port=8443")
	route = get[*httpRoute](t, ms, "HTTPRoute", "")
	if b := route.Spec.Rules[0].BackendRefs; len(b) != 1 || b[0].Port == nil || *b[0].Port != 8443 {
		t.Errorf("backendRefs = %+v, want the public Service's port 8443", b)
	}
	if m := route.Spec.Rules[0].Matches; len(m) != 1 || m[0].Path == nil || m[0].Path.Type != "PathPrefix" || m[0].Path.Value != "/" {
		t.Errorf("default matches = %+v, want PathPrefix /", m)
	}
}

func TestHelmTestPodChecksReadyzThroughThePublicService(t *testing.T) {
	t.Parallel()
	ms := render(t)
	public := get[*corev1.Service](t, ms, "Service", release+"-space-api")
	pod := get[*corev1.Pod](t, ms, "Pod", "")
	if pod.Annotations["helm.sh/hook"] != "test" || !strings.Contains(pod.Annotations["helm.sh/hook-delete-policy"], "hook-succeeded") {
		t.Errorf("annotations = %v, want a helm test hook deleted when it passes", pod.Annotations)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || len(pod.Spec.Containers) != 1 {
		t.Fatalf("pod spec = %+v", pod.Spec)
	}
	c := pod.Spec.Containers[0]
	if c.Image != "busybox:1.37" || len(c.Command) == 0 || c.Command[0] != "wget" {
		t.Errorf("test container %s %v, want busybox wget", c.Image, c.Command)
	}
	u, err := url.Parse(c.Command[len(c.Command)-1])
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s.%s.svc:%d", public.Name, namespace, public.Spec.Ports[0].Port); u.Host != want || u.Path != "/readyz" {
		t.Errorf("the test asks %s, want http://%s/readyz", u, want)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("the test pod may run as root: %+v", sc)
	}
	// Not a replica: no selector of the release may pick the test pod.
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if pod.Labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	for _, svc := range ms.all("Service") {
		if selects(svc.obj.(*corev1.Service).Spec.Selector) {
			t.Errorf("Service %s selects the test pod: it would receive API traffic", svc.name)
		}
	}
	if selects(deployment(t, ms).Spec.Selector.MatchLabels) || selects(get[*policyv1.PodDisruptionBudget](t, ms, "PodDisruptionBudget", "").Spec.Selector.MatchLabels) {
		t.Errorf("the Deployment or the PDB selects the test pod")
	}

	full := render(t, "-f", fullValues)
	if p := get[*corev1.Pod](t, full, "Pod", ""); p.Spec.Containers[0].Image != "registry.example.com/mirror/busybox:1.37.0" || len(p.Spec.ImagePullSecrets) != 1 {
		t.Errorf("test pod image %s pull secrets %v, want the values'", p.Spec.Containers[0].Image, p.Spec.ImagePullSecrets)
	}
	if n := len(render(t, "--set", "tests.enabled=false").all("Pod")); n != 0 {
		t.Errorf("%d test pods with tests.enabled=false", n)
	}
}

func TestStartupProbeCanBeTurnedOffAndProbesFollowThePorts(t *testing.T) {
	t.Parallel()
	ms := render(t, "--set", "startupProbe.enabled=false", "--set", "ports.http=9000")
	api := container(t, deployment(t, ms), "space-api")
	if api.StartupProbe != nil {
		t.Errorf("startup probe rendered with startupProbe.enabled=false")
	}
	var http int32
	for _, p := range api.Ports {
		if p.Name == "http" {
			http = p.ContainerPort
		}
	}
	if http != 9000 || api.ReadinessProbe.HTTPGet.Port.String() != "http" || api.LivenessProbe.HTTPGet.Port.String() != "http" {
		t.Errorf("probes on %s/%s, http port %d: want the named public port 9000", api.ReadinessProbe.HTTPGet.Port.String(), api.LivenessProbe.HTTPGet.Port.String(), http)
	}
	full := container(t, deployment(t, render(t, "-f", fullValues)), "space-api")
	if p := full.StartupProbe; p == nil || p.PeriodSeconds != 5 || p.FailureThreshold != 60 {
		t.Errorf("startup probe = %+v, want the full values' 5s x 60", p)
	}
	if p := full.ReadinessProbe; p.PeriodSeconds != 3 || p.FailureThreshold != 2 {
		t.Errorf("readiness probe = %+v, want the full values'", p)
	}
}
