package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

// A sandbox's filesystem is a PersistentVolumeClaim of its own, named
// data-<sbx|slot>-<id> (the same name on every attempt, so that a second attempt finds
// the first one's), labelled and annotated like its Pod. A pause keeps it, and may
// snapshot it: a snapshot.storage.k8s.io/v1 VolumeSnapshot, written through the
// dynamic client as an unstructured object (the external-snapshotter's typed client
// would be one more module for five fields).
//
// Stop takes references of three kinds: a Pod's name, pvc/<claim> and
// volumesnapshot/<snapshot>. Pod names never hold a '/'.
const (
	claimRefPrefix    = "pvc/"
	snapshotRefPrefix = "volumesnapshot/"
	// minClaimGiB is the size of a claim whose shape asks for no disk: a claim must
	// request something.
	minClaimGiB = 1
)

// volumeSnapshotGVR is the resource of CSI volume snapshots.
var volumeSnapshotGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

func (s *Substrate) claims() typedcorev1.PersistentVolumeClaimInterface {
	return s.client.CoreV1().PersistentVolumeClaims(s.namespace)
}

func (s *Substrate) snapshots() dynamic.ResourceInterface {
	return s.dynamic.Resource(volumeSnapshotGVR).Namespace(s.namespace)
}

// sandboxClaim is the claim of a new sandbox.
func sandboxClaim(namespace string, spec substrate.Spec, class string) *corev1.PersistentVolumeClaim {
	c := baseClaim(namespace, "sbx", spec.SandboxID, spec.Shape, class)
	labelForSandbox(&c.ObjectMeta, spec.SandboxID, string(spec.Client))
	return c
}

// slotClaim is the claim of an ownerless warm slot.
func slotClaim(namespace, slotID string, shape space.Shape, class string) *corev1.PersistentVolumeClaim {
	c := baseClaim(namespace, "slot", slotID, shape, class)
	markSlot(&c.ObjectMeta, slotID)
	return c
}

// baseClaim is a ReadWriteOnce claim of the shape's disk (at least minClaimGiB).
func baseClaim(namespace, kind, id string, shape space.Shape, class string) *corev1.PersistentVolumeClaim {
	gib := max(shape.DiskGiB, minClaimGiB)
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "data-" + kind + "-" + nameBase(id),
			Namespace:   namespace,
			Labels:      shapeLabels(shape),
			Annotations: map[string]string{annotationShape: shape.String()},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(int64(gib)<<30, resource.BinarySI),
			}},
		},
	}
	if class != "" {
		c.Spec.StorageClassName = &class
	}
	return c
}

// labelForSandbox makes the object (a Pod, a claim, a snapshot) the sandbox's: no
// longer a pool member, owned by client.
func labelForSandbox(m *metav1.ObjectMeta, sandboxID, client string) {
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	delete(m.Labels, labelPool)
	m.Labels[labelSandboxID] = labelValue(sandboxID)
	m.Labels[labelClient] = labelValue(client)
	m.Annotations[annotationSandboxID] = sandboxID
	m.Annotations[annotationClient] = client
}

// ensureClaim creates c, or returns the claim of that name when an earlier attempt for
// the same sandbox or slot made it (the API server answers AlreadyExists, 409).
func (s *Substrate) ensureClaim(ctx context.Context, c *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	for range 2 {
		created, err := s.claims().Create(ctx, c, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create claim %s: %w", c.Name, err)
		}
		existing, err := s.claims().Get(ctx, c.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue // deleted between the two calls: create it again
		case err != nil:
			return nil, fmt.Errorf("get claim %s: %w", c.Name, err)
		case existing.Annotations[annotationSandboxID] != c.Annotations[annotationSandboxID] ||
			existing.Annotations[annotationSlotID] != c.Annotations[annotationSlotID]:
			return nil, fmt.Errorf("claim %s exists and is another sandbox's or slot's (sandbox %q, slot %q)",
				c.Name, existing.Annotations[annotationSandboxID], existing.Annotations[annotationSlotID])
		case existing.DeletionTimestamp != nil:
			return nil, fmt.Errorf("claim %s of an earlier attempt is being deleted; try again once it is gone", c.Name)
		}
		s.log.InfoContext(ctx, "reusing the claim of an earlier attempt", "claim", c.Name)
		return existing, nil
	}
	return nil, fmt.Errorf("create claim %s: it kept being deleted", c.Name)
}

// ownClaim labels claim as the sandbox of pod (an adopted slot's claim, or one an
// earlier adoption did not get to). A merge patch: it needs no resourceVersion, and
// two replicas writing the same labels agree.
func (s *Substrate) ownClaim(ctx context.Context, claim string, pod *corev1.Pod) error {
	if claim == "" {
		return nil
	}
	sandboxID, client := pod.Annotations[annotationSandboxID], pod.Annotations[annotationClient]
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null,%q:%q,%q:%q},"annotations":{%q:%q,%q:%q}}}`,
		labelPool, labelSandboxID, labelValue(sandboxID), labelClient, labelValue(client),
		annotationSandboxID, sandboxID, annotationClient, client)
	if _, err := s.claims().Patch(ctx, claim, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s of pod %s is gone: %w", claim, pod.Name, substrate.ErrNotFound)
		}
		return fmt.Errorf("relabel claim %s: %w", claim, err)
	}
	return nil
}

func (s *Substrate) deleteClaim(ctx context.Context, name string) error {
	policy := metav1.DeletePropagationBackground
	err := s.claims().Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete claim %s: %w", name, err)
	}
	return nil
}

// sandboxClaims returns the claims of sandbox id: labelled with it, or named in
// mounted (the claims its Pods mount, which may not be relabelled yet). Newest first.
func (s *Substrate) sandboxClaims(ctx context.Context, sandboxID string, mounted map[string]bool) ([]corev1.PersistentVolumeClaim, error) {
	list, err := s.claims().List(ctx, metav1.ListOptions{LabelSelector: labelSandboxID + "=" + labelValue(sandboxID)})
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	var out []corev1.PersistentVolumeClaim
	seen := map[string]bool{}
	for _, c := range list.Items {
		if c.Annotations[annotationSandboxID] == sandboxID {
			out = append(out, c)
			seen[c.Name] = true
		}
	}
	for name := range mounted {
		if seen[name] {
			continue
		}
		c, err := s.claims().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get claim %s: %w", name, err)
		}
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[j].CreationTimestamp.Before(&out[i].CreationTimestamp) })
	return out, nil
}

// claimResource describes a claim as a substrate.Resource; sandboxID stands in for
// the claim's own annotation when it has none yet.
func claimResource(c *corev1.PersistentVolumeClaim, sandboxID string) substrate.Resource {
	if id := c.Annotations[annotationSandboxID]; id != "" {
		sandboxID = id
	}
	return substrate.Resource{
		Ref:       claimRefPrefix + c.Name,
		SandboxID: sandboxID,
		SlotID:    c.Annotations[annotationSlotID],
		Ready:     c.DeletionTimestamp == nil,
		Created:   c.CreationTimestamp.Time,
		Storage:   true,
	}
}

// restoreClaim returns the claim a restore of spec starts on: the sandbox's live claim;
// else a new one made from snapshotRef's VolumeSnapshot (or the sandbox's newest ready
// one). substrate.ErrNotFound when there is neither.
func (s *Substrate) restoreClaim(ctx context.Context, spec substrate.Spec, snapshotRef string) (string, error) {
	claims, err := s.sandboxClaims(ctx, spec.SandboxID, nil)
	if err != nil {
		return "", err
	}
	for _, c := range claims {
		if c.DeletionTimestamp == nil {
			return c.Name, nil
		}
	}
	snap, err := s.restoreSnapshot(ctx, spec.SandboxID, snapshotRef)
	if err != nil {
		return "", err
	}
	c := sandboxClaim(s.namespace, spec, s.storageClass)
	if q := c.Spec.Resources.Requests[corev1.ResourceStorage]; snap.restoreSize.Cmp(q) > 0 {
		c.Spec.Resources.Requests[corev1.ResourceStorage] = snap.restoreSize
	}
	group := volumeSnapshotGVR.Group
	c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: snap.name}
	made, err := s.ensureClaim(ctx, c)
	if err != nil {
		return "", err
	}
	s.log.InfoContext(ctx, "restoring a sandbox from its volume snapshot: its claim is gone", "sandbox", spec.SandboxID, "snapshot", snap.name, "claim", made.Name)
	return made.Name, nil
}

// restoreSnapshot is the snapshot a claim is remade from: the one snapshotRef names,
// when it is ready, else the sandbox's newest ready one.
func (s *Substrate) restoreSnapshot(ctx context.Context, sandboxID, snapshotRef string) (volumeSnapshot, error) {
	gone := fmt.Errorf("sandbox %s has neither its volume claim nor a ready volume snapshot of it: %w", sandboxID, substrate.ErrNotFound)
	if s.dynamic == nil {
		if strings.HasPrefix(snapshotRef, snapshotRefPrefix) {
			return volumeSnapshot{}, fmt.Errorf("%w (it was paused onto %s, but no volume snapshot class is configured now to read it)", gone, snapshotRef)
		}
		return volumeSnapshot{}, gone
	}
	snaps, err := s.sandboxSnapshots(ctx, sandboxID)
	if err != nil {
		return volumeSnapshot{}, err
	}
	for _, sn := range snaps {
		if snapshotRefPrefix+sn.name == snapshotRef && sn.ready && !sn.deleting {
			return sn, nil
		}
	}
	if sn, ok := newestReady(snaps); ok {
		return sn, nil
	}
	return volumeSnapshot{}, gone
}

// volumeSnapshot is what the substrate reads of a VolumeSnapshot.
type volumeSnapshot struct {
	name, sandboxID, slotID string
	created                 time.Time
	ready, deleting         bool
	errMessage              string
	restoreSize             resource.Quantity
}

func snapshotOf(u *unstructured.Unstructured) volumeSnapshot {
	sn := volumeSnapshot{
		name:      u.GetName(),
		sandboxID: u.GetAnnotations()[annotationSandboxID],
		slotID:    u.GetAnnotations()[annotationSlotID],
		created:   u.GetCreationTimestamp().Time,
		deleting:  u.GetDeletionTimestamp() != nil,
	}
	sn.ready, _, _ = unstructured.NestedBool(u.Object, "status", "readyToUse")
	sn.errMessage, _, _ = unstructured.NestedString(u.Object, "status", "error", "message")
	if size, ok, _ := unstructured.NestedString(u.Object, "status", "restoreSize"); ok {
		if q, err := resource.ParseQuantity(size); err == nil {
			sn.restoreSize = q
		}
	}
	return sn
}

func (sn volumeSnapshot) resource() substrate.Resource {
	return substrate.Resource{Ref: snapshotRefPrefix + sn.name, SandboxID: sn.sandboxID, SlotID: sn.slotID,
		Ready: sn.ready && !sn.deleting, Created: sn.created, Storage: true}
}

// newestReady is the newest snapshot that a claim can be made from.
func newestReady(snaps []volumeSnapshot) (volumeSnapshot, bool) {
	var best volumeSnapshot
	found := false
	for _, sn := range snaps {
		if sn.ready && !sn.deleting && (!found || sn.created.After(best.created)) {
			best, found = sn, true
		}
	}
	return best, found
}

// listSnapshots lists the VolumeSnapshots of the namespace; none when no snapshot class
// is configured (the substrate then never touches snapshot.storage.k8s.io, whose CRD
// the cluster may not have).
func (s *Substrate) listSnapshots(ctx context.Context, opts metav1.ListOptions) ([]volumeSnapshot, error) {
	if s.snapshotClass == "" {
		return nil, nil
	}
	list, err := s.snapshots().List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("list volumesnapshots: %w", err)
	}
	out := make([]volumeSnapshot, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, snapshotOf(&list.Items[i]))
	}
	return out, nil
}

func (s *Substrate) sandboxSnapshots(ctx context.Context, sandboxID string) ([]volumeSnapshot, error) {
	all, err := s.listSnapshots(ctx, metav1.ListOptions{LabelSelector: labelSandboxID + "=" + labelValue(sandboxID)})
	if err != nil {
		return nil, err
	}
	var out []volumeSnapshot
	for _, sn := range all {
		if sn.sandboxID == sandboxID {
			out = append(out, sn)
		}
	}
	return out, nil
}

// takeSnapshot snapshots claim, the volume of the paused sandbox's pod, waits for it to
// be ready to use, and then deletes the sandbox's older snapshots: one snapshot per
// sandbox is kept, the newest. A snapshot that fails or is not ready in time is
// deleted.
func (s *Substrate) takeSnapshot(ctx context.Context, pod *corev1.Pod, claim string) (string, error) {
	sandboxID := pod.Annotations[annotationSandboxID]
	meta := metav1.ObjectMeta{Labels: map[string]string{}, Annotations: map[string]string{annotationShape: pod.Annotations[annotationShape]}}
	for _, k := range []string{labelManagedBy, labelTemplate, labelCPU, labelMemory, labelDisk} {
		meta.Labels[k] = pod.Labels[k]
	}
	labelForSandbox(&meta, sandboxID, pod.Annotations[annotationClient])
	labels, annotations := map[string]any{}, map[string]any{}
	for k, v := range meta.Labels {
		labels[k] = v
	}
	for k, v := range meta.Annotations {
		annotations[k] = v
	}
	name := "snap-" + nameBase(sandboxID) + "-" + randomSuffix()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1",
		"kind":       "VolumeSnapshot",
		"metadata":   map[string]any{"name": name, "namespace": s.namespace, "labels": labels, "annotations": annotations},
		"spec": map[string]any{
			"volumeSnapshotClassName": s.snapshotClass,
			"source":                  map[string]any{"persistentVolumeClaimName": claim},
		},
	}}
	created, err := s.snapshots().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create volume snapshot of claim %s: %w", claim, err)
	}
	err = s.until(ctx, s.snapshotWatcher(), name, created, func(o runtime.Object, _ watch.EventType) (bool, error) {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || u == nil {
			return true, fmt.Errorf("volume snapshot %s was deleted before it was ready", name)
		}
		sn := snapshotOf(u)
		switch {
		case sn.ready:
			return true, nil
		case sn.errMessage != "":
			return true, fmt.Errorf("volume snapshot %s failed: %s", name, sn.errMessage)
		}
		return false, nil
	})
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := s.deleteSnapshot(dctx, name); derr != nil {
			err = errors.Join(err, derr)
		}
		return "", err
	}
	older, err := s.sandboxSnapshots(ctx, sandboxID)
	if err != nil {
		s.log.WarnContext(ctx, "list a paused sandbox's older snapshots; they stay until its deletion", "sandbox", sandboxID, "err", err)
		return name, nil
	}
	for _, sn := range older {
		if sn.name != name && !sn.deleting {
			if err := s.deleteSnapshot(ctx, sn.name); err != nil {
				s.log.WarnContext(ctx, "delete an older snapshot of a paused sandbox; it stays until its deletion", "snapshot", sn.name, "err", err)
			}
		}
	}
	return name, nil
}

func (s *Substrate) deleteSnapshot(ctx context.Context, name string) error {
	if s.dynamic == nil {
		return fmt.Errorf("delete volume snapshot %s: no volume snapshot class is configured, so the substrate has no snapshot client", name)
	}
	err := s.snapshots().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete volume snapshot %s: %w", name, err)
	}
	return nil
}
