package kubernetes

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

type podClient = typedcorev1.PodInterface

// Labels select Pods (kubectl get pods -l space.dev/pool=true); their values are
// label-safe encodings (see labelValue). Annotations keep the exact values.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "space-api"
	// labelPool is "true" on a slot that no sandbox has adopted yet. Adopt removes it.
	labelPool      = "space.dev/pool"
	labelSlotID    = "space.dev/slot-id"
	labelSandboxID = "space.dev/sandbox-id"
	labelClient    = "space.dev/client"
	labelTemplate  = "space.dev/template"
	labelCPU       = "space.dev/cpu-millis"
	labelMemory    = "space.dev/memory-mib"
	labelDisk      = "space.dev/disk-gib"
	// labelSoftBreach is "true" on the Pod of a sandbox admitted over its client's soft
	// limit: what to degrade first (kubectl get pods -l space.dev/soft-breach=true).
	labelSoftBreach = "space.dev/soft-breach"

	annotationSandboxID = "space.dev/sandbox-id"
	annotationClient    = "space.dev/client"
	annotationShape     = "space.dev/shape"
	annotationSlotID    = "space.dev/slot-id"

	// defaultContainer names the container of a template without a pod spec.
	defaultContainer = "sandbox"
	// volumeName is the Pod volume of the sandbox's claim. A template's pod spec may
	// not use it.
	volumeName = "space-data"
)

// sandboxPod is the Pod of a cold-started or restored sandbox, on claim.
//
// A sandbox admitted over its client's soft limit (spec.SoftBreach) is labelled
// space.dev/soft-breach=true, and started with softBreachPriority as its
// PriorityClass when that is set, so that the scheduler preempts it first under
// pressure.
func sandboxPod(namespace string, spec substrate.Spec, claim, mountPath, softBreachPriority string) (*corev1.Pod, error) {
	pod, err := basePod(namespace, "sbx", spec.SandboxID, spec.Shape, spec.Template, claim, mountPath)
	if err != nil {
		return nil, err
	}
	relabelForSandbox(pod, spec)
	if spec.SoftBreach {
		pod.Labels[labelSoftBreach] = "true"
		if softBreachPriority != "" {
			// The class's value is the scheduler's to apply; a Pod naming a class
			// must not also carry the numeric priority of the template's.
			pod.Spec.PriorityClassName, pod.Spec.Priority = softBreachPriority, nil
		}
	}
	return pod, nil
}

// slotPod is the Pod of an ownerless warm slot, on claim.
func slotPod(namespace, slotID string, shape space.Shape, tmpl substrate.Template, claim, mountPath string) (*corev1.Pod, error) {
	pod, err := basePod(namespace, "slot", slotID, shape, tmpl, claim, mountPath)
	if err != nil {
		return nil, err
	}
	markSlot(&pod.ObjectMeta, slotID)
	return pod, nil
}

// markSlot labels an object (a Pod or its claim) as an ownerless pool slot.
func markSlot(m *metav1.ObjectMeta, slotID string) {
	m.Labels[labelPool] = "true"
	m.Labels[labelSlotID] = labelValue(slotID)
	m.Annotations[annotationSlotID] = slotID
}

// relabelForSandbox makes pod the sandbox of spec: no longer a pool member, owned by
// spec's client.
func relabelForSandbox(pod *corev1.Pod, spec substrate.Spec) {
	labelForSandbox(&pod.ObjectMeta, spec.SandboxID, string(spec.Client))
}

// basePod builds a Pod from the template's PodSpec (or one container of its image),
// sized by shape: the first container gets the shape's CPU and memory as requests and
// limits (equal, so a single-container sandbox is Guaranteed QoS and is not the first
// evicted) and its disk as ephemeral-storage (what it writes outside the volume), and
// mounts claim at mountPath.
func basePod(namespace, kind, id string, shape space.Shape, tmpl substrate.Template, claim, mountPath string) (*corev1.Pod, error) {
	ps, err := podSpec(tmpl)
	if err != nil {
		return nil, err
	}
	ps.Volumes = append(ps.Volumes, corev1.Volume{Name: volumeName, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}})
	c := &ps.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volumeName, MountPath: mountPath})
	if c.Resources.Requests == nil {
		c.Resources.Requests = corev1.ResourceList{}
	}
	if c.Resources.Limits == nil {
		c.Resources.Limits = corev1.ResourceList{}
	}
	for name, q := range shapeResources(shape) {
		c.Resources.Requests[name] = q
		c.Resources.Limits[name] = q
	}
	// Sandboxes run untrusted code: they get no API token unless the template asks.
	if ps.AutomountServiceAccountToken == nil {
		no := false
		ps.AutomountServiceAccountToken = &no
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        podName(kind, id),
			Namespace:   namespace,
			Labels:      shapeLabels(shape),
			Annotations: map[string]string{annotationShape: shape.String()},
		},
		Spec: *ps,
	}, nil
}

// podSpec decodes the template's PodSpec strictly (a misspelt field is an error, not
// silently dropped) and fills the template's image into its first container.
func podSpec(tmpl substrate.Template) (*corev1.PodSpec, error) {
	ps := &corev1.PodSpec{}
	if len(bytes.TrimSpace(tmpl.Pod)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(tmpl.Pod))
		dec.DisallowUnknownFields()
		if err := dec.Decode(ps); err != nil {
			return nil, fmt.Errorf("template %q: pod spec: %w", tmpl.Name, err)
		}
	}
	if len(ps.Containers) == 0 {
		ps.Containers = []corev1.Container{{Name: defaultContainer}}
	}
	for _, v := range ps.Volumes {
		if v.Name == volumeName {
			return nil, fmt.Errorf("template %q: pod spec: the volume name %q is the sandbox's own volume; name it otherwise", tmpl.Name, volumeName)
		}
	}
	c := &ps.Containers[0]
	if c.Name == "" {
		c.Name = defaultContainer
	}
	if tmpl.Image != "" {
		c.Image = tmpl.Image
	}
	if c.Image == "" {
		return nil, fmt.Errorf("template %q: no image: set image, or one in the pod spec's first container", tmpl.Name)
	}
	return ps, nil
}

func shapeResources(shape space.Shape) corev1.ResourceList {
	rl := corev1.ResourceList{}
	if shape.CPUMillis > 0 {
		rl[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(shape.CPUMillis), resource.DecimalSI)
	}
	if shape.MemoryMiB > 0 {
		rl[corev1.ResourceMemory] = *resource.NewQuantity(int64(shape.MemoryMiB)<<20, resource.BinarySI)
	}
	if shape.DiskGiB > 0 {
		rl[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(shape.DiskGiB)<<30, resource.BinarySI)
	}
	return rl
}

func shapeLabels(shape space.Shape) map[string]string {
	return map[string]string{
		labelManagedBy: managedBy,
		labelTemplate:  labelValue(shape.Template),
		labelCPU:       strconv.Itoa(shape.CPUMillis),
		labelMemory:    strconv.Itoa(shape.MemoryMiB),
		labelDisk:      strconv.Itoa(shape.DiskGiB),
	}
}

// matchShape refuses a slot of another shape: slots serve only requests of exactly
// their shape.
func matchShape(pod *corev1.Pod, shape space.Shape) error {
	for k, v := range shapeLabels(shape) {
		if pod.Labels[k] != v {
			return fmt.Errorf("slot pod has %s=%q, sandbox wants %q", k, pod.Labels[k], v)
		}
	}
	return nil
}

// CheckTemplates builds a Pod from every template, so that a template whose pod spec
// does not decode or has no image is reported when the service starts rather than at
// its first sandbox. The lead calls it after substrate.LoadTemplates.
func CheckTemplates(ts substrate.Templates) error {
	var errs []error
	for _, name := range ts.Names() {
		t := ts[name]
		t.Name = name
		if _, err := podSpec(t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podFinished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

// validLabelValue is the syntax of a Kubernetes label value (at most 63 characters).
var validLabelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)

// labelValue encodes s as a label value: unchanged when it already is one, otherwise
// its label-safe characters (at most 54) and 8 hex digits of its SHA-256, so that two
// different values never share a label. The exact value is kept in an annotation.
func labelValue(s string) string {
	if len(s) <= 63 && validLabelValue.MatchString(s) {
		return s
	}
	safe := strings.Map(func(r rune) rune {
		if r < 128 && (r == '-' || r == '_' || r == '.' || isAlnum(byte(r))) {
			return r
		}
		return '-'
	}, s)
	if len(safe) > 54 {
		safe = safe[:54]
	}
	safe = strings.Trim(safe, "-_.")
	sum := sha256.Sum256([]byte(s))
	h := hex.EncodeToString(sum[:4])
	if safe == "" {
		return h
	}
	return safe + "-" + h
}

// podName is kind-<base>-<5 random> (nameBase).
func podName(kind, id string) string { return kind + "-" + nameBase(id) + "-" + randomSuffix() }

// podClaim is the claim of pod's sandbox volume, or "" for a Pod without one.
func podClaim(pod *corev1.Pod) string {
	for _, v := range pod.Spec.Volumes {
		if v.Name == volumeName && v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// nameBase is id made part of a DNS label, at most 50 characters: lowercased, other
// characters replaced by '-', and, when that lost anything, 8 hex digits of the id's
// SHA-256 so that distinct ids stay distinct. A Pod is named kind-<base>-<5 random>
// (readable in kubectl, a DNS label so the hostname is the whole name, and never the
// name of a predecessor still terminating: a restore right after a pause); a claim is
// data-<kind>-<base>, the same on every attempt, so that a second attempt finds the
// first one's.
func nameBase(id string) string {
	var b strings.Builder
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if !isAlnum(c) {
			c = '-'
		}
		b.WriteByte(c)
	}
	base := strings.Trim(b.String(), "-")
	if base != id { // lossy: keep distinct ids distinct
		sum := sha256.Sum256([]byte(id))
		base = strings.Trim(truncate(base, 36), "-") + "-" + hex.EncodeToString(sum[:4])
	}
	return strings.Trim(truncate(base, 50), "-")
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// randomSuffix is 5 characters from the alphabet Kubernetes uses for generated names
// (no vowels, so no words). The name must be known before the Pod is created: the
// watch and the cleanup of a failed create name it.
func randomSuffix() string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	var b [5]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}
