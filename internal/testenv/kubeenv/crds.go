package kubeenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// CRDSource is a set of CRD manifests as their project publishes them, inside its Go
// module: the module is downloaded through the module proxy into the module cache
// (go mod download), and the files are read from there. No CRD is copied into this
// repository.
type CRDSource struct {
	Module, Version string
	// Files are paths inside the module.
	Files []string
}

// The CRDs the tests install. Their versions are pinned here.
var (
	// SnapshotCRDs are CSI snapshots' (snapshot.storage.k8s.io/v1), from the
	// external-snapshotter's client module. Start installs them: the kubernetes
	// substrate pauses onto VolumeSnapshots when a class is configured.
	SnapshotCRDs = CRDSource{Module: "github.com/kubernetes-csi/external-snapshotter/client/v8", Version: "v8.7.0", Files: []string{
		"config/crd/snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
		"config/crd/snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
		"config/crd/snapshot.storage.k8s.io_volumesnapshots.yaml",
	}}
	// MonitoringCRDs are prometheus-operator's ServiceMonitor and PrometheusRule
	// (monitoring.coreos.com/v1), from its root module, which carries them under
	// example/.
	MonitoringCRDs = CRDSource{Module: "github.com/prometheus-operator/prometheus-operator", Version: "v0.85.0", Files: []string{
		"example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
		"example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
	}}
	// GatewayCRDs are the Gateway API's HTTPRoute (gateway.networking.k8s.io/v1), of
	// its standard channel.
	GatewayCRDs = CRDSource{Module: "sigs.k8s.io/gateway-api", Version: "v1.6.3", Files: []string{
		"config/crd/standard/gateway.networking.k8s.io_httproutes.yaml",
	}}
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

type crdOnce struct {
	once sync.Once
	err  error
}

// installCRDs creates the CRDs of src, once per process, and waits until the API
// server serves them.
func (s *Server) installCRDs(ctx context.Context, src CRDSource) error {
	v, _ := s.crds.LoadOrStore(src.Module+"@"+src.Version, &crdOnce{})
	o := v.(*crdOnce)
	o.once.Do(func() { o.err = s.installCRDsNow(ctx, src) })
	return o.err
}

func (s *Server) installCRDsNow(ctx context.Context, src CRDSource) error {
	dir, err := moduleDir(ctx, src.Module, src.Version)
	if err != nil {
		return err
	}
	var names []string
	for _, f := range src.Files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("CRD manifest of %s@%s: %w", src.Module, src.Version, err)
		}
		for _, chunk := range yamlSeparator.Split(string(b), -1) {
			j, err := yaml.YAMLToJSON([]byte(chunk))
			if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(bytes.TrimSpace(j)) == 0 || string(j) == "null" {
				continue
			}
			obj := &unstructured.Unstructured{}
			if err := json.Unmarshal(j, &obj.Object); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if obj.GetKind() != "CustomResourceDefinition" {
				continue
			}
			unstructured.RemoveNestedField(obj.Object, "status")
			if _, err := s.Dynamic.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
			}
			names = append(names, obj.GetName())
		}
	}
	for _, name := range names {
		if err := waitEstablished(ctx, s, name); err != nil {
			return err
		}
	}
	return nil
}

var yamlSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// waitEstablished waits for the CRD's Established condition, after which its
// resources are served.
func waitEstablished(ctx context.Context, s *Server, name string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		crd, err := s.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established within a minute (last error: %v)", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// moduleDir downloads module@version into the module cache (a no-op when it is there)
// and returns its directory.
func moduleDir(ctx context.Context, module, version string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	// Outside any module: the download must not depend on, or touch, a go.mod.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w\n%s%s", module, version, err, out.String(), errOut.String())
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out.Bytes(), &info); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", module, version, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", module, version, info.Error)
	}
	return info.Dir, nil
}
