package admission

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed batch.lua
var batchDriver string

// batchMark is the line of batch.lua that the decision scripts replace.
const batchMark = "--[[decisions]]--\n"

// batchSource is batch.lua with bucket.lua and reserve.lua spliced in, each the body
// of a function of its KEYS and ARGV: a batch runs each decision through the same
// code, byte for byte, as a call of its own.
var batchSource = spliceBatch(batchDriver, bucketSource, reserveSource)

// batchScript runs several decisions of bucketScript and reserveScript in one call
// (batch.lua); the coalescer sends one when decisions wait together.
var batchScript = redis.NewScript(batchSource)

func spliceBatch(driver, bucket, reserve string) string {
	if strings.Count(driver, batchMark) != 1 {
		panic("admission: batch.lua has no single " + strings.TrimSpace(batchMark))
	}
	decisions := "local function bucket(KEYS, ARGV)\n" + bucket + "\nend\n" +
		"local function reserve(KEYS, ARGV)\n" + reserve + "\nend\n"
	return strings.Replace(driver, batchMark, decisions, 1)
}

// batchKind is the byte naming script in a batch's header, 0 for a script a batch
// does not run (the concurrency limiter's, which go on their own or in a pipeline).
func batchKind(script *redis.Script) byte {
	switch script {
	case bucketScript:
		return 'b'
	case reserveScript:
		return 'r'
	}
	return 0
}

// hashTag is the part of key that Redis Cluster hashes to a slot: what the first
// braces hold, when they hold anything, or the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// scriptCall is one script call of a round trip: a queued call on its own, or the
// batch of several (batchScript), and the calls it answers.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	// of are the queued calls it decides, in order: one for a call on its own.
	of    []*queuedScript
	batch *batchBuilder
}

// batchBuilder gathers the decisions of one hash tag into batch.lua's arguments:
// every key and argument once, every list of them once, and five bytes a decision.
type batchBuilder struct {
	tag                string
	keys, args         interner
	keyLists, argLists lists
	decisions          []byte
}

// interner numbers distinct strings from 1 in the order first seen.
type interner struct {
	all []string
	// at numbers them once there are more than a few; before, a look through all is
	// cheaper than a map.
	at map[string]int
}

func (in *interner) position(s string) int {
	if in.at != nil {
		if i, ok := in.at[s]; ok {
			return i
		}
	} else {
		for i, x := range in.all {
			if x == s {
				return i + 1
			}
		}
	}
	in.all = append(in.all, s)
	i := len(in.all)
	switch {
	case in.at != nil:
		in.at[s] = i
	case i > 8:
		in.at = make(map[string]int, 2*i)
		for j, x := range in.all {
			in.at[x] = j + 1
		}
	}
	return i
}

// lists numbers distinct lists of positions from 1, in batch.lua's header format.
type lists struct {
	n    int
	head []byte
	// starts are where each list's positions begin in head (after its length byte),
	// ends where they end.
	starts, ends []int
}

// of returns the number of the list of the positions in buf, added when new. The
// usual batch names one list of keys and one of arguments, the last one looked at
// first.
func (l *lists) of(buf []byte) int {
	for i := l.n - 1; i >= 0; i-- {
		if string(l.head[l.starts[i]:l.ends[i]]) == string(buf) {
			return i + 1
		}
	}
	l.head = append(l.head, byte(len(buf)/2))
	l.starts = append(l.starts, len(l.head))
	l.head = append(l.head, buf...)
	l.ends = append(l.ends, len(l.head))
	l.n++
	return l.n
}

// add appends q's decision.
func (b *batchBuilder) add(kind byte, q *queuedScript) {
	var scratch [2 * 8]byte
	buf := scratch[:0]
	for _, k := range q.keys {
		buf = binary.LittleEndian.AppendUint16(buf, uint16(b.keys.position(k)))
	}
	keys := b.keyLists.of(buf)
	buf = buf[:0]
	for _, a := range q.args {
		// ARGV[1] is the header: the arguments are numbered from 2.
		buf = binary.LittleEndian.AppendUint16(buf, uint16(1+b.args.position(a.(string))))
	}
	args := b.argLists.of(buf)
	b.decisions = append(b.decisions, kind)
	b.decisions = binary.LittleEndian.AppendUint16(b.decisions, uint16(keys))
	b.decisions = binary.LittleEndian.AppendUint16(b.decisions, uint16(args))
}

// full reports whether one more decision could overflow the header's two-byte
// numbers (it never does within maxBatch calls of at most maxBatchCount keys and
// arguments each; the check keeps it so whatever those become).
func (b *batchBuilder) full() bool {
	limit := maxBatchLength - maxBatchCount
	return len(b.keys.all) > limit || len(b.args.all) > limit || b.keyLists.n > limit || b.argLists.n > limit
}

// arguments are the batch's ARGV: the header, then every argument once.
func (b *batchBuilder) arguments() []any {
	head := make([]byte, 0, 4+len(b.keyLists.head)+len(b.argLists.head)+len(b.decisions))
	head = binary.LittleEndian.AppendUint16(head, uint16(b.keyLists.n))
	head = append(head, b.keyLists.head...)
	head = binary.LittleEndian.AppendUint16(head, uint16(b.argLists.n))
	head = append(head, b.argLists.head...)
	head = append(head, b.decisions...)
	argv := make([]any, 1, 1+len(b.args.all))
	argv[0] = string(head)
	for _, a := range b.args.all {
		argv = append(argv, a)
	}
	return argv
}

// Bounds of batch.lua's header: a list's length is one byte, any other number two.
const (
	maxBatchCount  = 255
	maxBatchLength = 1<<16 - 1
)

// batchable reports whether q can ride in a batch, and under which hash tag: a
// decision script with every key under one tag (a call whose keys span slots fails
// alone, as it always has) and string arguments, no more keys or arguments than a
// list holds.
func batchable(q *queuedScript) (kind byte, tag string, ok bool) {
	kind = batchKind(q.script)
	if kind == 0 || len(q.keys) == 0 || len(q.keys) > maxBatchCount || len(q.args) > maxBatchCount {
		return 0, "", false
	}
	tag = hashTag(q.keys[0])
	for _, k := range q.keys[1:] {
		if hashTag(k) != tag {
			return 0, "", false
		}
	}
	for _, a := range q.args {
		if _, isString := a.(string); !isString {
			return 0, "", false
		}
	}
	return kind, tag, true
}

// planCalls turns the live calls of a round trip into its script calls, in the order
// of each group's first call: the decisions sharing a hash tag as one batch (in a
// Redis Cluster every key of an Admitter's decision is in its cluster key's slot, the
// client and tier keys carrying the cluster key as their hash tag, so all of an
// Admitter's decisions share a call; a Limiter's keys, each in a slot of its own, go
// in batches of their own), any other call on its own. A group of one is a call on its
// own, as it would be without batches. A batch keeps its calls' order: each decision
// reads what the ones before it wrote.
func planCalls(live []*queuedScript) []*scriptCall {
	calls := make([]*scriptCall, 0, 1)
	var groups []*scriptCall
	for _, q := range live {
		kind, tag, ok := batchable(q)
		if !ok {
			calls = append(calls, &scriptCall{script: q.script, keys: q.keys, args: q.args, of: []*queuedScript{q}})
			continue
		}
		var g *scriptCall
		for i := len(groups) - 1; i >= 0; i-- {
			if groups[i].batch.tag == tag {
				g = groups[i]
				break
			}
		}
		if g == nil || g.batch.full() {
			g = &scriptCall{batch: &batchBuilder{tag: tag}}
			groups = append(groups, g)
			calls = append(calls, g)
		}
		g.of = append(g.of, q)
		g.batch.add(kind, q)
	}
	for _, c := range calls {
		switch {
		case c.batch == nil:
		case len(c.of) == 1:
			q := c.of[0]
			c.script, c.keys, c.args, c.batch = q.script, q.keys, q.args, nil
		default:
			c.script, c.keys, c.args = batchScript, c.batch.keys.all, c.batch.arguments()
		}
	}
	return calls
}

// answer gives each call c decided its result: c's own, or its element of the batch's
// reply; an error of the whole call is every decision's.
func (c *scriptCall) answer() {
	if c.batch == nil {
		c.of[0].cmd = c.cmd
		return
	}
	fail := func(err error) {
		for _, q := range c.of {
			q.cmd = redis.NewCmd(q.ctx)
			q.cmd.SetErr(err)
		}
	}
	if err := c.cmd.Err(); err != nil {
		fail(err)
		return
	}
	replies, ok := c.cmd.Val().([]any)
	if !ok || len(replies) != len(c.of) {
		fail(fmt.Errorf("batch script: %d replies for %d decisions: %v", len(replies), len(c.of), c.cmd.Val()))
		return
	}
	for i, q := range c.of {
		cmd := redis.NewCmd(q.ctx)
		switch r := replies[i].(type) {
		case string:
			cmd.SetVal(r)
		case error:
			cmd.SetErr(r)
		default:
			cmd.SetErr(fmt.Errorf("batch script: unexpected reply %v", r))
		}
		q.cmd = cmd
	}
}

// sendCalls sends a round trip's calls under ctx: one call as script.Run would
// (EVALSHA, then EVAL when the server does not hold the script), several as one
// pipeline, whose calls refused NOSCRIPT go again with their source.
func sendCalls(ctx context.Context, rdb redis.UniversalClient, calls []*scriptCall) {
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = c.script.Run(ctx, rdb, c.keys, c.args...)
		return
	}
	pipe := rdb.Pipeline()
	for _, c := range calls {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx)
	// A server that lost its scripts (a restart, a failover, SCRIPT FLUSH) refused
	// them without running any: they are sent again with their source.
	var again redis.Pipeliner
	for _, c := range calls {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			if again == nil {
				again = rdb.Pipeline()
			}
			c.cmd = c.script.Eval(ctx, again, c.keys, c.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
}
