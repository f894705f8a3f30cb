package admission

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
	"github.com/space-sandbox/space/internal/logs"
)

// outage is this replica's side of a Redis outage: share is its copy of the cluster
// side as spent while Redis cannot decide (spendShare); replicas is Options.Replicas;
// learnt counts the decisions Redis made, so that a copy of the untiered cluster
// bucket starts again from what Redis said last once it has spoken since.
type outage struct {
	share    outageShare
	replicas func() int
	learnt   atomic.Uint64
}

// failed applies the failure mode to a Redis error. Failing open, the charge is
// decided by this replica alone (spendLocally): admitted and counted as an error, or
// refused and counted as a refusal from memory.
func (a *Admitter) failed(c space.Charge, err error) (Decision, error) {
	a.errLog.log(err, "client", string(c.Key), "fail_closed", a.failClosed && !a.shadow)
	if a.failClosed && !a.shadow {
		a.metrics.errored(c)
		return Decision{}, fmt.Errorf("admit: %w", unavailable(err))
	}
	if !a.shadow {
		if d, refused := a.spendLocally(c); refused {
			a.metrics.count(decisionRejected, d.Bucket, c.Tier)
			a.metrics.refusedLocally(d.Bucket)
			return d, nil
		}
	}
	a.metrics.errored(c)
	d := Decision{Admitted: true, FailedOpen: true, Cluster: BucketState{Rate: a.cluster}}
	if c.Rate != nil {
		d.Client = &BucketState{Rate: *c.Rate}
	}
	return d, nil
}

// spendLocally decides a charge that Redis could not decide, failing open: the client
// bucket as this replica knows it (its last decision's state and the refill since, as
// CachedRefusal reads it; a bucket it never learnt, or learnt under another rate, as
// full) must hold the cost, and the cluster side must give it from this replica's
// share (spendShare); the cost is then spent from both here, or from neither. It
// returns the refusal, with refused true, when one is short.
//
// Failing open is for an outage of the budget store: it must not stop activations.
// It must not stop budgets either. Before this, every charge was admitted while Redis
// failed, and a flood over its rate made that happen by itself: a replica loaded
// past its Redis timeout by the flood's first second (the load generator opening
// hundreds of connections, every create in flight queued behind them) timed out
// three calls in a row, the breaker opened, and for the breaker's second the flooder
// was admitted about 1,300 times instead of 50 (make bench, flood scenario). Now a
// replica that cannot ask Redis admits what its own view allows: a client keeps its
// rate, a flooder gets its rate, and the n replicas that Options.Replicas counts
// admit about the cluster bucket's burst and rate between them, tiers and reserves
// included (model rule 12). A client's bucket is not shared out: a client's creates
// do not spread evenly over the replicas (a keep-alive connection stays on one), and
// a client sent to one replica would get a nth of its rate there; it may get up to n
// times its rate across the replicas, within the cluster's. What is spent here is
// this replica's alone: the first decision Redis makes again replaces the client's
// state with the bucket's real one.
//
// The charges CachedRefusal let through hold their cost against the same state; it
// is not counted here, since each of them comes here too and spends for itself.
func (a *Admitter) spendLocally(c space.Charge) (Decision, bool) {
	now := a.now()
	cost := float64(c.Cost)
	d := Decision{Cluster: BucketState{Rate: a.cluster}}
	var clientKey string
	if c.Rate != nil && c.Key != "" {
		clientKey = a.clientPrefix + string(c.Key)
		left, ok := a.spend(clientKey, *c.Rate, cost, cost, now)
		d.Client = &BucketState{Rate: *c.Rate, Remaining: left}
		if !ok {
			d.Bucket, d.RetryAfter = space.BucketClientActivation, micros((cost-left)/c.Rate.RefillRPS*1e6)
			d.Client.Refill = d.RetryAfter
			return d, true
		}
	}
	share := a.spendShare(c, now)
	d.Cluster.Remaining = share.Cluster.Remaining
	d.Drawn = share.Drawn
	if !share.Admitted {
		if clientKey != "" {
			// Both or neither: the client's tokens back.
			d.Client.Remaining, _ = a.spend(clientKey, *c.Rate, 0, -cost, now)
		}
		d.Bucket, d.RetryAfter = space.BucketClusterActivation, micros(share.RetryAfter)
		d.Cluster.Refill = d.RetryAfter
		return d, true
	}
	return d, false
}

// outageShare is this replica's copy of the cluster side while Redis cannot decide:
// the model's state of the cluster bucket (or the shared remainder and the reserves)
// as spent here, and how many decisions Redis had made when it was last spent.
type outageShare struct {
	mu     sync.Mutex
	state  *model.State
	learnt uint64
}

// spendShare is the cluster side of a charge decided here (spendLocally), by the
// model's rule 12: the tier table in force decides it on this replica's copy of the
// cluster side, its cost taken n times, n the replicas that Options.Replicas counts,
// so that n replicas, each spending its own copy, take the cluster budget about once
// between them. A cost n times over larger than a copy can give is admitted from a
// full copy, into debt, so that more replicas than tokens still admit a nth of the
// rate each.
//
// The copy starts full. Without reserves, a copy of the cluster bucket starts again
// from what this replica last learnt of it whenever Redis has decided since the copy
// was last spent (an outage after a recovery starts from Redis's word, not from the
// last outage's copy); with reserves, the replica knows no bucket apart, and the copy
// goes on from what it spent, refilling as the rules say. The copy is kept apart from
// the state CachedRefusal reads, which stays an upper bound of the buckets (what this
// replica spent n times over is a guess at what the others spent, not a bound), so
// that a refusal from memory stays one Redis would make once it decides again.
func (a *Admitter) spendShare(c space.Charge, now time.Time) model.Decision {
	var res *space.Reservations
	if a.reservations != nil {
		res = a.reservations()
	}
	n := 1
	if a.replicas != nil {
		n = max(a.replicas(), 1)
	}
	at := micro(now)
	s := &a.share
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == nil {
		s.state = model.NewState()
	}
	if learnt := a.learnt.Load(); learnt != s.learnt && res == nil {
		s.state = model.NewState()
		if k := a.cell(a.clusterKey).Load(); k != nil && k.Rate == a.cluster {
			r := model.RateOf(a.cluster)
			kat := micro(k.At)
			s.state.Cluster = model.Bucket{Written: true, Tokens: k.Tokens, At: kat, Full: model.FullAt(k.Tokens, r, kat)}
		}
	}
	s.learnt = a.learnt.Load()
	out := model.Outage{State: s.state, Replicas: n}
	return out.Decide(model.Limits{Cluster: a.cluster, Reservations: res}, c, at)
}

// micro is t in microseconds, as the model reads time.
func micro(t time.Time) float64 { return float64(t.UnixMicro()) }

// spend takes cost from the bucket under key as this replica knows it at now, if it
// holds need, and records what is left as the replica's state of the bucket. It
// returns the tokens left (or held, when short) and whether it took them. A negative
// cost gives tokens back.
func (a *Admitter) spend(key string, rate space.Rate, need, cost float64, now time.Time) (float64, bool) {
	p := a.cell(key)
	for {
		k := p.Load()
		tokens := float64(rate.Burst)
		if k != nil && k.Rate == rate {
			tokens = k.upTo(now)
		}
		if tokens < need {
			return tokens, false
		}
		left := math.Min(tokens-cost, float64(rate.Burst))
		if p.CompareAndSwap(k, &knownBucket{Rate: rate, Tokens: left, At: now}) {
			return left, true
		}
	}
}

// throttledLog logs a repeated failure at most once every 10 seconds, with the
// number of failures it did not log, so that an outage under load does not flood the
// logs.
type throttledLog struct {
	logger   *slog.Logger
	msg      string
	throttle *logs.Throttle
}

func newThrottledLog(logger *slog.Logger, msg string) *throttledLog {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &throttledLog{logger: logger, msg: msg, throttle: logs.NewThrottle(10*time.Second, nil)}
}

func (l *throttledLog) log(err error, attrs ...any) {
	if ok, held := l.throttle.Allow(""); ok {
		l.logger.Warn(l.msg, append(attrs, "err", err.Error(), "suppressed", held)...)
	}
}
