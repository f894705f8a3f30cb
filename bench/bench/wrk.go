package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// wrk is the load generator of the refusal-ceiling comparison: a separate
// C process, so that space-api and its peers are measured by the same generator, none
// of them sharing a process with it, and the generator's own cost is small and the
// same for all three. It runs with 1 thread, as a closed loop over its connections.
const wrkThreads = 1

// wrkMarker starts the line the Lua script's done() prints with the figures.
const wrkMarker = "space-bench-wrk "

// wrkScript sets the request (method, body, Content-Type, the client's identityHeader) and counts the
// answers by status in response(); done() prints the counts, the requests, the
// elapsed time and the latency percentiles (all in µs) as one JSON line after
// wrkMarker. Counting in Lua costs wrk a little per answer, the same for every server.
const wrkScript = `-- written by space-bench: creates for one client, answers counted by status
wrk.method = "POST"
wrk.body = [==[%s]==]
wrk.headers["Content-Type"] = "application/json"
wrk.headers[ [==[%s]==] ] = [==[%s]==]

local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  local counts = {}
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("statuses")) do counts[status] = (counts[status] or 0) + n end
  end
  local parts = {}
  for status, n in pairs(counts) do table.insert(parts, string.format('"%%d":%%d', status, n)) end
  local e = summary.errors
  io.write(string.format('%s{"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p99_us":%%d,"socket_errors":%%d,"statuses":{%%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, table.concat(parts, ",")))
end
`

// wrkLoad is one closed-loop stream of creates for one client.
type wrkLoad struct {
	Name        string
	URL         string // the server's public base URL
	Client      string // X-Client-ID (trusted_header mode), and the script's name
	Key         string // when set, Client's API key, sent as its Authorization (api_key mode)
	Body        string
	Connections int
	Duration    time.Duration // whole seconds, at least 1: wrk's -d has no finer unit
	// Yield runs wrk at the lowest CPU priority (generatorCommand): a flood beside a
	// client whose latency is measured.
	Yield bool
}

// wrkResult is what wrk saw. Outcomes are status codes as text, and "error" for socket
// errors (connect, read, write, timeout).
type wrkResult struct {
	Requests int
	Elapsed  time.Duration
	P50, P99 time.Duration
	Outcomes map[string]int
}

// rps is the rate of answers with the given status.
func (r *wrkResult) rps(status string) float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Outcomes[status]) / r.Elapsed.Seconds()
}

// wrkSeconds is d as wrk's -d: whole seconds, at least one.
func wrkSeconds(d time.Duration) string {
	return strconv.Itoa(max(1, int(d.Round(time.Second)/time.Second))) + "s"
}

// runWrk runs wrk once and parses what its script printed.
func (e *Env) runWrk(ctx context.Context, l wrkLoad) (*wrkResult, error) {
	bin, err := exec.LookPath("wrk")
	if err != nil {
		return nil, fmt.Errorf("wrk is not on PATH: %s: %w", toolsHint, err)
	}
	script := filepath.Join(e.Dir, "wrk-"+l.Client+".lua")
	name, value := identityHeader(l.Client, l.Key)
	if err := os.WriteFile(script, fmt.Appendf(nil, wrkScript, l.Body, name, value, wrkMarker), 0o600); err != nil {
		return nil, fmt.Errorf("write the wrk script: %w", err)
	}
	args := []string{"-t", strconv.Itoa(wrkThreads), "-c", strconv.Itoa(l.Connections), "-d", wrkSeconds(l.Duration),
		"--timeout", "10s", "-s", script, l.URL + "/v1/sandboxes"}
	cmd := generatorCommand(ctx, l.Yield, bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("wrk %s (%s): %w\n%s%s", strings.Join(args, " "), l.Name, err, out.String(), errOut.String())
	}
	return parseWrk(out.String())
}

// parseWrk reads the figures line of wrkScript's done() from wrk's output.
func parseWrk(out string) (*wrkResult, error) {
	for line := range strings.SplitSeq(out, "\n") {
		rest, ok := strings.CutPrefix(line, wrkMarker)
		if !ok {
			continue
		}
		var raw struct {
			Requests     int            `json:"requests"`
			DurationUS   int64          `json:"duration_us"`
			P50US        int64          `json:"p50_us"`
			P99US        int64          `json:"p99_us"`
			SocketErrors int            `json:"socket_errors"`
			Statuses     map[string]int `json:"statuses"`
		}
		if err := json.Unmarshal([]byte(rest), &raw); err != nil {
			return nil, fmt.Errorf("wrk figures %q: %w", rest, err)
		}
		res := &wrkResult{Requests: raw.Requests, Elapsed: time.Duration(raw.DurationUS) * time.Microsecond,
			P50: time.Duration(raw.P50US) * time.Microsecond, P99: time.Duration(raw.P99US) * time.Microsecond, Outcomes: raw.Statuses}
		if res.Outcomes == nil {
			res.Outcomes = map[string]int{}
		}
		if raw.SocketErrors > 0 {
			res.Outcomes["error"] += raw.SocketErrors
		}
		return res, nil
	}
	return nil, fmt.Errorf("wrk printed no figures:\n%s", out)
}
