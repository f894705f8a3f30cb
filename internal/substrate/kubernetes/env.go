package kubernetes

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/space-sandbox/space/internal/config"
)

// Env is the substrate's own configuration. It is read by ReadEnv from variables that
// only matter with SPACE_SUBSTRATE=kubernetes, so they live here rather than in
// internal/config.
type Env struct {
	// Namespace holds the sandbox Pods (SPACE_KUBERNETES_NAMESPACE). Unset: the
	// namespace space-api itself runs in, else the kubeconfig context's namespace.
	Namespace string
	// ReadyTimeout bounds the wait for a Pod to become Ready
	// (SPACE_KUBERNETES_READY_TIMEOUT, default 2m).
	ReadyTimeout time.Duration
	// QPS and Burst are the client's rate limit towards the API server
	// (SPACE_KUBERNETES_CLIENT_QPS, default 50, and SPACE_KUBERNETES_CLIENT_BURST,
	// default 100). client-go's own default, 5 and 10, would queue a burst of cold starts
	// in the client rather than in the admission buckets, where they belong.
	QPS   float32
	Burst int
	// Kubeconfig is KUBECONFIG: one or more kubeconfig files (a path list). Unset: the
	// in-cluster service account, else ~/.kube/config.
	Kubeconfig string
	// StorageClass is the StorageClass of every sandbox's volume claim
	// (SPACE_KUBERNETES_STORAGE_CLASS). Unset: the claim names none, and the cluster's
	// default StorageClass provisions it.
	StorageClass string
	// SnapshotClass is the CSI VolumeSnapshotClass a pause snapshots the claim with
	// (SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS). Unset: a pause keeps the claim only,
	// and the substrate never touches snapshot.storage.k8s.io.
	SnapshotClass string
	// MountPath is where the claim is mounted in the sandbox's first container
	// (SPACE_KUBERNETES_VOLUME_MOUNT_PATH, default DefaultMountPath).
	MountPath string
}

// Defaults of the SPACE_KUBERNETES_* variables.
const (
	DefaultClientQPS   = 50
	DefaultClientBurst = 100
	// DefaultMountPath is where a sandbox's volume is mounted: what a pause keeps is
	// what the sandbox wrote under it.
	DefaultMountPath = "/workspace"
)

// dnsLabel is the syntax of a namespace name (RFC 1123 label).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// serviceAccountNamespace is where Kubernetes mounts the Pod's own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// ReadEnv reads and validates the SPACE_KUBERNETES_* variables and KUBECONFIG through
// getenv. Errors are *config.VarError, worded like every other configuration error.
func ReadEnv(getenv func(string) string) (Env, error) {
	e := Env{ReadyTimeout: DefaultReadyTimeout, QPS: DefaultClientQPS, Burst: DefaultClientBurst, MountPath: DefaultMountPath}
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }

	e.Namespace = get("SPACE_KUBERNETES_NAMESPACE")
	if e.Namespace != "" && (len(e.Namespace) > 63 || !dnsLabel.MatchString(e.Namespace)) {
		return Env{}, &config.VarError{Var: "SPACE_KUBERNETES_NAMESPACE", Value: e.Namespace, Accepts: "a namespace name (lowercase letters, digits and '-')"}
	}
	if v := get("SPACE_KUBERNETES_READY_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return Env{}, &config.VarError{Var: "SPACE_KUBERNETES_READY_TIMEOUT", Value: v, Accepts: "a positive Go duration such as 90s or 2m"}
		}
		e.ReadyTimeout = d
	}
	if v := get("SPACE_KUBERNETES_CLIENT_QPS"); v != "" {
		f, err := strconv.ParseFloat(v, 32)
		if err != nil || f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return Env{}, &config.VarError{Var: "SPACE_KUBERNETES_CLIENT_QPS", Value: v, Accepts: "a number of requests per second > 0, such as 50"}
		}
		e.QPS = float32(f)
	}
	if v := get("SPACE_KUBERNETES_CLIENT_BURST"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return Env{}, &config.VarError{Var: "SPACE_KUBERNETES_CLIENT_BURST", Value: v, Accepts: "an integer >= 1"}
		}
		e.Burst = n
	}
	e.StorageClass = get("SPACE_KUBERNETES_STORAGE_CLASS")
	if e.StorageClass != "" && !dnsSubdomain(e.StorageClass) {
		return Env{}, &config.VarError{Var: "SPACE_KUBERNETES_STORAGE_CLASS", Value: e.StorageClass, Accepts: "a StorageClass name (lowercase letters, digits, '-' and '.')"}
	}
	e.SnapshotClass = get("SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS")
	if e.SnapshotClass != "" && !dnsSubdomain(e.SnapshotClass) {
		return Env{}, &config.VarError{Var: "SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS", Value: e.SnapshotClass, Accepts: "a VolumeSnapshotClass name (lowercase letters, digits, '-' and '.')"}
	}
	if v := get("SPACE_KUBERNETES_VOLUME_MOUNT_PATH"); v != "" {
		if !path.IsAbs(v) || path.Clean(v) != v || v == "/" || strings.Contains(v, ":") {
			return Env{}, &config.VarError{Var: "SPACE_KUBERNETES_VOLUME_MOUNT_PATH", Value: v, Accepts: "an absolute directory path other than /, such as /workspace"}
		}
		e.MountPath = v
	}
	e.Kubeconfig = get("KUBECONFIG")
	return e, nil
}

// dnsSubdomain is the syntax of most object names (RFC 1123 subdomain).
func dnsSubdomain(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if len(part) > 63 || !dnsLabel.MatchString(part) {
			return false
		}
	}
	return true
}

// RESTConfig returns the API server's client configuration and the default namespace
// of that configuration: from the kubeconfig files of e.Kubeconfig when set, otherwise
// from the in-cluster service account, otherwise from ~/.kube/config.
func (e Env) RESTConfig() (*rest.Config, string, error) {
	var cfg *rest.Config
	namespace := ""
	if e.Kubeconfig == "" {
		c, err := rest.InClusterConfig()
		switch {
		case err == nil:
			cfg = c
			if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
				namespace = strings.TrimSpace(string(b))
			}
		case !errors.Is(err, rest.ErrNotInCluster):
			return nil, "", fmt.Errorf("in-cluster kubernetes config: %w", err)
		}
	}
	if cfg == nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if e.Kubeconfig != "" {
			rules.Precedence = filepath.SplitList(e.Kubeconfig)
		}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
		c, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("kubernetes config: not in a cluster, and no usable kubeconfig (KUBECONFIG=%q): %w", e.Kubeconfig, err)
		}
		cfg = c
		if ns, _, err := cc.Namespace(); err == nil {
			namespace = ns
		}
	}
	cfg.QPS = e.QPS
	cfg.Burst = e.Burst
	cfg.UserAgent = "space-api"
	return cfg, namespace, nil
}

// Options builds a clientset from e and returns the Options New needs; the caller adds
// a Snapshotter and a Logger.
func (e Env) Options() (Options, error) {
	cfg, namespace, err := e.RESTConfig()
	if err != nil {
		return Options{}, err
	}
	if e.Namespace != "" {
		namespace = e.Namespace
	}
	if namespace == "" {
		return Options{}, &config.VarError{Var: "SPACE_KUBERNETES_NAMESPACE", Accepts: "the namespace that holds sandbox Pods"}
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		return Options{}, fmt.Errorf("kubernetes client: %w", err)
	}
	opts := Options{Clientset: cs, Namespace: namespace, ReadyTimeout: e.ReadyTimeout,
		StorageClass: e.StorageClass, SnapshotClass: e.SnapshotClass, MountPath: e.MountPath}
	if e.SnapshotClass != "" {
		if opts.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
			return Options{}, fmt.Errorf("kubernetes dynamic client: %w", err)
		}
	}
	return opts, nil
}

// NewFromEnv is what cmd/space-api calls for SPACE_SUBSTRATE=kubernetes: ReadEnv, a
// clientset from the in-cluster service account or KUBECONFIG, then New.
func NewFromEnv(getenv func(string) string, logger *slog.Logger) (*Substrate, error) {
	e, err := ReadEnv(getenv)
	if err != nil {
		return nil, err
	}
	opts, err := e.Options()
	if err != nil {
		return nil, err
	}
	opts.Logger = logger
	return New(opts)
}
