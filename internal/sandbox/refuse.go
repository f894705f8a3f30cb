package sandbox

import (
	"github.com/space-sandbox/space"
)

// Refused answers a create with the refusal it is known to meet, at once and for
// nothing: no reservation, no lease, no call to Postgres or Redis. It is the path of a
// client flooding over its rate, whose every create would otherwise reserve a row,
// charge, be refused and undo the row.
//
// A create that can never pass (an unknown template, a shape over a cap, a cost
// above the client bucket's burst) is answered with its 422 first, before any
// refusal: a 429 would have its caller wait and retry for what no wait can give.
//
// Otherwise it refuses only when every step before the charge would let the create
// through to it, read from memory: the pool view knows no ready slot of the shape and
// no target making them (a warm hit costs no budget and must never be refused for want
// of one), and the Charger already knows the charge of the template's cost would be
// refused (a bucket its last decision found too empty for now). The live cap and the
// concurrency cap are not looked at: a create over one of them and over its rate may
// be told either reason. Anything else returns nil, and the create takes the usual
// path, which decides on Postgres and Redis.
func (s *Service) Refused(caller space.Caller, shape space.Shape) error {
	began := s.opts.Now()
	tmpl, err := s.resolve(caller, shape)
	if err != nil {
		s.metrics.refused("create", err, s.opts.Now().Sub(began))
		return err
	}
	if s.opts.View == nil || !s.opts.View.Cold(shape) {
		return nil
	}
	le := s.opts.Charger.Refused(caller.Key, caller.ClientRate, tmpl.ActivationCost())
	if le == nil {
		return nil
	}
	s.metrics.refused("create", le, s.opts.Now().Sub(began))
	return le
}
