package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/apikey"
)

// tenantKeys are API keys issued straight into the bench's database, as `space-api
// keys create` issues them (internal/apikey: "spk_" and 32 random bytes in base64url,
// stored as their SHA-256), one per client, in one COPY.
type tenantKeys struct {
	clients []string
	secrets []string
}

func issueKeys(ctx context.Context, db *database, clients []string) (*tenantKeys, error) {
	k := &tenantKeys{clients: clients, secrets: make([]string, len(clients))}
	rows := make([][]any, len(clients))
	var raw [32]byte
	for i, c := range clients {
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, err
		}
		k.secrets[i] = apikey.Prefix + base64.RawURLEncoding.EncodeToString(raw[:])
		sum := sha256.Sum256([]byte(k.secrets[i]))
		rows[i] = []any{uuid.New(), c, "bench", sum[:]}
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return nil, fmt.Errorf("connect to bench database: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"api_keys"}, []string{"id", "client", "name", "hash"}, pgx.CopyFromRows(rows)); err != nil {
		return nil, fmt.Errorf("issue %d API keys: %w", len(clients), err)
	}
	// The planner then knows the table's size, as autovacuum would have told it.
	if _, err := conn.Exec(ctx, "ANALYZE api_keys"); err != nil {
		return nil, fmt.Errorf("analyze api_keys: %w", err)
	}
	return k, nil
}

// tenantNames are prefix0 … prefix<n-1>.
func tenantNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// drain takes each client's whole bucket (burst 1) with one real decision of the
// product's Admitter, under the production key prefix and the replica's cluster rate,
// on g goroutines: every create of those clients is then refused by its own bucket.
func drain(ctx context.Context, rdb *redis.Client, cluster, rate space.Rate, clients []string, g int) error {
	a, err := newAdmitter(rdb, keysPrefix, cluster)
	if err != nil {
		return err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, g)
	for range g {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(clients)) {
					return
				}
				admitted, err := charge1(ctx, a, space.ClientKey(clients[i]), &rate)
				if err == nil && !admitted {
					err = fmt.Errorf("draining %s: its first decision was not admitted", clients[i])
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// createRequest renders one create of body with the given header line (e.g.
// "Authorization: Bearer spk_…") for host.
func createRequest(host, header, body string) []byte {
	return []byte("POST /v1/sandboxes HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\n" + header +
		"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// createEach sends request(i) once for every i in [from, to), closed loop over conns
// connections (each sends its next as soon as its answer is in), and counts the
// answers by outcome. It is the plain HTTP/1.1 client of runRaw: the driver spends
// little of the two cores on it.
func createEach(ctx context.Context, base string, request func(host string, i int) []byte, from, to, conns int) (map[string]int, time.Duration, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, 0, err
	}
	var next atomic.Int64
	next.Store(int64(from))
	counts := make([]map[string]int, conns)
	errs := make([]error, conns)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range conns {
		counts[c] = map[string]int{}
		wg.Go(func() {
			var conn net.Conn
			var r *bufio.Reader
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				// A connection the server closed is opened again, once per request.
				for attempt := 0; ; attempt++ {
					if conn == nil {
						var derr error
						if conn, derr = (&net.Dialer{}).DialContext(ctx, "tcp", u.Host); derr != nil {
							errs[c] = derr
							return
						}
						r = bufio.NewReader(conn)
					}
					_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
					code, body, err := exchange(conn, r, request(u.Host, i))
					if err != nil {
						conn.Close()
						conn = nil
					}
					if code != 0 {
						counts[c][outcome(code, body)]++
						break
					}
					if attempt == 1 {
						counts[c]["error"]++
						break
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	out := map[string]int{}
	for _, m := range counts {
		for k, v := range m {
			out[k] += v
		}
	}
	for _, err := range errs {
		if err != nil {
			return out, elapsed, fmt.Errorf("creates to %s: %w", base, err)
		}
	}
	return out, elapsed, ctx.Err()
}

// wrkRotating is wrkScript with one header (Header) taken in turn from the lines of a
// file, one request each: the requests are rendered once, in init, so that sending
// costs wrk the same whether the file has one line or a hundred thousand. The run
// starts at line offset+1 (wrk's arguments after --: the file, the offset). A 429 is
// counted with the bucket its body names ("429 client_activation"), as outcome names
// it.
const wrkRotating = `-- written by space-bench: creates, each with the next header of a file
wrk.method = "POST"
wrk.body = [==[%s]==]
wrk.headers["Content-Type"] = "application/json"

local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  statuses = {}
  reqs = {}
  for line in io.lines(args[1]) do
    wrk.headers[ [==[%s]==] ] = line
    reqs[#reqs + 1] = wrk.format()
  end
  i = tonumber(args[2]) %% #reqs
end
function request()
  i = i %% #reqs + 1
  return reqs[i]
end
function response(status, headers, body)
  local k = tostring(status)
  if status == 429 then
    local bucket = string.match(body, '"bucket":"([^"]*)"')
    if bucket then k = k .. " " .. bucket end
  end
  statuses[k] = (statuses[k] or 0) + 1
end
function done(summary, latency, requests)
  local counts = {}
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("statuses")) do counts[status] = (counts[status] or 0) + n end
  end
  local parts = {}
  for status, n in pairs(counts) do table.insert(parts, string.format('"%%s":%%d', status, n)) end
  local e = summary.errors
  io.write(string.format('%s{"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p99_us":%%d,"socket_errors":%%d,"statuses":{%%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, table.concat(parts, ",")))
end
`

// rotatingLoad is one wrk run over the header values of a file.
type rotatingLoad struct {
	Name        string
	URL         string
	Header      string // e.g. "Authorization"
	ValuesFile  string // one header value a line
	Offset      int
	Body        string
	Connections int
	Duration    time.Duration
}

// writeLines writes lines, one a line, into dir/name and returns its path.
func writeLines(dir, name string, lines []string) (string, error) {
	p := filepath.Join(dir, name)
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", p, err)
	}
	return p, nil
}

// runRotating runs wrk once with wrkRotating and parses its figures.
func (e *Env) runRotating(ctx context.Context, l rotatingLoad) (*wrkResult, error) {
	bin, err := exec.LookPath("wrk")
	if err != nil {
		return nil, fmt.Errorf("wrk is not on PATH: %s: %w", toolsHint, err)
	}
	script := filepath.Join(e.Dir, "wrk-rotating.lua")
	if err := os.WriteFile(script, fmt.Appendf(nil, wrkRotating, l.Body, l.Header, wrkMarker), 0o600); err != nil {
		return nil, fmt.Errorf("write the wrk script: %w", err)
	}
	args := []string{"-t", strconv.Itoa(wrkThreads), "-c", strconv.Itoa(l.Connections), "-d", wrkSeconds(l.Duration),
		"--timeout", "10s", "-s", script, l.URL + "/v1/sandboxes", "--", l.ValuesFile, strconv.Itoa(l.Offset)}
	cmd := generatorCommand(ctx, false, bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("wrk %s (%s): %w\n%s%s", strings.Join(args, " "), l.Name, err, out.String(), errOut.String())
	}
	return parseWrk(out.String())
}
