package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

// Pause snapshots caller's running sandbox and stops it, for its owner; a paused
// sandbox no longer holds a live-sandbox place. Past the caller's cap of paused
// sandboxes it is refused (429 paused_sandbox_cap).
func (s *Service) Pause(ctx context.Context, caller space.Caller, id string) (*space.Sandbox, error) {
	return s.pause(ctx, caller, id, space.ReasonClient, dueNow)
}

// pause pauses sandbox id of caller for reason: under caller's budget key's lock, its
// paused sandboxes are counted against its cap and the sandbox moves to pausing, with
// the end of its retention, when it is running and (for the lifecycle) its action is
// still due; then it is snapshotted and stopped.
func (s *Service) pause(ctx context.Context, caller space.Caller, id, reason string, due dueGuard) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	var sb *space.Sandbox
	err := s.db.Tx(ctx, func(tx pgx.Tx) error {
		if err := checkPausedCap(ctx, tx, caller.Key, caller.Lifecycle.PausedSandboxes); err != nil {
			return err
		}
		retention := caller.Lifecycle.PausedRetention
		var err error
		sb, err = transitionDue(ctx, tx, id, caller.ID, space.StatePausing, stamp{Reason: reason, Retention: &retention}, due, space.StateRunning)
		return err
	})
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
	return s.terminate(ctx, client, id, space.ReasonClient, dueNow, space.StateRunning, space.StatePaused,
		space.StateFailed, space.StateStarting, space.StateRestoring, space.StatePausing)
}

// terminate ends sandbox id of client for reason while it is in one of the states from
// and (for the lifecycle) its action is still due: the end is written first, then
// what the substrate holds for it is stopped (docs/design.md, Recovery).
func (s *Service) terminate(ctx context.Context, client space.ClientID, id, reason string, due dueGuard, from ...space.SandboxState) (teardown bool, err error) {
	if err := CheckID(id); err != nil {
		return false, err
	}
	sb, err := getSandbox(ctx, s.db, id, client, false)
	if err != nil {
		return false, err
	}
	if sb.State == space.StateTerminated {
		if due != dueNow {
			return false, conflict(sb, space.StateTerminated, from)
		}
		return false, nil
	}
	teardown = sb.State == space.StateStarting || sb.State == space.StateRestoring || sb.State == space.StatePausing
	sb, err = transitionDue(ctx, s.db, id, client, space.StateTerminated, stamp{Reason: reason}, due, from...)
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

// Keepalive records an activity of caller's running sandbox id, as a gateway in front
// of it says it is in use: its idle action is due the caller's idle timeout from now,
// or timeout from now when that is later; never past its max lifetime (a timeout
// that would be is a 422). A client without an idle timeout has no idle action to
// put off: the sandbox is returned as it is.
func (s *Service) Keepalive(ctx context.Context, caller space.Caller, id string, timeout time.Duration) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	if timeout < 0 {
		return nil, space.FieldError(space.EINVALID, "timeout_seconds", "must be a whole number of seconds >= 1")
	}
	sb, err := getSandbox(ctx, s.db, id, caller.ID, false)
	if err != nil {
		return nil, err
	}
	if sb.State != space.StateRunning {
		return nil, space.Errorf(space.ECONFLICT, "sandbox %s is %s; only a running sandbox can be kept alive", id, sb.State)
	}
	m := activity(caller.Lifecycle)
	if m.Action != "" && timeout > *m.Active {
		// Only a timeout that puts the idle action off further than the idle timeout
		// does asks for anything, and that must end within the max lifetime.
		if sb.ExpiresAt != nil && s.opts.Now().Add(timeout).After(*sb.ExpiresAt) {
			return nil, space.FieldError(space.EUNPROCESSABLE, "timeout_seconds",
				"keeps the sandbox past its max lifetime, which ends it at %s", sb.ExpiresAt.UTC().Format(time.RFC3339))
		}
		m.Active = &timeout
	}
	return transitionDue(ctx, s.db, id, caller.ID, space.StateRunning, m, dueNow, space.StateRunning)
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
