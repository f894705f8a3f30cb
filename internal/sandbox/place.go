package sandbox

import (
	"context"
	"sync"

	"github.com/space-sandbox/space"
)

// Places is the concurrency cap on a budget key's requests in flight, as the API
// takes it for a create (*admission.ConcurrencyLimiter, behind the API's count of the
// requests at work): a cap of 0 is none; over the cap is a *space.LimitError.
type Places interface {
	Acquire(ctx context.Context, key space.ClientKey, cap int) (space.Lease, error)
	// Alongside reports whether a request may take its place alongside other work of
	// its own rather than before it, counting it until done is called once its
	// Acquire has returned (see admission.ConcurrencyLimiter.Alongside).
	Alongside(key space.ClientKey, cap int) (done func(), ok bool)
}

// place is a create's concurrency place: taken before its booking, or being taken
// alongside it. A nil place is none.
type place struct {
	taking chan placeTaken // nil when taken before
	once   sync.Once
	placeTaken
}

type placeTaken struct {
	lease space.Lease
	err   error
}

// wait returns the place once it is taken, or its refusal.
func (p *place) wait() (space.Lease, error) {
	if p == nil {
		return space.Lease{}, nil
	}
	if p.taking != nil {
		p.once.Do(func() { p.placeTaken = <-p.taking })
	}
	return p.lease, p.err
}

// takePlace takes caller's concurrency place from places (none when places is nil).
//
// A create that may go alongside (a plain synchronous create of a shape the pool view
// knows no ready slot of: the booking it runs beside is all but certain to claim
// none) takes it alongside its booking when places allows (Places.Alongside: the
// key was far from its cap a moment ago): the place's round trip to Redis runs while
// the booking's to Postgres does, instead of before it, and the activation waits
// for it once booked, before anything is adopted, charged or started (placed). Any
// other create takes it now, and a refusal is its answer before anything is booked.
func (s *Service) takePlace(ctx context.Context, caller space.Caller, places Places, mayGoAlongside bool) (*place, error) {
	if places == nil {
		return nil, nil
	}
	if mayGoAlongside {
		if placed, ok := places.Alongside(caller.Key, caller.Concurrency); ok {
			p := &place{taking: make(chan placeTaken, 1)}
			go func() {
				defer placed()
				l, err := places.Acquire(ctx, caller.Key, caller.Concurrency)
				p.taking <- placeTaken{l, err}
			}()
			return p, nil
		}
	}
	l, err := places.Acquire(ctx, caller.Key, caller.Concurrency)
	if err != nil {
		return nil, err
	}
	return &place{placeTaken: placeTaken{lease: l}}, nil
}
