package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// loadEnv is the variable that makes the driver's binary (space-bench, or the bench
// package's test binary) run one load stream and print what it saw, instead of
// benchmarking: see runApart and ServeLoad.
const loadEnv = "SPACE_BENCH_LOAD"

// runApart runs the stream in a process of its own, the driver's binary started again
// with loadEnv set, as another client would be on another machine: the quiet
// neighbour's latency is then not that of the flood's goroutines on the same Go
// scheduler, and the flood's generator not a thousand goroutines beside the quiet
// client's. Both processes still share the machine's two cores with the servers.
func (l load) runApart(ctx context.Context) (*loadResult, error) {
	return l.runApartNotify(ctx, nil)
}

// startedLine is what a stream's process writes to its stderr just before it sends
// its first request: runApartNotify's parent reads it as the stream's start.
const startedLine = "space-bench-load: sending"

// runApartNotify is runApart, closing started (when not nil) once the stream's
// process is up and sending. A process started at the lowest priority on a busy
// machine can take seconds to get there; an arm measured beside it waits for this,
// not for a guess of how long a start takes.
func (l load) runApartNotify(ctx context.Context, started chan<- struct{}) (*loadResult, error) {
	p, err := l.startApart(ctx, started, nil)
	if err != nil {
		return nil, err
	}
	w, err := p.wait()
	if err != nil {
		return nil, err
	}
	return w.result(), nil
}

// apartProc is a stream's process, started by startApart.
type apartProc struct {
	name   string
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr *startWatch
}

// startApart starts the stream's process (see runApartNotify); stdin, when not nil,
// is its standard input (a slowloris runs until it is closed).
func (l load) startApart(ctx context.Context, started chan<- struct{}, stdin io.Reader) (*apartProc, error) {
	spec, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", l.Name, err)
	}
	p := &apartProc{name: l.Name, stderr: &startWatch{started: started}}
	p.cmd = generatorCommand(ctx, l.Yield, self)
	p.cmd.Env = append(os.Environ(), loadEnv+"="+string(spec))
	p.cmd.Stdout, p.cmd.Stderr, p.cmd.Stdin = &p.stdout, p.stderr, stdin
	if err := p.cmd.Start(); err != nil {
		p.stderr.close()
		return nil, fmt.Errorf("load %s in its own process: %w", l.Name, err)
	}
	streams.started(p.cmd.Process.Pid)
	return p, nil
}

// wait waits for the stream's process to end and reads what it printed.
func (p *apartProc) wait() (wireResult, error) {
	defer p.stderr.close()
	err := p.cmd.Wait()
	var w wireResult
	if err == nil {
		err = json.Unmarshal(p.stdout.Bytes(), &w)
	}
	streams.ended(p.cmd.Process.Pid, w.Ticks)
	if err != nil {
		return w, fmt.Errorf("load %s in its own process: %w: %s", p.name, err, bytes.TrimSpace(p.stderr.bytes()))
	}
	return w, nil
}

// startWatch is a stream process's stderr: kept for the error it may explain, and
// watched for startedLine, which closes started once.
type startWatch struct {
	mu      sync.Mutex
	out     bytes.Buffer
	started chan<- struct{}
}

// bytes is what the process wrote so far.
func (w *startWatch) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.out.Bytes())
}

func (w *startWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.out.Write(p)
	if w.started != nil && bytes.Contains(w.out.Bytes(), []byte(startedLine)) {
		w.closeLocked()
	}
	return len(p), nil
}

// close closes started if the process never said it started (it failed), so that
// nothing waits on it for ever.
func (w *startWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closeLocked()
}

func (w *startWatch) closeLocked() {
	if w.started != nil {
		close(w.started)
		w.started = nil
	}
}

// streams are the processes runApart started, for the CPU they used (cpuUser.streams).
var streams = &streamProcs{running: map[int]bool{}}

// streamProcs counts each stream process's CPU from /proc while it runs, and from the
// count it printed once it has ended: a stream running at both reads of a watch
// counts its time between them, one started after the first read counts it all.
type streamProcs struct {
	mu      sync.Mutex
	running map[int]bool
	done    uint64 // clock ticks, user and system, of the streams that ended
}

func (s *streamProcs) started(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running[pid] = true
}

func (s *streamProcs) ended(pid int, ticks uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, pid)
	s.done += ticks
}

// ticks is the CPU time of every stream process so far.
func (s *streamProcs) ticks() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum uint64
	for pid := range s.running {
		if _, t, ok := readProcTicks("/proc/" + strconv.Itoa(pid)); ok {
			sum += t
		}
	}
	return sum + s.done
}

// ServeLoad runs the stream loadEnv names, when it is set, writing its result to out
// as JSON, and reports whether it did: space-bench's main and the bench package's
// TestMain call it first.
func ServeLoad(ctx context.Context, out io.Writer) (bool, error) {
	spec, ok := os.LookupEnv(loadEnv)
	if !ok {
		return false, nil
	}
	var l load
	if err := json.Unmarshal([]byte(spec), &l); err != nil {
		return true, fmt.Errorf("%s: %w", loadEnv, err)
	}
	if l.Slow > 0 {
		st, err := l.runSlowloris(ctx, os.Stdin, os.Stderr)
		if err != nil {
			return true, err
		}
		w := wireResult{Name: l.Name, Slow: st}
		_, w.Ticks, _ = readProcTicks("/proc/self")
		return true, json.NewEncoder(out).Encode(w)
	}
	fmt.Fprintln(os.Stderr, startedLine)
	var r *loadResult
	if l.Raw {
		var err error
		if r, err = l.runRaw(ctx); err != nil {
			return true, err
		}
	} else {
		r = l.run(ctx)
	}
	w := wire(r)
	_, w.Ticks, _ = readProcTicks("/proc/self")
	return true, json.NewEncoder(out).Encode(w)
}

// wireResult is a loadResult as the stream's process prints it: each answer once.
type wireResult struct {
	Name    string
	First   time.Time
	Elapsed time.Duration
	Answers []wireAnswer
	Unsent  int
	// Slow is a slowloris's figures (runSlowloris), where the stream is one.
	Slow *SlowStats `json:",omitempty"`
	// Ticks is the CPU time the stream's process used (clock ticks, user and
	// system), read as it ends.
	Ticks uint64
}

type wireAnswer struct {
	Outcome           string
	At, Wait, Latency time.Duration `json:",omitempty"`
}

func wire(r *loadResult) wireResult {
	w := wireResult{Name: r.Name, First: r.First, Elapsed: r.Elapsed, Unsent: r.Unsent, Answers: make([]wireAnswer, 0, len(r.answers))}
	for _, a := range r.answers {
		w.Answers = append(w.Answers, wireAnswer{Outcome: a.outcome, At: a.at, Wait: a.wait, Latency: a.latency})
	}
	return w
}

func (w wireResult) result() *loadResult {
	r := newLoadResult(w.Name)
	for _, a := range w.Answers {
		r.addSent(a.Outcome, a.At, a.Wait, a.Latency)
	}
	r.Elapsed, r.First, r.Unsent = w.Elapsed, w.First, w.Unsent
	return r
}
