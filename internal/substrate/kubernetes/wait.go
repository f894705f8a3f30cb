package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// ErrNotReady is wrapped by the error of a start, warm or restore whose Pod did not
// become Ready: it timed out, failed, or was deleted. The Pod has been deleted.
var ErrNotReady = errors.New("pod did not become ready")

// errReadyTimeout is the cause of the wait's own deadline, told apart from the
// caller's context ending.
var errReadyTimeout = errors.New("ready timeout")

// watcher lists and watches one kind of object of the namespace.
type watcher struct {
	list  func(ctx context.Context, opts metav1.ListOptions) ([]runtime.Object, string, error)
	watch func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

func (s *Substrate) podWatcher() watcher {
	return watcher{
		list: func(ctx context.Context, opts metav1.ListOptions) ([]runtime.Object, string, error) {
			l, err := s.pods().List(ctx, opts)
			if err != nil {
				return nil, "", err
			}
			out := make([]runtime.Object, 0, len(l.Items))
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			return out, l.ResourceVersion, nil
		},
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return s.pods().Watch(ctx, opts)
		},
	}
}

func (s *Substrate) snapshotWatcher() watcher {
	return watcher{
		list: func(ctx context.Context, opts metav1.ListOptions) ([]runtime.Object, string, error) {
			l, err := s.snapshots().List(ctx, opts)
			if err != nil {
				return nil, "", err
			}
			out := make([]runtime.Object, 0, len(l.Items))
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			return out, l.GetResourceVersion(), nil
		},
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return s.snapshots().Watch(ctx, opts)
		},
	}
}

// check is told the state of the object a wait follows (nil once it is gone, with
// watch.Deleted) and says whether the wait is over, and how.
type check func(obj runtime.Object, ev watch.EventType) (done bool, err error)

// until follows object name, from its state from (which it checks first) onwards,
// until done says so or ctx ends (ctx's error then). It watches from from's
// resourceVersion, so nothing between the read of from and the watch is missed, and
// a watch that ends (the API server closes them after minutes) is reopened from the
// last resourceVersion seen. When the server has compacted that version away (410
// Gone, an expired watch), it relists: a list gives the current state and a fresh
// version to watch from. Without from it starts with a list.
func (s *Substrate) until(ctx context.Context, w watcher, name string, from runtime.Object, done check) error {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	rv := ""
	if from != nil {
		if over, err := done(from, watch.Added); over {
			return err
		}
		m, err := meta.Accessor(from)
		if err != nil {
			return err
		}
		rv = m.GetResourceVersion()
	}
	for {
		if rv == "" {
			objs, listRV, err := w.list(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil {
				return listFailed(ctx, name, err)
			}
			var obj runtime.Object
			ev := watch.Deleted
			for _, o := range objs {
				if m, err := meta.Accessor(o); err == nil && m.GetName() == name {
					obj, ev = o, watch.Added
				}
			}
			if over, err := done(obj, ev); over {
				return err
			}
			rv = listRV
		}
		wi, err := w.watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if expired(err) {
				s.log.DebugContext(ctx, "watch expired; relisting", "object", name, "resourceVersion", rv)
				rv = ""
				continue
			}
			return listFailed(ctx, name, err)
		}
		next, over, err := s.follow(ctx, wi, name, rv, done)
		wi.Stop()
		if over {
			return err
		}
		rv = next
	}
}

// follow reads events until done says the wait is over, or the watch ends: then it
// returns the resourceVersion to watch from next ("" to relist).
func (s *Substrate) follow(ctx context.Context, w watch.Interface, name, rv string, done check) (string, bool, error) {
	for {
		select {
		case <-ctx.Done():
			return rv, true, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, false, nil
			}
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				if expired(err) {
					s.log.DebugContext(ctx, "watch expired; relisting", "object", name, "resourceVersion", rv, "err", err)
					return "", false, nil
				}
				s.log.DebugContext(ctx, "watch ended with an error; relisting", "object", name, "err", err)
				return "", false, nil
			}
			m, err := meta.Accessor(ev.Object)
			if err != nil {
				continue
			}
			rv = m.GetResourceVersion()
			if ev.Type == watch.Bookmark || m.GetName() != name {
				continue
			}
			obj := ev.Object
			if ev.Type == watch.Deleted {
				obj = nil
			}
			if over, err := done(obj, ev.Type); over {
				return rv, true, err
			}
		}
	}
}

// expired reports a watch whose resourceVersion the server no longer has.
func expired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// listFailed is the error of a list or watch call: the context's when it ended.
func listFailed(ctx context.Context, name string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("watch %s: %w", name, err)
}

// waitReady follows Pod from until it is Ready, fails, is deleted, or the ready timeout
// (or ctx) ends.
func (s *Substrate) waitReady(ctx context.Context, from *corev1.Pod) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.readyTimeout, errReadyTimeout)
	defer cancel()
	name := from.Name
	var last, ready *corev1.Pod
	err := s.until(ctx, s.podWatcher(), name, from, func(obj runtime.Object, _ watch.EventType) (bool, error) {
		pod, _ := obj.(*corev1.Pod)
		if pod == nil || pod.UID != from.UID && from.UID != "" {
			return true, fmt.Errorf("pod %s was deleted before it became ready: %w", name, ErrNotReady)
		}
		last = pod
		switch {
		case pod.DeletionTimestamp != nil:
			return true, fmt.Errorf("pod %s was deleted before it became ready: %w", name, ErrNotReady)
		case podReady(pod):
			ready = pod
			return true, nil
		}
		if why := hopeless(pod); why != "" {
			return true, fmt.Errorf("pod %s cannot become ready: %s: %w", name, why, ErrNotReady)
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil {
		return nil, s.notReady(ctx, name, last)
	}
	return ready, err
}

// waitGone follows Pod from until the API server has removed it (its kubelet saw its
// containers stop), or ctx ends.
func (s *Substrate) waitGone(ctx context.Context, from *corev1.Pod) error {
	return s.until(ctx, s.podWatcher(), from.Name, nil, func(obj runtime.Object, _ watch.EventType) (bool, error) {
		pod, _ := obj.(*corev1.Pod)
		return pod == nil || pod.UID != from.UID, nil
	})
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
// and Unschedulable may clear (a registry comes back, an autoscaler adds a node, a
// volume binds), so they wait for the deadline and are reported in its error.
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
