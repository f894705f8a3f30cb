package sandbox

import (
	"github.com/space-sandbox/space"
)

// Refused answers a create with the refusal it is known to meet, at once and for
// nothing: no reservation, no lease, no call to Postgres or Redis. It is the path of a
// client flooding over its rate, whose every create would otherwise reserve a row,
// charge, be refused and undo the row.
//
// It refuses only when every step before the charge would let the create through to
// it, read from memory: the shape resolves (a 422 must stay a 422), the pool view knows
// no ready slot of the shape and no target making them (a warm hit costs no budget and
// must never be refused for want of one), and the Charger already knows the charge
// would be refused (a bucket its last decision found too empty for now). The live cap
// and the concurrency cap are not looked at: a create over one of them and over its
// rate may be told either reason. Anything else returns nil, and the create takes the
// usual path, which decides on Postgres and Redis.
func (s *Service) Refused(caller space.Caller, shape space.Shape) error {
	began := s.opts.Now()
	if s.opts.View == nil || !s.opts.View.Cold(shape) {
		return nil
	}
	if _, err := s.opts.Catalog.Resolve(shape); err != nil {
		return nil
	}
	le := s.opts.Charger.Refused(caller.Key, caller.ClientRate, 1)
	if le == nil {
		return nil
	}
	s.metrics.refused("create", le, s.opts.Now().Sub(began))
	return le
}
