package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space"
)

// refuseEarly answers a create with the charge's refusal without reserving a
// sandbox row, when this replica has just seen the client's charges refused and the
// create would reach the charge: under a flood of creates from a client over its
// rate, the usual path reserves a row under the client's lock and deletes it again
// for every refused create (seven Postgres round trips, serialised per client),
// where this takes one read and one Redis call.
//
// It runs the steps of DESIGN.md §2 in their order, reading instead of reserving:
// the live cap and the warm pool (one round trip, no lock), the cold shape, then the
// Refuser's decision on Redis time. Only when each of them would let the create
// through to the charge and the charge is refused does it answer (the refusal it
// returns is that of the usual path, counted the same way); in every other case
// (over the cap, a ready slot, an unknown shape, a charge that would now pass, an
// error) it returns nil and the usual path decides, under the lock. A refusal
// answered here leaves nothing behind, as the usual path's undo would.
func (s *Service) refuseEarly(ctx context.Context, caller space.Caller, shape space.Shape) error {
	refuser, ok := s.opts.Charger.(Refuser)
	if !ok || !s.knownRefused(caller.Key) {
		return nil
	}
	if _, err := s.opts.Catalog.Resolve(shape); err != nil {
		return nil
	}
	if through, err := s.wouldReachCharge(ctx, caller, shape); err != nil || !through {
		return nil
	}
	sent := time.Now()
	le := refuser.Refuse(ctx, caller.Key, caller.ClientRate)
	if le == nil {
		s.noteCharge(caller.Key, sent, nil)
		return nil
	}
	s.noteCharge(caller.Key, sent, le)
	s.opts.Pool.CountMiss()
	return le
}

// wouldReachCharge reads, in one round trip and without the client's lock, whether a
// create of shape by caller would pass the live cap and miss the warm pool now.
func (s *Service) wouldReachCharge(ctx context.Context, caller space.Caller, shape space.Shape) (bool, error) {
	var b pgx.Batch
	var live int
	if caller.LiveSandboxes > 0 {
		queueLiveCount(&b, caller.Key, caller.LiveSandboxes, &live)
	}
	var ready bool
	s.opts.Pool.QueueReady(&b, shape, &ready)
	if err := s.opts.DB.SendBatch(ctx, &b).Close(); err != nil {
		return false, err
	}
	return !ready && (caller.LiveSandboxes <= 0 || live < caller.LiveSandboxes), nil
}

// maxRefusedFor bounds how long one refusal routes a client's creates to
// refuseEarly: a bucket that never refills reports a refill centuries away.
const maxRefusedFor = time.Hour

// noteCharge records a charge's outcome for refuseEarly: a refusal by an activation
// bucket marks the client refused until its refill time, counted from sent (before
// the charge was sent, so never later than Redis's own refill); anything else clears
// the mark.
func (s *Service) noteCharge(client space.ClientKey, sent time.Time, err error) {
	var le *space.LimitError
	refused := errors.As(err, &le) &&
		(le.Bucket == space.BucketClientActivation || le.Bucket == space.BucketClusterActivation)
	v, ok := s.refused.Load(client)
	if !refused {
		if ok {
			v.(*atomic.Int64).Store(0)
		}
		return
	}
	until := int64(sent.Sub(s.epoch) + min(le.RetryAfter, maxRefusedFor))
	if !ok {
		v, _ = s.refused.LoadOrStore(client, &atomic.Int64{})
	}
	v.(*atomic.Int64).Store(until)
}

// knownRefused reports whether client's charges are known to fail now.
func (s *Service) knownRefused(client space.ClientKey) bool {
	v, ok := s.refused.Load(client)
	return ok && int64(time.Since(s.epoch)) < v.(*atomic.Int64).Load()
}
