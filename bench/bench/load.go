package bench

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// identityHeader is the header that says who sends a stream of client's creates: its
// API key's Authorization when it has one (api_key mode), or X-Client-ID, which a
// server in trusted_header mode believes from loopback.
func identityHeader(client, key string) (name, value string) {
	if key != "" {
		return "Authorization", "Bearer " + key
	}
	return "X-Client-ID", client
}

// load is one stream of creates from the load generator (the vegeta library, in this
// process: it shares the machine's two cores with the servers, Postgres and Redis).
type load struct {
	Name   string
	URL    string // the server's public base URL
	Client string // X-Client-ID (trusted_header mode), and the stream's name in the server's log
	// Key, when set, is Client's API key, sent as its Authorization (api_key mode)
	// instead of X-Client-ID (identityHeader).
	Key string `json:",omitempty"`
	// Clients, when not empty, replaces Client: request i is sent as Clients[i mod
	// len(Clients)], a stream spread over many budget keys.
	Clients []string
	Body    string // the create body
	// Rate > 0 sends that many requests per second whatever the answers take (open
	// loop); 0 runs Workers connections back to back (closed loop), which measures
	// what the server sustains.
	Rate     int
	Workers  int
	Duration time.Duration
	// MaxRequests > 0 stops the stream after that many requests.
	MaxRequests int
	// Conns > 0 holds the open loop to that many connections, as wrk2 -c does: a
	// request sent while all are busy waits for one, its wait counted in its latency.
	// 0 lets vegeta open a connection for every request that finds none idle, which
	// under a stall turns into hundreds of new connections (accepts, goroutines and
	// buffers on the server) that feed the stall.
	Conns int
	// Raw sends it with runRaw, not vegeta: an open loop at Rate over Conns
	// connections for a fraction of vegeta's CPU (the fixed flood's generator).
	Raw bool
	// Slow > 0 makes the stream a slowloris of that many connections instead
	// (runSlowloris): it sends no request whole, and runs until its process's
	// standard input is closed (startSlowloris).
	Slow int `json:",omitempty"`
	// Yield runs the stream's process (runApart) at the lowest CPU priority
	// (generatorCommand): a flood beside a client whose latency is measured.
	Yield bool `json:"-"`
}

// loadResult is what one stream saw. Outcomes are "201", "201 warm", "429 <bucket>",
// other codes as numbers, and "error" for a request that got no answer.
type loadResult struct {
	Name     string
	Requests int
	Elapsed  time.Duration // first request sent to last answer received
	// First is when the first request was sent (the wall clock, which two streams in
	// processes of their own share).
	First     time.Time
	Outcomes  map[string]int
	latencies map[string][]time.Duration
	all       []time.Duration
	// answers are the answers in the order they came, each with when its request was
	// due (from the first), how long after that it was sent, and its latency (from
	// when it was due).
	answers []answer
	// Unsent are the requests a raw stream could not send by its end (runRaw).
	Unsent int
}

type answer struct {
	outcome           string
	at, wait, latency time.Duration
}

func newLoadResult(name string) *loadResult {
	return &loadResult{Name: name, Outcomes: map[string]int{}, latencies: map[string][]time.Duration{}}
}

// add counts one answer to a request sent when it was due.
func (r *loadResult) add(outcome string, at, latency time.Duration) {
	r.addSent(outcome, at, 0, latency)
}

// addSent counts one answer to a request due at at, sent wait later.
func (r *loadResult) addSent(outcome string, at, wait, latency time.Duration) {
	r.Requests++
	r.Outcomes[outcome]++
	r.latencies[outcome] = append(r.latencies[outcome], latency)
	r.all = append(r.all, latency)
	r.answers = append(r.answers, answer{outcome: outcome, at: at, wait: wait, latency: latency})
}

// sentWithin is the number of requests sent in [from, to) after the stream's first
// was due: what the stream offered the server then.
func (r *loadResult) sentWithin(from, to time.Duration) int {
	n := 0
	for _, a := range r.answers {
		if t := a.at + a.wait; t >= from && t < to && a.outcome != "error" {
			n++
		}
	}
	return n
}

// answeredWithin is the number of answers whose outcome starts with prefix ("" for
// any answer: every status, no "error") received in [from, to) after the stream's
// first request was due.
func (r *loadResult) answeredWithin(prefix string, from, to time.Duration) int {
	n := 0
	for _, a := range r.answers {
		if t := a.at + a.latency; t >= from && t < to && a.outcome != "error" && strings.HasPrefix(a.outcome, prefix) {
			n++
		}
	}
	return n
}

// latencyWithin is the p-th percentile latency of the requests sent in [from, to)
// after the stream's first (to 0: to its end).
func (r *loadResult) latencyWithin(from, to time.Duration, p float64) time.Duration {
	var ls []time.Duration
	for _, a := range r.within(from, to) {
		ls = append(ls, a.latency)
	}
	return percentile(ls, p)
}

// countWithin is the number of requests sent in [from, to) after the stream's first
// (to 0: to its end).
func (r *loadResult) countWithin(from, to time.Duration) int { return len(r.within(from, to)) }

// within are the answers to the requests sent in [from, to) after the stream's first
// (to 0: to its end).
func (r *loadResult) within(from, to time.Duration) []answer {
	var out []answer
	for _, a := range r.answers {
		if a.at >= from && (to == 0 || a.at < to) {
			out = append(out, a)
		}
	}
	return out
}

// rps is the rate of answers with the given outcome prefix ("" for all).
func (r *loadResult) rps(prefix string) float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.count(prefix)) / r.Elapsed.Seconds()
}

// count is the number of answers whose outcome starts with prefix ("" for all).
func (r *loadResult) count(prefix string) int {
	n := 0
	for k, v := range r.Outcomes {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			n += v
		}
	}
	return n
}

// latency is the p-th percentile latency of answers whose outcome starts with prefix.
func (r *loadResult) latency(prefix string, p float64) time.Duration {
	if prefix == "" {
		return percentile(r.all, p)
	}
	var ls []time.Duration
	for k, v := range r.latencies {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			ls = append(ls, v...)
		}
	}
	return percentile(ls, p)
}

// run sends the stream and classifies every answer.
func (l load) run(ctx context.Context) *loadResult {
	opts := []func(*vegeta.Attacker){vegeta.Timeout(30 * time.Second), vegeta.KeepAlive(true), vegeta.Redirects(vegeta.NoFollow)}
	pacer := vegeta.Pacer(vegeta.Rate{Freq: l.Rate, Per: time.Second})
	if l.Conns > 0 {
		opts = append(opts, vegeta.Workers(uint64(l.Conns)), vegeta.Connections(l.Conns), vegeta.MaxConnections(l.Conns))
	}
	if l.Rate <= 0 {
		w := uint64(max(l.Workers, 1))
		opts = append(opts, vegeta.Workers(w), vegeta.MaxWorkers(w), vegeta.Connections(int(w)))
		pacer = vegeta.Rate{Freq: 0}
	}
	atk := vegeta.NewAttacker(opts...)
	name, value := identityHeader(l.Client, l.Key)
	header := http.Header{"Content-Type": {"application/json"}, name: {value}}
	body := []byte(l.Body)
	var sent atomic.Int64
	targeter := func(t *vegeta.Target) error {
		n := sent.Add(1)
		if l.MaxRequests > 0 && n > int64(l.MaxRequests) {
			return vegeta.ErrNoTargets
		}
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, l.URL+"/v1/sandboxes", body, header
		if len(l.Clients) > 0 {
			t.Header = http.Header{"Content-Type": header["Content-Type"], "X-Client-ID": {l.Clients[(n-1)%int64(len(l.Clients))]}}
		}
		return nil
	}
	type raw struct {
		outcome string
		sent    time.Time
		latency time.Duration
	}
	var raws []raw
	var first, last time.Time
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	for r := range atk.Attack(targeter, pacer, l.Duration, l.Name) {
		if r.Code == 0 && r.Error == vegeta.ErrNoTargets.Error() {
			continue
		}
		raws = append(raws, raw{outcome: classify(r), sent: r.Timestamp, latency: r.Latency})
		if first.IsZero() || r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if end := r.End(); end.After(last) {
			last = end
		}
	}
	res := newLoadResult(l.Name)
	res.Elapsed, res.First = last.Sub(first), first
	for _, r := range raws {
		res.add(r.outcome, r.sent.Sub(first), r.latency)
	}
	return res
}

var (
	warmTrue    = []byte(`"warm":true`)
	bucketName  = []byte(`"bucket":"`)
	problemCode = []byte(`"code":"`)
)

// classify names a result's outcome from its status and body.
func classify(r *vegeta.Result) string { return outcome(int(r.Code), r.Body) }

// outcome names an answer's outcome from its status (0: no answer) and body.
func outcome(code int, body []byte) string {
	switch code {
	case 0:
		return "error"
	case http.StatusCreated:
		if bytes.Contains(body, warmTrue) {
			return "201 warm"
		}
		return "201"
	case http.StatusTooManyRequests:
		if v, ok := jsonString(body, bucketName); ok {
			return "429 " + v
		}
		return "429"
	case http.StatusServiceUnavailable:
		// space-api's 503s say why: overloaded (shed by its gate before any work)
		// or unavailable (a store failed).
		if v, ok := jsonString(body, problemCode); ok {
			return "503 " + v
		}
		return "503"
	}
	return strconv.Itoa(code)
}

// jsonString is the string value after key (`"name":"`) in body, if any.
func jsonString(body, key []byte) (string, bool) {
	i := bytes.Index(body, key)
	if i < 0 {
		return "", false
	}
	rest := body[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return "", false
	}
	return string(rest[:j]), true
}
