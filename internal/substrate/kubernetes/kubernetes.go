// Package kubernetes runs sandboxes and warm pool slots as Pods (SPACE_SUBSTRATE=kubernetes).
//
// A sandbox is one Pod built from its template's PodSpec, sized by its shape and
// labelled with its sandbox id, its owner's client key and its shape, and a
// PersistentVolumeClaim of its own, sized by the shape's disk and mounted at
// Options.MountPath: its filesystem, which a pause keeps. A warm slot is the same Pod
// and claim without an owner, labelled as pool members; adopting it relabels the Pod
// with an Update carrying the resourceVersion that was read, so of two replicas racing
// for one slot exactly one wins and the other gets substrate.ErrSlotTaken, and then
// relabels the claim.
//
// Every call blocks until the Pod is Ready, watching it (no polling), within
// Options.ReadyTimeout. A Pod that does not become Ready in time, or that fails, is
// deleted before the call returns its error: the caller never has to clean up a Pod it
// was not told about.
//
// Pause (Snapshot) deletes the Pod and keeps the claim; with a VolumeSnapshotClass
// configured it also takes a CSI VolumeSnapshot of the claim once the Pod is gone.
// Restore starts a Pod on the kept claim, or, when the claim is gone, on a new claim
// made from the newest snapshot. What survives a pause is what the sandbox wrote under
// the mount path; memory, processes and the rest of the container's filesystem do not.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

// Name is the SPACE_SUBSTRATE value of this substrate.
const Name = "kubernetes"

// cleanupTimeout bounds the deletion of a Pod that failed to start. It runs on a
// context detached from the caller's, because the caller's may be the one that expired.
const cleanupTimeout = 10 * time.Second

// Options configure New.
type Options struct {
	// Clientset talks to the API server (required).
	Clientset k8s.Interface
	// Dynamic reads and writes VolumeSnapshots, which have no typed client here;
	// required with SnapshotClass.
	Dynamic dynamic.Interface
	// Namespace holds every sandbox and slot Pod and claim (required). Giving
	// sandboxes a namespace of their own keeps the RBAC the substrate needs, and the
	// blast radius of untrusted code, confined to it.
	Namespace string
	// ReadyTimeout bounds the wait for a Pod to become Ready, and a pause's wait for
	// its Pod to go and its snapshot to be ready (required;
	// SPACE_KUBERNETES_READY_TIMEOUT, 2m by default): long enough for a cold image pull
	// on a fresh node, short enough that a sandbox stuck Pending (no capacity, bad
	// image) fails instead of holding its client's live-sandbox place.
	ReadyTimeout time.Duration
	// StorageClass of the claims; empty: none named, the cluster's default.
	StorageClass string
	// SnapshotClass is the VolumeSnapshotClass a pause snapshots the claim with;
	// empty: no snapshots, the claim alone keeps the filesystem.
	SnapshotClass string
	// MountPath is where the claim is mounted in the first container (required;
	// SPACE_KUBERNETES_VOLUME_MOUNT_PATH, /workspace by default): what a pause keeps is
	// what the sandbox wrote under it.
	MountPath string
	// SoftBreachPriorityClass, when set, is the PriorityClass of the Pods of sandboxes
	// admitted over their client's soft limit
	// (SPACE_KUBERNETES_SOFT_BREACH_PRIORITY_CLASS); empty: the template's own.
	SoftBreachPriorityClass string
	// Logger receives the substrate's logs; nil discards them.
	Logger *slog.Logger
}

// Substrate runs sandboxes as Pods on claims of their own. It is safe for concurrent
// use.
type Substrate struct {
	client             k8s.Interface
	dynamic            dynamic.Interface
	namespace          string
	readyTimeout       time.Duration
	storageClass       string
	snapshotClass      string
	mountPath          string
	softBreachPriority string
	log                *slog.Logger

	// beforeAdopt, when set (by tests), runs between Adopt's read of the slot and its
	// Update: a write to the Pod there is what a resourceVersion conflict is made of.
	beforeAdopt func(*corev1.Pod)
}

var (
	_ substrate.Substrate    = (*Substrate)(nil)
	_ substrate.WarmRestorer = (*Substrate)(nil)
)

// New returns a substrate over opts.Clientset in opts.Namespace.
func New(opts Options) (*Substrate, error) {
	if opts.Clientset == nil {
		return nil, errors.New("kubernetes substrate: a clientset is required")
	}
	if opts.Namespace == "" {
		return nil, errors.New("kubernetes substrate: a namespace is required")
	}
	if opts.ReadyTimeout <= 0 {
		return nil, fmt.Errorf("kubernetes substrate: ReadyTimeout must be positive, got %s", opts.ReadyTimeout)
	}
	if opts.MountPath == "" {
		return nil, errors.New("kubernetes substrate: MountPath is required")
	}
	if opts.SnapshotClass != "" && opts.Dynamic == nil {
		return nil, errors.New("kubernetes substrate: a volume snapshot class needs a dynamic client")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Substrate{
		client:             opts.Clientset,
		dynamic:            opts.Dynamic,
		namespace:          opts.Namespace,
		readyTimeout:       opts.ReadyTimeout,
		storageClass:       opts.StorageClass,
		snapshotClass:      opts.SnapshotClass,
		mountPath:          opts.MountPath,
		softBreachPriority: opts.SoftBreachPriorityClass,
		log:                opts.Logger.With("substrate", Name, "namespace", opts.Namespace),
	}, nil
}

// Name returns "kubernetes".
func (s *Substrate) Name() string { return Name }

// Describe says where sandboxes run and what a pause keeps.
func (s *Substrate) Describe() string {
	class := "the cluster's default StorageClass"
	if s.storageClass != "" {
		class = fmt.Sprintf("StorageClass %q", s.storageClass)
	}
	pause := "a pause keeps the claim"
	if s.snapshotClass != "" {
		pause = fmt.Sprintf("a pause keeps the claim and snapshots it with VolumeSnapshotClass %q", s.snapshotClass)
	}
	return fmt.Sprintf("kubernetes: sandboxes run as Pods in namespace %q (ready timeout %s), each on a PersistentVolumeClaim of %s mounted at %s; %s (the filesystem under %s survives a pause, memory and processes do not)",
		s.namespace, s.readyTimeout, class, s.mountPath, pause, s.mountPath)
}

// RestoresWarm is false: a warm slot is a running Pod on a claim of its own, and a
// restore must mount the sandbox's claim, which a running Pod cannot gain. Every
// restore starts a Pod cold, so the flow claims no slot for it.
func (s *Substrate) RestoresWarm() bool { return false }

// Check lists at most one Pod and one claim of the namespace (and one VolumeSnapshot
// when snapshots are configured): the cheapest calls that prove the API server answers
// and that this service account may still read what the substrate manages.
func (s *Substrate) Check(ctx context.Context) error {
	if _, err := s.pods().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("kubernetes substrate: list pods in %s: %w", s.namespace, err)
	}
	if _, err := s.claims().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("kubernetes substrate: list persistentvolumeclaims in %s: %w", s.namespace, err)
	}
	if s.snapshotClass != "" {
		if _, err := s.snapshots().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return fmt.Errorf("kubernetes substrate: list volumesnapshots in %s (is the snapshot.storage.k8s.io CRD installed?): %w", s.namespace, err)
		}
	}
	return nil
}

// StartCold creates the sandbox's claim and Pod and returns the Pod's name once it is
// Ready. On failure both are deleted.
func (s *Substrate) StartCold(ctx context.Context, spec substrate.Spec) (string, error) {
	claim, err := s.ensureClaim(ctx, sandboxClaim(s.namespace, spec, s.storageClass))
	if err != nil {
		return "", fmt.Errorf("start sandbox %s: %w", spec.SandboxID, refused(err, spec.Template))
	}
	pod, err := s.startSandbox(ctx, spec, claim.Name)
	if err != nil {
		s.cleanupClaim(ctx, claim.Name, "the sandbox did not start")
		return "", fmt.Errorf("start sandbox %s: %w", spec.SandboxID, err)
	}
	return pod.Name, nil
}

// Warm creates an ownerless pool slot, a claim and a Pod of shape, and returns the
// Pod's name once it is Ready to be adopted.
func (s *Substrate) Warm(ctx context.Context, slotID string, shape space.Shape, tmpl substrate.Template) (string, error) {
	claim, err := s.ensureClaim(ctx, slotClaim(s.namespace, slotID, shape, s.storageClass))
	if err != nil {
		return "", fmt.Errorf("warm slot %s: %w", slotID, refused(err, tmpl))
	}
	pod, err := slotPod(s.namespace, slotID, shape, tmpl, claim.Name, s.mountPath)
	if err == nil {
		pod, err = s.createReady(ctx, pod, labelSlotID, labelValue(slotID), tmpl)
	}
	if err != nil {
		s.cleanupClaim(ctx, claim.Name, "the slot did not start")
		return "", fmt.Errorf("warm slot %s: %w", slotID, err)
	}
	return pod.Name, nil
}

// Adopt relabels the ready slot Pod slotRef as the sandbox of spec, then its claim.
// The Pod's Update carries the resourceVersion read just before: when another replica
// relabelled the slot in between, the API server answers Conflict and the slot, read
// again, is another sandbox's: substrate.ErrSlotTaken, and the caller tries its next
// slot. A conflict with a write that did not adopt it (the kubelet's) is retried.
func (s *Substrate) Adopt(ctx context.Context, slotRef string, spec substrate.Spec) (string, error) {
	pod, err := s.adopt(ctx, slotRef, spec)
	if err != nil {
		return "", fmt.Errorf("adopt slot %s for sandbox %s: %w", slotRef, spec.SandboxID, err)
	}
	return pod.Name, nil
}

// Snapshot pauses the sandbox of Pod ref: it makes sure the Pod's claim carries the
// sandbox's labels (an adopted slot's may not yet), deletes the Pod and waits for it to
// go, so that nothing writes to the volume any more, and, with a snapshot class, takes
// a VolumeSnapshot of the claim and waits for it to be ready. It returns the snapshot's
// reference (volumesnapshot/<name>), or the claim's (pvc/<name>) without one. The claim
// is kept either way; once the Pod is deleted the pause has happened, so a snapshot that
// fails is logged, not returned.
func (s *Substrate) Snapshot(ctx context.Context, ref string) (string, error) {
	pod, err := s.get(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", ref, err)
	}
	claim := podClaim(pod)
	if claim == "" {
		return "", fmt.Errorf("snapshot %s: the pod has no %s volume to keep (it was started without one), so it cannot be paused: %w", ref, volumeName, substrate.ErrUnsupported)
	}
	sandboxID := pod.Annotations[annotationSandboxID]
	if sandboxID == "" {
		return "", fmt.Errorf("snapshot %s: the pod is a warm slot, not a sandbox: %w", ref, substrate.ErrNotFound)
	}
	if err := s.ownClaim(ctx, claim, pod); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", ref, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.readyTimeout)
	defer cancel()
	if err := s.delete(ctx, pod.Name); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", ref, err)
	}
	// From here the pause has happened: the Pod will not serve again.
	if err := s.waitGone(ctx, pod); err != nil {
		s.log.WarnContext(ctx, "a paused sandbox's pod is still terminating; its claim is kept", "pod", pod.Name, "err", err)
	}
	kept := claimRefPrefix + claim
	if s.snapshotClass == "" {
		return kept, nil
	}
	snap, err := s.takeSnapshot(ctx, pod, claim)
	if err != nil {
		s.log.ErrorContext(ctx, "the volume snapshot of a pause failed; the sandbox is paused on its kept claim", "sandbox", sandboxID, "claim", claim, "err", err)
		return kept, nil
	}
	return snapshotRefPrefix + snap, nil
}

// Restore starts the sandbox of spec on its kept claim, or, when that is gone, on a
// claim made from its newest ready VolumeSnapshot (snapshotRef's, or found by its
// labels). There is no warm restore (RestoresWarm): a slotRef is refused with
// substrate.ErrUnsupported, leaving the slot as it was. A Pod that does not become
// Ready is deleted; the claim stays, for the next restore.
func (s *Substrate) Restore(ctx context.Context, snapshotRef, slotRef string, spec substrate.Spec) (string, error) {
	if slotRef != "" {
		return "", fmt.Errorf("restore sandbox %s into slot %s: a warm slot runs on a volume of its own and cannot mount the sandbox's: %w", spec.SandboxID, slotRef, substrate.ErrUnsupported)
	}
	claim, err := s.restoreClaim(ctx, spec, snapshotRef)
	if err != nil {
		return "", fmt.Errorf("restore sandbox %s: %w", spec.SandboxID, refused(err, spec.Template))
	}
	pod, err := s.startSandbox(ctx, spec, claim)
	if err != nil {
		return "", fmt.Errorf("restore sandbox %s on claim %s: %w", spec.SandboxID, claim, err)
	}
	return pod.Name, nil
}

// Stop deletes what ref names: a Pod (and, for an unadopted slot's Pod, its claim),
// a claim (pvc/<name>) or a VolumeSnapshot (volumesnapshot/<name>). It returns once the
// API server accepted the deletion (a Pod is terminating and will not serve again),
// not once the kubelet has finished: waiting out the Pod's grace period would hold the
// caller for up to 30s for nothing. What is already gone is not an error.
func (s *Substrate) Stop(ctx context.Context, ref string) error {
	var err error
	switch {
	case strings.HasPrefix(ref, claimRefPrefix):
		err = s.deleteClaim(ctx, strings.TrimPrefix(ref, claimRefPrefix))
	case strings.HasPrefix(ref, snapshotRefPrefix):
		err = s.deleteSnapshot(ctx, strings.TrimPrefix(ref, snapshotRefPrefix))
	default:
		err = s.stopPod(ctx, ref)
	}
	if err != nil {
		return fmt.Errorf("stop %s: %w", ref, err)
	}
	return nil
}

// stopPod deletes Pod name; a slot nobody adopted takes its claim with it, since the
// claim holds nothing of anyone's.
func (s *Substrate) stopPod(ctx context.Context, name string) error {
	pod, err := s.pods().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get pod %s: %w", name, err)
	}
	if err := s.delete(ctx, name); err != nil {
		return err
	}
	if pod.Labels[labelPool] != "true" {
		return nil
	}
	claim := podClaim(pod)
	if claim == "" {
		return nil
	}
	c, err := s.claims().Get(ctx, claim, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get claim %s: %w", claim, err)
	case c.Labels[labelPool] != "true" || c.Annotations[annotationSandboxID] != "":
		return nil // adopted meanwhile: the sandbox's now
	}
	return s.deleteClaim(ctx, claim)
}

// startSandbox creates the Pod of spec on claim and waits for it to be Ready.
func (s *Substrate) startSandbox(ctx context.Context, spec substrate.Spec, claim string) (*corev1.Pod, error) {
	pod, err := sandboxPod(s.namespace, spec, claim, s.mountPath, s.softBreachPriority)
	if err != nil {
		return nil, err
	}
	return s.createReady(ctx, pod, labelSandboxID, labelValue(spec.SandboxID), spec.Template)
}

// createReady creates pod and waits for it to be Ready. When a live Pod labelled
// key=value already exists (left by an earlier attempt whose caller died before it
// recorded the reference) it waits for that one instead of starting a second. A Pod
// the API server refuses as invalid is the template's fault: a 422 naming it.
func (s *Substrate) createReady(ctx context.Context, pod *corev1.Pod, key, value string, tmpl substrate.Template) (*corev1.Pod, error) {
	existing, err := s.findLive(ctx, key, value)
	if err != nil {
		return nil, err
	}
	var from *corev1.Pod
	if existing != nil {
		from = existing
		s.log.InfoContext(ctx, "reusing pod of an earlier attempt", "pod", existing.Name, key, value)
	} else {
		created, err := s.pods().Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create pod %s: %w", pod.Name, refused(err, tmpl))
		}
		from = created
	}
	ready, err := s.waitReady(ctx, from)
	if err != nil {
		s.cleanup(ctx, from.Name, err.Error())
		return nil, err
	}
	return ready, nil
}

// refused turns the API server's refusal of an object built from tmpl (422 Invalid:
// its validation) into the caller's 422 naming the template, with the server's own
// words (which name the field of the pod spec); other errors pass as they are.
func refused(err error, tmpl substrate.Template) error {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return err
	}
	return &space.Error{Code: space.EUNPROCESSABLE, Field: "template", Err: err,
		Message: fmt.Sprintf("template %q cannot run on this cluster: the Kubernetes API server refused it: %s", tmpl.Name, status.Status().Message)}
}

// findLive returns a Pod labelled key=value that is not being deleted, or nil. It
// reads from the API server's watch cache (resourceVersion "0"), not etcd: an earlier
// attempt's Pod is older than the cache's lag, and a quorum list per cold start would
// load etcd for nothing.
func (s *Substrate) findLive(ctx context.Context, key, value string) (*corev1.Pod, error) {
	list, err := s.pods().List(ctx, metav1.ListOptions{LabelSelector: key + "=" + value, ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("list pods %s=%s: %w", key, value, err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp == nil && !podFinished(p) && p.Labels[key] == value {
			return p, nil
		}
	}
	return nil, nil
}

// maxAdoptConflicts bounds the re-reads of a slot whose Update conflicted with a
// write that did not adopt it (a kubelet's status write bumps the resourceVersion too).
const maxAdoptConflicts = 5

// adopt relabels slotRef for spec, or returns it as is when it already belongs to
// spec's sandbox (a retried adoption); then the slot's claim.
func (s *Substrate) adopt(ctx context.Context, slotRef string, spec substrate.Spec) (*corev1.Pod, error) {
	for conflicts := 0; ; conflicts++ {
		pod, err := s.get(ctx, slotRef)
		if err != nil {
			return nil, err
		}
		sandboxID := labelValue(spec.SandboxID)
		switch owner, adopted := pod.Labels[labelSandboxID]; {
		case adopted && owner == sandboxID:
			s.ownClaimOrLog(ctx, pod)
			return pod, nil
		case adopted || pod.Labels[labelPool] != "true":
			return nil, substrate.ErrSlotTaken
		}
		if pod.DeletionTimestamp != nil || podFinished(pod) {
			return nil, fmt.Errorf("slot pod is gone (phase %s): %w", pod.Status.Phase, substrate.ErrNotFound)
		}
		if !podReady(pod) {
			return nil, fmt.Errorf("slot pod is not ready (phase %s): %w", pod.Status.Phase, substrate.ErrNotFound)
		}
		if err := matchShape(pod, spec.Shape); err != nil {
			return nil, err
		}
		relabelForSandbox(pod, spec)
		if s.beforeAdopt != nil {
			s.beforeAdopt(pod)
		}
		updated, err := s.pods().Update(ctx, pod, metav1.UpdateOptions{})
		switch {
		case apierrors.IsConflict(err) && conflicts < maxAdoptConflicts:
			continue // read it again: taken by another replica, or only written to
		case apierrors.IsConflict(err):
			return nil, substrate.ErrSlotTaken
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("slot pod deleted while adopting: %w", substrate.ErrNotFound)
		case err != nil:
			return nil, fmt.Errorf("relabel pod: %w", err)
		}
		s.ownClaimOrLog(ctx, updated)
		return updated, nil
	}
}

// ownClaimOrLog relabels the claim of pod, adopted, as the sandbox's. The Pod is the
// sandbox's already; should the claim's relabelling fail, Find and List still reach
// the claim through the Pod that mounts it, and a pause relabels it before the Pod
// goes, so the adoption stands.
func (s *Substrate) ownClaimOrLog(ctx context.Context, pod *corev1.Pod) {
	if err := s.ownClaim(ctx, podClaim(pod), pod); err != nil {
		s.log.WarnContext(ctx, "relabel an adopted slot's claim; it is found through its pod", "pod", pod.Name, "err", err)
	}
}

func (s *Substrate) pods() podClient { return s.client.CoreV1().Pods(s.namespace) }

func (s *Substrate) get(ctx context.Context, name string) (*corev1.Pod, error) {
	pod, err := s.pods().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("pod %s: %w", name, substrate.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s: %w", name, err)
	}
	return pod, nil
}

func (s *Substrate) delete(ctx context.Context, name string) error {
	policy := metav1.DeletePropagationBackground
	err := s.pods().Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	return nil
}

// cleanup deletes a Pod that failed to start, on a context of its own: the caller's
// may be the one that just expired.
func (s *Substrate) cleanup(ctx context.Context, name, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := s.delete(ctx, name); err != nil {
		s.log.ErrorContext(ctx, "could not delete a pod that failed to start; it is left behind", "pod", name, "reason", why, "err", err)
		return
	}
	s.log.WarnContext(ctx, "deleted a pod that failed to start", "pod", name, "reason", why)
}

// cleanupClaim deletes the claim of a sandbox or slot that failed to start, on a
// context of its own; the sweep removes it should that fail too.
func (s *Substrate) cleanupClaim(ctx context.Context, name, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := s.deleteClaim(ctx, name); err != nil {
		s.log.ErrorContext(ctx, "could not delete the claim of a sandbox that failed to start; the sweep removes it", "claim", name, "reason", why, "err", err)
	}
}

// callSlack is added to the ready timeout in Timeout: the API calls around the wait
// (create, list, relabel) and the deletion of a Pod that failed.
const callSlack = 30 * time.Second

// Timeout is the ready timeout plus the cleanup of a Pod that failed and the API calls
// around them: no call of this substrate outlives it (Substrate.Timeout). A pause's
// two waits (its Pod gone, its snapshot ready) share one ready timeout.
func (s *Substrate) Timeout() time.Duration { return s.readyTimeout + cleanupTimeout + callSlack }

// Find returns what the namespace holds for sandbox id, from quorum reads (the
// reconciler decides on it): its Pods (a cold-started sandbox, an adopted slot, or one
// half made by an attempt that died) as Resources; its claims (labelled with it, or
// mounted by one of its Pods) and VolumeSnapshots as Storage; and as Snapshot what a
// restore would start from: the live claim, else the newest ready VolumeSnapshot.
func (s *Substrate) Find(ctx context.Context, sandboxID string) (substrate.Finding, error) {
	selector := labelSandboxID + "=" + labelValue(sandboxID)
	list, err := s.pods().List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return substrate.Finding{}, fmt.Errorf("find sandbox %s: list pods: %w", sandboxID, err)
	}
	var f substrate.Finding
	mounted := map[string]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Annotations[annotationSandboxID] == sandboxID {
			f.Resources = append(f.Resources, resourceOf(p))
			if c := podClaim(p); c != "" {
				mounted[c] = true
			}
		}
	}
	claims, err := s.sandboxClaims(ctx, sandboxID, mounted)
	if err != nil {
		return substrate.Finding{}, fmt.Errorf("find sandbox %s: %w", sandboxID, err)
	}
	for i := range claims {
		c := &claims[i]
		f.Storage = append(f.Storage, claimResource(c, sandboxID))
		if f.Snapshot == "" && c.DeletionTimestamp == nil {
			f.Snapshot = claimRefPrefix + c.Name
		}
	}
	snaps, err := s.sandboxSnapshots(ctx, sandboxID)
	if err != nil {
		return substrate.Finding{}, fmt.Errorf("find sandbox %s: %w", sandboxID, err)
	}
	for _, sn := range snaps {
		f.Storage = append(f.Storage, sn.resource())
	}
	if f.Snapshot == "" {
		if newest, ok := newestReady(snaps); ok {
			f.Snapshot = snapshotRefPrefix + newest.name
		}
	}
	return f, nil
}

// List returns every Pod, claim and VolumeSnapshot this substrate manages in its
// namespace. A claim carries its sandbox's id from its annotations, or, when it has
// none yet (an adopted slot's, before its relabelling), from the Pod that mounts it.
func (s *Substrate) List(ctx context.Context) ([]substrate.Resource, error) {
	managed := metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy}
	list, err := s.pods().List(ctx, managed)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := make([]substrate.Resource, 0, 2*len(list.Items))
	mountedBy := map[string]string{}
	for i := range list.Items {
		p := &list.Items[i]
		out = append(out, resourceOf(p))
		if c := podClaim(p); c != "" && p.Annotations[annotationSandboxID] != "" {
			mountedBy[c] = p.Annotations[annotationSandboxID]
		}
	}
	claims, err := s.claims().List(ctx, managed)
	if err != nil {
		return nil, fmt.Errorf("list persistentvolumeclaims: %w", err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		out = append(out, claimResource(c, mountedBy[c.Name]))
	}
	snaps, err := s.listSnapshots(ctx, managed)
	if err != nil {
		return nil, err
	}
	for _, sn := range snaps {
		out = append(out, sn.resource())
	}
	return out, nil
}

// resourceOf describes a Pod as a substrate.Resource, its ids from the annotations
// that keep them exactly (labels may hold encodings).
func resourceOf(p *corev1.Pod) substrate.Resource {
	return substrate.Resource{
		Ref:        p.Name,
		SandboxID:  p.Annotations[annotationSandboxID],
		SlotID:     p.Annotations[annotationSlotID],
		Ready:      p.DeletionTimestamp == nil && !podFinished(p) && podReady(p),
		Created:    p.CreationTimestamp.Time,
		SoftBreach: p.Labels[labelSoftBreach] == "true",
	}
}
