package admission

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
)

//go:embed reserve.lua
var reserveSource string

// reserveScript decides a charge while tiers reserve shares of the cluster bucket
// (reserve.lua): the client bucket with its soft limit, and a cluster token from the
// tier's reserve, the shared remainder, or an idle tier's lendable reserve.
var reserveScript = redis.NewScript(reserveSource)

// TierKey is tier's reserve key under prefix:
// "{<prefix>:cluster_admission:sandbox_activation}:tier:<tier>", in the cluster key's
// slot like the client keys.
func TierKey(prefix, tier string) string {
	return "{" + ClusterKey(prefix) + "}:tier:" + tier
}

// reservePlan is what the script needs of one tier table, built once per table: the
// keys and packed arguments of each tier's charge, so that a charge builds no key and
// packs no argument but its client's.
type reservePlan struct {
	res    *space.Reservations
	shared bucketArgs
	tiers  map[string]*tierPlan
	// none is the plan of a charge on no reserve: a tier without one, an untiered
	// client, a warm-up.
	none *tierPlan
}

// tierPlan is one tier's side of a charge.
type tierPlan struct {
	// keys are the reserve keys after the shared and client keys: the own reserve
	// (when own) first, then every other reserve; args their packed rates.
	keys []string
	args string
	own  bool
	// knownKey and drawable are the refusal cache's entry for the tier's cluster side:
	// an upper bound of the rate and burst of everything the tier could draw on. The
	// key names the sources too (a digest of their rates and what each lends): the
	// bound a decision leaves holds only while they do (model rule 11), and two tables
	// may split one drawable rate between other sources, under which the old bound is
	// too low.
	knownKey string
	drawable space.Rate
}

// plan returns the plan of res, building it when res is not the last table seen.
func (a *Admitter) plan(res *space.Reservations) *reservePlan {
	if p := a.plans.Load(); p != nil && p.res == res {
		return p
	}
	p := &reservePlan{res: res, shared: argsOf(res.Shared), tiers: map[string]*tierPlan{}}
	build := func(tier string) *tierPlan {
		t := &tierPlan{knownKey: a.clusterKey + "|tier:" + tier, drawable: res.Shared}
		var args []byte
		for _, r := range res.Reserves {
			if r.Tier == tier {
				t.own = true
				t.keys = append([]string{a.tierPrefix + r.Tier}, t.keys...)
				args = append([]byte(argsOf(r.Rate)), args...)
				t.drawable.RefillRPS += r.Rate.RefillRPS
				t.drawable.Burst += r.Rate.Burst
			}
		}
		for _, r := range res.Reserves {
			if r.Tier == tier {
				continue
			}
			t.keys = append(t.keys, a.tierPrefix+r.Tier)
			args = append(args, argsOf(r.Rate)...)
			args = binary.LittleEndian.AppendUint64(args, math.Float64bits(r.Lendable))
			if r.Lendable > 0 {
				t.drawable.RefillRPS += r.Rate.RefillRPS
				t.drawable.Burst += r.Rate.Burst
			}
		}
		t.args = string(args)
		sources := fnv.New64a()
		sources.Write([]byte(p.shared))
		sources.Write(args)
		t.knownKey += "|" + strconv.FormatUint(sources.Sum64(), 36)
		return t
	}
	for _, r := range res.Reserves {
		p.tiers[r.Tier] = build(r.Tier)
	}
	p.none = build("")
	a.plans.Store(p)
	return p
}

// of returns tier's plan.
func (p *reservePlan) of(tier string) *tierPlan {
	if t, ok := p.tiers[tier]; ok {
		return t
	}
	return p.none
}

// reserved is the decision of reserve.lua for charge c under res.
func (a *Admitter) reserved(ctx context.Context, c space.Charge, res *space.Reservations, cost string, sent time.Time) (Decision, error) {
	p := a.plan(res)
	t := p.of(c.Tier)
	warmUp := c.Floor > 0 && c.Rate == nil
	keys := make([]string, 0, 2+len(t.keys))
	keys = append(keys, a.clusterKey)
	// The layout's three bytes lead the packed rates (reserve.lua, ARGV[2]).
	args := make([]byte, 3, 3+48+len(t.args))
	copy(args, "---")
	args = append(args, p.shared...)
	if c.Rate != nil {
		keys = append(keys, a.clientPrefix+string(c.Key))
		args[0] = 'c'
		args = append(args, argsOf(*c.Rate)...)
		if c.Soft != nil {
			args[1] = 's'
			args = append(args, argsOf(*c.Soft)...)
		}
	}
	argv := []any{cost, ""}
	if warmUp {
		// A warm-up draws on the shared remainder alone and reads no reserve.
		argv = append(argv, strconv.FormatInt(c.Floor, 10))
	} else {
		if t.own {
			args[2] = 'o'
		}
		keys = append(keys, t.keys...)
		args = append(args, t.args...)
	}
	argv[1] = string(args)
	v, err := a.run.run(ctx, func(ctx context.Context) (any, error) {
		return a.run.script(ctx, reserveScript, keys, argv...).Text()
	})
	if err != nil {
		return Decision{}, err
	}
	reply := v.(string)
	if len(reply) != 2+9*8 {
		return Decision{}, fmt.Errorf("reserve script: unexpected reply %q", reply)
	}
	d := Decision{
		Admitted:   reply[0] == 1,
		SoftBreach: reply[1] == 1,
		Cluster:    BucketState{Rate: a.cluster, Remaining: double(reply, 18), Refill: micros(double(reply, 26))},
		Drawn:      model.Drawn{Own: double(reply, 42), Shared: double(reply, 50), Borrowed: double(reply, 58)},
		bound:      double(reply, 34),
		redisNow:   double(reply, 66),
	}
	d.Source = d.Drawn.Source()
	if c.Rate != nil {
		d.Client = &BucketState{Rate: *c.Rate, Remaining: double(reply, 2), Refill: micros(double(reply, 10))}
		a.remember(keys[1], *d.Client, sent)
	}
	if !warmUp {
		a.remember(t.knownKey, BucketState{Rate: t.drawable, Remaining: d.bound}, sent)
	}
	if !d.Admitted {
		d.Source = ""
		d.refused()
	}
	return d, nil
}
