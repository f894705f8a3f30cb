package sandbox

import (
	"context"
	"errors"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

// Pause snapshots caller's running sandbox and stops it; a paused sandbox no longer
// holds a live-sandbox place.
func (s *Service) Pause(ctx context.Context, client space.ClientID, id string) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	sb, err := transition(ctx, s.db, id, client, space.StatePausing, space.StateRunning)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.detached(ctx)
	defer cancel()
	snap, err := s.opts.Substrate.Snapshot(ctx, sb.SubstrateRef)
	if err != nil {
		msg := err.Error()
		if _, serr := setState(ctx, s.db, id, stateChange{State: space.StateRunning, LastError: &msg, From: pausing}); ignoreMoved(serr) != nil {
			s.logger.ErrorContext(ctx, "record failed pause", "sandbox", id, "err", serr)
		}
		if errors.Is(err, substrate.ErrUnsupported) {
			return nil, &space.Error{Code: space.EUNPROCESSABLE, Message: "this substrate cannot snapshot sandboxes", Err: err}
		}
		return nil, &space.Error{Code: space.EUNAVAILABLE, Message: "the substrate failed to snapshot sandbox " + id + "; it is still running", Err: err}
	}
	sb, err = setState(ctx, s.db, id, stateChange{State: space.StatePaused, SnapshotRef: snap, ClearRef: true, From: pausing})
	var moved *movedError
	if errors.As(err, &moved) {
		return nil, space.Errorf(space.ECONFLICT, "sandbox %s became %s while it was pausing", id, moved.cur.State)
	}
	return sb, err
}

var pausing = []space.SandboxState{space.StatePausing}

// detached returns a context for substrate work that must finish even if the caller
// hangs up, bounded by the substrate's own timeout.
func (s *Service) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.opts.Substrate.Timeout())
}

// Delete stops caller's sandbox and marks it terminated.
//
// A sandbox still starting, restoring or pausing is terminated at once too, and
// Delete returns teardown true: whatever the substrate holds for it is stopped now,
// and an activation still in flight stops what it started when it finds the sandbox
// gone (the reconciler's sweep stops anything left). It is never refused for being
// mid-transition: a transition that never ends must not make a sandbox undeletable.
func (s *Service) Delete(ctx context.Context, client space.ClientID, id string) (teardown bool, err error) {
	if err := CheckID(id); err != nil {
		return false, err
	}
	sb, err := getSandbox(ctx, s.db, id, client, false)
	if err != nil {
		return false, err
	}
	if sb.State == space.StateTerminated {
		return false, nil
	}
	teardown = sb.State == space.StateStarting || sb.State == space.StateRestoring || sb.State == space.StatePausing
	sb, err = transition(ctx, s.db, id, client, space.StateTerminated, space.StateRunning, space.StatePaused,
		space.StateFailed, space.StateStarting, space.StateRestoring, space.StatePausing)
	if err != nil {
		return false, err
	}
	ctx, cancel := s.detached(ctx)
	defer cancel()
	refs := map[string]bool{}
	if sb.SubstrateRef != "" {
		refs[sb.SubstrateRef] = true
	}
	// What the substrate holds for the sandbox: what a transition was making, and
	// what keeps its state (a volume, its snapshots), which goes with it.
	found, err := s.opts.Substrate.Find(ctx, id)
	if err != nil {
		s.logger.WarnContext(ctx, "find what the substrate holds for a deleted sandbox; the reconciler's sweep stops it", "sandbox", id, "err", err)
	}
	if teardown {
		for _, r := range found.Resources {
			refs[r.Ref] = true
		}
	}
	for _, r := range found.Storage {
		refs[r.Ref] = true
	}
	for ref := range refs {
		if err := s.opts.Substrate.Stop(ctx, ref); err != nil {
			// The sandbox is terminated for its client; the reconciler's sweep stops
			// what is left of it.
			s.logger.ErrorContext(ctx, "stop terminated sandbox", "sandbox", id, "ref", ref, "err", err)
		}
	}
	return teardown, nil
}

// Get returns caller's sandbox id; another client's is ENOTFOUND.
func (s *Service) Get(ctx context.Context, client space.ClientID, id string) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	sb, err := getSandbox(ctx, s.db, id, client, false)
	return sb, err
}

// Page size bounds for List.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

// List returns one page of caller's sandboxes, newest first.
func (s *Service) List(ctx context.Context, client space.ClientID, limit int, pageToken string) (*Page, error) {
	if limit == 0 {
		limit = DefaultPageSize
	}
	if limit < 1 || limit > MaxPageSize {
		return nil, space.FieldError(space.EINVALID, "limit", "must be between 1 and %d", MaxPageSize)
	}
	after, err := decodePageToken(pageToken)
	if err != nil {
		return nil, err
	}
	page, err := listSandboxes(ctx, s.db, client, limit, after)
	return page, err
}
