// Package kubernetes runs sandboxes and warm pool slots as Pods (SPACE_SUBSTRATE=kubernetes).
//
// A sandbox is one Pod built from its template's PodSpec, sized by its shape and
// labelled with its sandbox id, its owner's client key and its shape. A warm slot is the
// same Pod without an owner, labelled as a pool member; adopting it relabels it with an
// Update carrying the resourceVersion that was read, so of two replicas racing for one
// slot exactly one wins and the other gets substrate.ErrSlotTaken.
//
// Every call blocks until the Pod is Ready, watching it (no polling), within
// Options.ReadyTimeout. A Pod that does not become Ready in time, or that fails, is
// deleted before the call returns its error: the caller never has to clean up a Pod it
// was not told about.
//
// Snapshots are not something Kubernetes does for a Pod on its own; they are delegated
// to a Snapshotter (container checkpointing, a VM runtime's snapshot API, a volume
// snapshot). Without one, Snapshot and Restore fail with substrate.ErrUnsupported.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

// Name is the SPACE_SUBSTRATE value of this substrate.
const Name = "kubernetes"

// cleanupTimeout bounds the deletion of a Pod that failed to start. It runs on a
// context detached from the caller's, because the caller's may be the one that expired.
const cleanupTimeout = 10 * time.Second

// Snapshotter saves and loads sandbox state. Kubernetes has no portable Pod snapshot,
// so the substrate delegates both halves to one; implementations must be safe for
// concurrent use.
type Snapshotter interface {
	// Snapshot saves the state of pod, which is Ready, and returns the snapshot's
	// reference. The substrate deletes the Pod once it returns without error.
	Snapshot(ctx context.Context, pod *corev1.Pod) (snapshotRef string, err error)
	// Restore loads snapshotRef into pod, which is Ready: a Pod started from the
	// template (a cold restore) or an adopted warm slot. It may be called again for the
	// same sandbox after a failed attempt, so it should be idempotent.
	Restore(ctx context.Context, snapshotRef string, pod *corev1.Pod) error
}

// PodPreparer is an optional interface of a Snapshotter that restores by building the
// Pod differently (for example from a checkpoint image): PreparePod edits the Pod of a
// cold restore before it is created. Restore is still called once it is Ready.
type PodPreparer interface {
	PreparePod(ctx context.Context, snapshotRef string, pod *corev1.Pod) error
}

// Options configure New.
type Options struct {
	// Clientset talks to the API server (required). Tests pass a fake one.
	Clientset k8s.Interface
	// Namespace holds every sandbox and slot Pod (required). Giving sandboxes a
	// namespace of their own keeps the RBAC the substrate needs, and the blast radius of
	// untrusted code, confined to it.
	Namespace string
	// ReadyTimeout bounds the wait for a Pod to become Ready (required;
	// SPACE_KUBERNETES_READY_TIMEOUT, 2m by default): long enough for a cold image pull
	// on a fresh node, short enough that a sandbox stuck Pending (no capacity, bad
	// image) fails instead of holding its client's live-sandbox place.
	ReadyTimeout time.Duration
	// Snapshotter saves and loads sandbox state; nil makes Snapshot and Restore return
	// substrate.ErrUnsupported.
	Snapshotter Snapshotter
	// Logger receives the substrate's logs; nil discards them.
	Logger *slog.Logger
}

// Substrate runs sandboxes as Pods. It is safe for concurrent use.
type Substrate struct {
	client       k8s.Interface
	namespace    string
	readyTimeout time.Duration
	snapshotter  Snapshotter
	log          *slog.Logger
}

var _ substrate.Substrate = (*Substrate)(nil)

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
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Substrate{
		client:       opts.Clientset,
		namespace:    opts.Namespace,
		readyTimeout: opts.ReadyTimeout,
		snapshotter:  opts.Snapshotter,
		log:          opts.Logger.With("substrate", Name, "namespace", opts.Namespace),
	}, nil
}

// Name returns "kubernetes".
func (s *Substrate) Name() string { return Name }

// Describe says where sandboxes run and whether they can be paused.
func (s *Substrate) Describe() string {
	snap := "no snapshotter: pause and restore are unsupported"
	if s.snapshotter != nil {
		snap = fmt.Sprintf("snapshotter %T", s.snapshotter)
	}
	return fmt.Sprintf("kubernetes: sandboxes run as Pods in namespace %q (ready timeout %s; %s)", s.namespace, s.readyTimeout, snap)
}

// Check lists at most one Pod of the namespace: the cheapest call that proves the API
// server answers and that this service account may still read its Pods.
func (s *Substrate) Check(ctx context.Context) error {
	if _, err := s.pods().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("kubernetes substrate: list pods in %s: %w", s.namespace, err)
	}
	return nil
}

// StartCold creates the sandbox's Pod and returns its name once it is Ready.
func (s *Substrate) StartCold(ctx context.Context, spec substrate.Spec) (string, error) {
	pod, err := s.startSandbox(ctx, spec, nil)
	if err != nil {
		return "", fmt.Errorf("start sandbox %s: %w", spec.SandboxID, err)
	}
	return pod.Name, nil
}

// Warm creates an ownerless pool slot Pod of shape and returns its name once it is
// Ready to be adopted.
func (s *Substrate) Warm(ctx context.Context, slotID string, shape space.Shape, tmpl substrate.Template) (string, error) {
	pod, err := slotPod(s.namespace, slotID, shape, tmpl)
	if err != nil {
		return "", fmt.Errorf("warm slot %s: %w", slotID, err)
	}
	ready, err := s.createReady(ctx, pod, labelSlotID, labelValue(slotID))
	if err != nil {
		return "", fmt.Errorf("warm slot %s: %w", slotID, err)
	}
	return ready.Name, nil
}

// Adopt relabels the ready slot Pod slotRef as the sandbox of spec. The Update carries
// the resourceVersion read just before, so when another replica relabelled the slot in
// between the API server answers Conflict, returned as substrate.ErrSlotTaken: the
// caller tries its next slot.
func (s *Substrate) Adopt(ctx context.Context, slotRef string, spec substrate.Spec) (string, error) {
	pod, err := s.adopt(ctx, slotRef, spec)
	if err != nil {
		return "", fmt.Errorf("adopt slot %s for sandbox %s: %w", slotRef, spec.SandboxID, err)
	}
	return pod.Name, nil
}

// Snapshot saves the sandbox's state through the Snapshotter, then deletes its Pod.
func (s *Substrate) Snapshot(ctx context.Context, ref string) (string, error) {
	if s.snapshotter == nil {
		return "", fmt.Errorf("snapshot %s: the kubernetes substrate has no snapshotter configured, so sandboxes cannot be paused: %w", ref, substrate.ErrUnsupported)
	}
	pod, err := s.get(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", ref, err)
	}
	snap, err := s.snapshotter.Snapshot(ctx, pod)
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", ref, err)
	}
	if err := s.Stop(ctx, ref); err != nil {
		return "", fmt.Errorf("snapshot %s: saved as %s but %w", ref, snap, err)
	}
	return snap, nil
}

// Restore starts the sandbox of spec from snapshotRef: into the warm slot slotRef when
// it is not empty (adopting it first unless the caller already did), otherwise into a
// new Pod. On failure the Pod is deleted.
func (s *Substrate) Restore(ctx context.Context, snapshotRef, slotRef string, spec substrate.Spec) (string, error) {
	if s.snapshotter == nil {
		return "", fmt.Errorf("restore sandbox %s: the kubernetes substrate has no snapshotter configured, so snapshots cannot be loaded: %w", spec.SandboxID, substrate.ErrUnsupported)
	}
	var pod *corev1.Pod
	var err error
	if slotRef != "" {
		pod, err = s.adopt(ctx, slotRef, spec)
		if err != nil {
			return "", fmt.Errorf("restore sandbox %s into slot %s: %w", spec.SandboxID, slotRef, err)
		}
	} else {
		prepare := func(p *corev1.Pod) error {
			if pp, ok := s.snapshotter.(PodPreparer); ok {
				return pp.PreparePod(ctx, snapshotRef, p)
			}
			return nil
		}
		pod, err = s.startSandbox(ctx, spec, prepare)
		if err != nil {
			return "", fmt.Errorf("restore sandbox %s: %w", spec.SandboxID, err)
		}
	}
	if err := s.snapshotter.Restore(ctx, snapshotRef, pod); err != nil {
		s.cleanup(ctx, pod.Name, "snapshot restore failed")
		return "", fmt.Errorf("restore sandbox %s from %s into pod %s: %w", spec.SandboxID, snapshotRef, pod.Name, err)
	}
	return pod.Name, nil
}

// Stop deletes the Pod ref. It returns once the API server accepted the deletion (the
// Pod is terminating and will not serve again), not once the kubelet has finished:
// waiting out the Pod's grace period would hold the caller for up to 30s for nothing.
// A Pod that is already gone is not an error.
func (s *Substrate) Stop(ctx context.Context, ref string) error {
	if err := s.delete(ctx, ref); err != nil {
		return fmt.Errorf("stop %s: %w", ref, err)
	}
	return nil
}

// startSandbox creates the Pod of spec (edited by prepare when not nil) and waits for
// it to be Ready.
func (s *Substrate) startSandbox(ctx context.Context, spec substrate.Spec, prepare func(*corev1.Pod) error) (*corev1.Pod, error) {
	pod, err := sandboxPod(s.namespace, spec)
	if err != nil {
		return nil, err
	}
	if prepare != nil {
		if err := prepare(pod); err != nil {
			return nil, fmt.Errorf("prepare pod: %w", err)
		}
	}
	return s.createReady(ctx, pod, labelSandboxID, labelValue(spec.SandboxID))
}

// createReady creates pod and waits for it to be Ready. When a live Pod labelled
// key=value already exists (left by an earlier attempt whose caller died before it
// recorded the reference) it waits for that one instead of starting a second.
func (s *Substrate) createReady(ctx context.Context, pod *corev1.Pod, key, value string) (*corev1.Pod, error) {
	existing, err := s.findLive(ctx, key, value)
	if err != nil {
		return nil, err
	}
	name := ""
	if existing != nil {
		name = existing.Name
		s.log.InfoContext(ctx, "reusing pod of an earlier attempt", "pod", name, key, value)
	} else {
		created, err := s.pods().Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create pod %s: %w", pod.Name, err)
		}
		name = created.Name
	}
	ready, err := s.waitReady(ctx, name)
	if err != nil {
		s.cleanup(ctx, name, err.Error())
		return nil, err
	}
	return ready, nil
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

// adopt relabels slotRef for spec, or returns it as is when it already belongs to
// spec's sandbox (a retried adoption).
func (s *Substrate) adopt(ctx context.Context, slotRef string, spec substrate.Spec) (*corev1.Pod, error) {
	pod, err := s.get(ctx, slotRef)
	if err != nil {
		return nil, err
	}
	sandboxID := labelValue(spec.SandboxID)
	switch owner, adopted := pod.Labels[labelSandboxID]; {
	case adopted && owner == sandboxID:
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
	updated, err := s.pods().Update(ctx, pod, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err):
		return nil, substrate.ErrSlotTaken
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("slot pod deleted while adopting: %w", substrate.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("relabel pod: %w", err)
	}
	return updated, nil
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

// callSlack is added to the ready timeout in Timeout: the API calls around the wait
// (create, list, relabel, the snapshotter's own) and the deletion of a Pod that failed.
const callSlack = 30 * time.Second

// Timeout is the ready timeout plus the cleanup of a Pod that failed and the API calls
// around them: no call of this substrate outlives it (Substrate.Timeout).
func (s *Substrate) Timeout() time.Duration { return s.readyTimeout + cleanupTimeout + callSlack }

// Find returns the Pods labelled with sandbox id (a cold-started sandbox, an adopted
// slot, or one half made by an attempt that died), from a quorum read: the reconciler
// decides on it. Snapshots are the Snapshotter's and cannot be found here.
func (s *Substrate) Find(ctx context.Context, sandboxID string) (substrate.Finding, error) {
	list, err := s.pods().List(ctx, metav1.ListOptions{LabelSelector: labelSandboxID + "=" + labelValue(sandboxID)})
	if err != nil {
		return substrate.Finding{}, fmt.Errorf("find sandbox %s: list pods: %w", sandboxID, err)
	}
	var f substrate.Finding
	for i := range list.Items {
		p := &list.Items[i]
		if p.Annotations[annotationSandboxID] == sandboxID {
			f.Resources = append(f.Resources, resourceOf(p))
		}
	}
	return f, nil
}

// List returns every Pod this substrate manages in its namespace.
func (s *Substrate) List(ctx context.Context) ([]substrate.Resource, error) {
	list, err := s.pods().List(ctx, metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := make([]substrate.Resource, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, resourceOf(&list.Items[i]))
	}
	return out, nil
}

// resourceOf describes a Pod as a substrate.Resource, its ids from the annotations
// that keep them exactly (labels may hold encodings).
func resourceOf(p *corev1.Pod) substrate.Resource {
	return substrate.Resource{
		Ref:       p.Name,
		SandboxID: p.Annotations[annotationSandboxID],
		SlotID:    p.Annotations[annotationSlotID],
		Ready:     p.DeletionTimestamp == nil && !podFinished(p) && podReady(p),
		Created:   p.CreationTimestamp.Time,
	}
}
