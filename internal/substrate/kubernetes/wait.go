package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// ErrNotReady is wrapped by the error of a start, warm or restore whose Pod did not
// become Ready: it timed out, failed, or was deleted. The Pod has been deleted.
var ErrNotReady = errors.New("pod did not become ready")

// errReadyTimeout is the cause of the wait's own deadline, told apart from the
// caller's context ending.
var errReadyTimeout = errors.New("ready timeout")

// waitReady watches Pod name until it is Ready, fails, is deleted, or the ready timeout
// (or ctx) ends. The watch is opened without a resourceVersion, so its first event is
// the Pod's current state: nothing that happened between the create and the watch is
// missed. A watch the API server closes (they last minutes) is reopened.
func (s *Substrate) waitReady(ctx context.Context, name string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.readyTimeout, errReadyTimeout)
	defer cancel()
	var last *corev1.Pod
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	for {
		w, err := s.pods().Watch(ctx, opts)
		if err != nil {
			if ctx.Err() != nil {
				return nil, s.notReady(ctx, name, last)
			}
			return nil, fmt.Errorf("watch pod %s: %w", name, err)
		}
		pod, done, err := s.follow(ctx, w, name, &last)
		w.Stop()
		if done {
			return pod, err
		}
	}
}

// follow reads events until the Pod is Ready (done, no error), can no longer become
// Ready (done, error), or the watch ends (not done: reopen it).
func (s *Substrate) follow(ctx context.Context, w watch.Interface, name string, last **corev1.Pod) (*corev1.Pod, bool, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, true, s.notReady(ctx, name, *last)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, false, nil
			}
			switch ev.Type {
			case watch.Error:
				s.log.DebugContext(ctx, "pod watch ended with an error; reopening", "pod", name, "err", apierrors.FromObject(ev.Object))
				return nil, false, nil
			case watch.Bookmark:
				continue
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || pod.Name != name {
				continue // the fake clientset ignores field selectors
			}
			*last = pod
			if ev.Type == watch.Deleted || pod.DeletionTimestamp != nil {
				return nil, true, fmt.Errorf("pod %s was deleted before it became ready: %w", name, ErrNotReady)
			}
			if podReady(pod) {
				return pod, true, nil
			}
			if why := hopeless(pod); why != "" {
				return nil, true, fmt.Errorf("pod %s cannot become ready: %s: %w", name, why, ErrNotReady)
			}
		}
	}
}

// notReady is the error of a wait that ran out of time: ours (ErrNotReady, with what
// the Pod was doing) or the caller's (its context error).
func (s *Substrate) notReady(ctx context.Context, name string, last *corev1.Pod) error {
	if errors.Is(context.Cause(ctx), errReadyTimeout) {
		return fmt.Errorf("pod %s not ready after %s (%s): %w", name, s.readyTimeout, podState(last), ErrNotReady)
	}
	return fmt.Errorf("waiting for pod %s to be ready (%s): %w", name, podState(last), ctx.Err())
}

// hopeless says why a Pod can never become Ready, or "" while it still may: it ended,
// or its image name can never be pulled. Back-offs (ImagePullBackOff, CrashLoopBackOff)
// and Unschedulable may clear (a registry comes back, an autoscaler adds a node), so
// they wait for the deadline and are reported in its error.
func hopeless(p *corev1.Pod) string {
	if podFinished(p) {
		return "phase " + string(p.Status.Phase) + reason(p.Status.Reason, p.Status.Message)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && (w.Reason == "InvalidImageName" || w.Reason == "ErrImageNeverPull") {
			return "container " + cs.Name + reason(w.Reason, w.Message)
		}
	}
	return ""
}

// podState summarises what a Pod is waiting on, for an error message.
func podState(p *corev1.Pod) string {
	if p == nil {
		return "no status seen"
	}
	parts := []string{"phase " + string(p.Status.Phase)}
	if p.Status.Phase == "" {
		parts[0] = "phase unknown"
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Reason != "" {
			parts = append(parts, string(c.Type)+reason(c.Reason, c.Message))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			parts = append(parts, "container "+cs.Name+reason(w.Reason, w.Message))
		}
	}
	return strings.Join(parts, "; ")
}

func reason(r, msg string) string {
	const maxLen = 200 // a scheduler message lists every node pool
	if len(msg) > maxLen {
		msg = msg[:maxLen] + "…"
	}
	switch {
	case r == "" && msg == "":
		return ""
	case msg == "":
		return ": " + r
	}
	return ": " + r + " (" + msg + ")"
}
