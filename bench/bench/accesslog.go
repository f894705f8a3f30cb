package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// logMark is a place in a server's log: what it writes after the mark is read back
// by serverLatencies. space-api logs every answer but sampled refusals as one JSON
// line (msg "request", its client and duration), so the quiet client's creates can be
// read back with the time each took inside the server: without the load generator,
// the kernel's queues or the loopback network, which the driver's latencies include.
type logMark struct {
	path   string
	offset int64
}

// markLog marks the end of the log at path; an unreadable log marks nothing, and its
// latencies are none.
func markLog(path string) logMark {
	fi, err := os.Stat(path)
	if err != nil {
		return logMark{}
	}
	return logMark{path: path, offset: fi.Size()}
}

// accessLine is what serverLatencies reads of an access log line.
type accessLine struct {
	Msg      string    `json:"msg"`
	Time     time.Time `json:"time"`
	Method   string    `json:"method"`
	Client   string    `json:"client"`
	Duration int64     `json:"duration"` // nanoseconds: slog's JSON form of a time.Duration
}

// serverLatencies are the durations of the client's POST requests logged after the
// mark whose request started (logged time less its duration) at or after from. A log
// that has none (the peers log no requests) gives none.
func (m logMark) serverLatencies(client string, from time.Time) ([]time.Duration, error) {
	if m.path == "" {
		return nil, nil
	}
	f, err := os.Open(m.path)
	if err != nil {
		return nil, fmt.Errorf("access log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(m.offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("access log: %w", err)
	}
	var out []time.Duration
	needle := `"client":"` + client + `"`
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), needle) {
			continue
		}
		var l accessLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Msg != "request" || l.Method != "POST" || l.Client != client {
			continue
		}
		d := time.Duration(l.Duration)
		if !l.Time.Add(-d).Before(from) {
			out = append(out, d)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("access log: %w", err)
	}
	return out, nil
}
