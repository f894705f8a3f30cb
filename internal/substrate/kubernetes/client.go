package kubernetes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Cluster says which API server the substrate talks to, in which namespace, and how
// hard it may ask. internal/app fills it from config.Kubernetes, where the
// SPACE_KUBERNETES_* variables and KUBECONFIG are declared with their defaults.
type Cluster struct {
	// Kubeconfig is one or more kubeconfig files (a path list). Empty: the in-cluster
	// service account, else ~/.kube/config.
	Kubeconfig string
	// Namespace holds the sandbox Pods. Empty: the namespace of the service account,
	// else the kubeconfig context's namespace.
	Namespace string
	// QPS and Burst are the client's rate limit towards the API server (required;
	// SPACE_KUBERNETES_CLIENT_QPS and _BURST, 50 and 100 by default).
	QPS   float32
	Burst int
}

// ErrNoNamespace is returned by Cluster.Options when no namespace is set and neither
// the service account nor the kubeconfig context names one.
var ErrNoNamespace = errors.New("kubernetes substrate: no namespace for sandbox Pods: none is set, and neither the service account nor the kubeconfig context names one")

// serviceAccountNamespace is where Kubernetes mounts the Pod's own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// RESTConfig returns the API server's client configuration and the default namespace
// of that configuration: from the kubeconfig files of c.Kubeconfig when set, otherwise
// from the in-cluster service account, otherwise from ~/.kube/config.
func (c Cluster) RESTConfig() (*rest.Config, string, error) {
	switch {
	case c.QPS <= 0:
		return nil, "", fmt.Errorf("kubernetes client: QPS must be > 0, got %v", c.QPS)
	case c.Burst < 1:
		return nil, "", fmt.Errorf("kubernetes client: Burst must be >= 1, got %d", c.Burst)
	}
	var cfg *rest.Config
	namespace := ""
	if c.Kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		switch {
		case err == nil:
			cfg = rc
			if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
				namespace = strings.TrimSpace(string(b))
			}
		case !errors.Is(err, rest.ErrNotInCluster):
			return nil, "", fmt.Errorf("in-cluster kubernetes config: %w", err)
		}
	}
	if cfg == nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if c.Kubeconfig != "" {
			rules.Precedence = filepath.SplitList(c.Kubeconfig)
		}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
		rc, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("kubernetes config: not in a cluster, and no usable kubeconfig (KUBECONFIG=%q): %w", c.Kubeconfig, err)
		}
		cfg = rc
		if ns, _, err := cc.Namespace(); err == nil {
			namespace = ns
		}
	}
	cfg.QPS = c.QPS
	cfg.Burst = c.Burst
	cfg.UserAgent = "space-api"
	return cfg, namespace, nil
}

// Options builds the clients for c and returns the Options New needs with its
// Clientset, Dynamic and Namespace set; the caller adds the rest. The error wraps
// ErrNoNamespace when no namespace is found.
func (c Cluster) Options() (Options, error) {
	cfg, namespace, err := c.RESTConfig()
	if err != nil {
		return Options{}, err
	}
	if c.Namespace != "" {
		namespace = c.Namespace
	}
	if namespace == "" {
		return Options{}, ErrNoNamespace
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		return Options{}, fmt.Errorf("kubernetes client: %w", err)
	}
	// VolumeSnapshots have no typed client here; the dynamic one reads and writes them.
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Options{}, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return Options{Clientset: cs, Dynamic: dyn, Namespace: namespace}, nil
}

// Connect is what internal/app calls for SPACE_SUBSTRATE=kubernetes: the clients for
// c, then New with the rest of opts.
func Connect(c Cluster, opts Options) (*Substrate, error) {
	o, err := c.Options()
	if err != nil {
		return nil, err
	}
	opts.Clientset, opts.Dynamic, opts.Namespace = o.Clientset, o.Dynamic, o.Namespace
	return New(opts)
}
