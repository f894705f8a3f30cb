package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/space-sandbox/space/internal/testenv"
)

// database is a Postgres database of the bench's own, on the services' server (made by
// testenv.CreateDatabase), migrated by `space-api migrate` (the binary under test, so
// that its own migrations are the ones measured) and dropped at the end: the bench
// never touches the database that `make run` serves.
type database struct {
	URL  string
	drop func()
}

// stack is what a server scenario runs on: a fresh database, a private redis-server
// and a client of it.
type stack struct {
	db     *database
	redis  *testenv.RedisProcess
	client *redis.Client
}

// newStack starts a stack; close tears it down.
func (e *Env) newStack(ctx context.Context) (*stack, error) {
	db, err := e.newDatabase(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := startRedis(ctx, e.Dir)
	if err != nil {
		db.drop()
		return nil, err
	}
	return &stack{db: db, redis: rs, client: redis.NewClient(&redis.Options{Addr: rs.Addr})}, nil
}

func (s *stack) close() {
	s.client.Close()
	s.redis.Stop()
	s.db.drop()
}

// newDatabase creates and migrates a fresh database. The first one of a run also drops
// what killed runs left behind.
func (e *Env) newDatabase(ctx context.Context) (*database, error) {
	e.leftovers.Do(func() {
		if err := testenv.DropLeftoverDatabases(ctx, e.AdminURL); err != nil {
			e.logf("dropping leftover databases: %v", err)
		}
	})
	url, drop, err := testenv.CreateDatabase(ctx, e.AdminURL, "")
	if err != nil {
		return nil, fmt.Errorf("bench database: %w", err)
	}
	db := &database{URL: url, drop: drop}
	cmd := exec.CommandContext(ctx, e.SpaceAPI, "migrate")
	// migrate reads the whole configuration, so Redis must be named even though
	// migrating does not use it.
	cmd.Env = spaceEnv(map[string]string{"SPACE_DATABASE_URL": db.URL, "SPACE_REDIS_ADDRS": "127.0.0.1:1", "SPACE_LOG_LEVEL": "warn"})
	if out, err := cmd.CombinedOutput(); err != nil {
		db.drop()
		return nil, fmt.Errorf("space-api migrate: %w\n%s", err, out)
	}
	return db, nil
}

// queryInt runs one query that returns one integer, for the bench's own bookkeeping
// (counting slots).
func (d *database) queryInt(ctx context.Context, sql string, args ...any) (int64, error) {
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		return 0, fmt.Errorf("connect to bench database: %w", err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", sql, err)
	}
	return n, nil
}

// queryStrings runs one query that returns one text column, for the bench's own
// bookkeeping (the substrate references rows account for).
func (d *database) queryStrings(ctx context.Context, sql string, args ...any) ([]string, error) {
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		return nil, fmt.Errorf("connect to bench database: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sql, err)
	}
	return out, nil
}

// exec runs one statement on the database (clearing a client's sandboxes between
// runs).
func (d *database) exec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		return fmt.Errorf("connect to bench database: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// serverConfig is one space-api process.
type serverConfig struct {
	Name      string
	DB        *database
	RedisAddr string
	// Flags is the flags file's content; empty runs without SPACE_FLAGS_FILE.
	Flags string
	// Env overrides or adds SPACE_* variables.
	Env map[string]string
}

// apiServer is a running server process: space-api, or a peer of the refusal-ceiling
// comparison (which has no internal listener).
type apiServer struct {
	Name        string
	PublicURL   string
	InternalURL string
	LogPath     string
	what        string // "space-api http", "peer-chi-bare", for messages
	cmd         *exec.Cmd
	done        chan struct{}
	logFile     *os.File
}

// baseServerEnv is what every bench server runs with: trusted_header identity (see
// the doc: the gateway has authenticated the caller, so the figures are those of the
// create path and admission, not of a key lookup), the simulated substrate with no
// cold-start delay (SPACE_SIMULATED_COLD_START unset: its default is 0, and the
// variable accepts only positive durations), and the demo templates.
func (e *Env) baseServerEnv() map[string]string {
	return map[string]string{
		"SPACE_AUTH_MODE":           "trusted_header",
		"SPACE_TRUSTED_PROXY_CIDRS": "127.0.0.1/32",
		"SPACE_TEMPLATES_FILE":      e.Templates,
		"SPACE_SHUTDOWN_TIMEOUT":    "5s",
		"SPACE_FLAGS_POLL_INTERVAL": "1s",
	}
}

// startServer starts space-api serve and waits until /readyz answers 200.
func (e *Env) startServer(ctx context.Context, c serverConfig) (*apiServer, error) {
	return testenv.OnFreePorts(2, 5, func(addrs []string) (*apiServer, error) { return e.startServerOn(ctx, c, addrs[0], addrs[1]) })
}

// startServerOn starts space-api serve listening on public and internal.
func (e *Env) startServerOn(ctx context.Context, c serverConfig, public, internal string) (*apiServer, error) {
	vars := e.baseServerEnv()
	vars["SPACE_HTTP_ADDR"] = public
	vars["SPACE_INTERNAL_HTTP_ADDR"] = internal
	vars["SPACE_DATABASE_URL"] = c.DB.URL
	vars["SPACE_REDIS_ADDRS"] = c.RedisAddr
	if c.Flags != "" {
		p := filepath.Join(e.Dir, c.Name+"-flags.json")
		if err := os.WriteFile(p, []byte(c.Flags), 0o600); err != nil {
			return nil, fmt.Errorf("write flags file: %w", err)
		}
		vars["SPACE_FLAGS_FILE"] = p
	}
	for k, v := range c.Env {
		vars[k] = v
	}
	cmd := exec.Command(e.SpaceAPI, "serve")
	cmd.Env = spaceEnv(vars)
	return e.startProcess(ctx, "space-api "+c.Name, c.Name, cmd, "http://"+public, "http://"+internal)
}

// startProcess starts cmd with its output into <Dir>/<name>.log, and waits until
// publicURL/readyz answers 200 (60 s at most: a loaded machine can take long to start
// a Go binary that opens Postgres and Redis).
func (e *Env) startProcess(ctx context.Context, what, name string, cmd *exec.Cmd, publicURL, internalURL string) (*apiServer, error) {
	logPath := filepath.Join(e.Dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", what, err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", what, err)
	}
	s := &apiServer{Name: name, what: what, PublicURL: publicURL, InternalURL: internalURL,
		LogPath: logPath, cmd: cmd, done: make(chan struct{}), logFile: logFile}
	go func() { _ = cmd.Wait(); close(s.done) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-s.done:
			logFile.Close()
			log := tail(logPath, 20)
			if testenv.PortTaken(log) {
				return nil, fmt.Errorf("%s exited at start, %w:\n%s", what, testenv.ErrPortTaken, log)
			}
			return nil, fmt.Errorf("%s exited at start:\n%s", what, log)
		default:
		}
		if code, err := httpStatus(ctx, s.PublicURL+"/readyz"); err == nil && code == http.StatusOK {
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("%s not ready within 60s:\n%s", what, tail(logPath, 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM (a graceful drain) and kills the process if it has not exited
// within 15 s.
// pid is the server's process id.
func (s *apiServer) pid() int { return s.cmd.Process.Pid }

func (s *apiServer) stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.logFile.Close()
}

// kill ends the process at once (SIGKILL): no drain, its work cut wherever it was, as
// a node's failure would.
func (s *apiServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
	s.logFile.Close()
}

// alive returns an error, with the end of the log, when the process has exited.
func (s *apiServer) alive() error {
	select {
	case <-s.done:
		return fmt.Errorf("%s exited:\n%s", s.what, tail(s.LogPath, 20))
	default:
		return nil
	}
}

// metrics returns the sum of every series of the named metric whose labels include
// labels (name=value pairs), from the internal listener's /metrics.
func (s *apiServer) metric(ctx context.Context, name string, labels ...string) (float64, error) {
	body, err := httpGet(ctx, s.InternalURL+"/metrics")
	if err != nil {
		return 0, err
	}
	return sumMetric(body, name, labels...), nil
}

// sumMetric sums the samples of the named metric (Prometheus text format) whose
// labels include every name=value pair in labels.
func sumMetric(body []byte, name string, labels ...string) float64 {
	var want []string
	for i := 0; i+1 < len(labels); i += 2 {
		want = append(want, labels[i]+"="+strconv.Quote(labels[i+1]))
	}
	sum := 0.0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		series, value := "", rest
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			series, value = rest[1:end], rest[end+1:]
		}
		matched := true
		for _, w := range want {
			if !strings.Contains(","+series+",", ","+w+",") {
				matched = false
				break
			}
		}
		if !matched {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err == nil {
			sum += f
		}
	}
	return sum
}

// spaceEnv is the process environment without any SPACE_* variable of the caller
// (`make run` exports some), plus vars.
func spaceEnv(vars map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPACE_") {
			env = append(env, kv)
		}
	}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

var plainClient = &http.Client{Timeout: 10 * time.Second}

func httpStatus(ctx context.Context, u string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := plainClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func httpGet(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := plainClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return body, nil
}

// createOnce sends one create for client and returns the status code and body.
func createOnce(ctx context.Context, base, client, body string) (int, []byte, error) {
	a, err := createAnswer(ctx, base, client, body)
	return a.status, a.body, err
}

// response is a server's answer to one request.
type response struct {
	status int
	header http.Header
	body   []byte
}

// createAnswer sends one create of client with body, and returns the whole answer.
func createAnswer(ctx context.Context, base, client, body string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/sandboxes", strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client-ID", client)
	resp, err := plainClient.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("POST %s/v1/sandboxes: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}, err
}

// getLimits sends GET /v1/limits for client.
func getLimits(ctx context.Context, base, client string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/limits", nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-Client-ID", client)
	resp, err := plainClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s/v1/limits: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// quota is one client's entry in the quota flag.
type quota struct {
	Concurrency   int `json:"concurrency"`
	LiveSandboxes int `json:"live_sandboxes"`
}

// rateEntry is one key's entry in the quota flag's "rate" object.
type rateEntry struct {
	RefillRPS float64 `json:"refill_rps"`
	Burst     int64   `json:"burst"`
}

// poolShape is one warm pool target.
type poolShape struct {
	Template  string `json:"template"`
	CPUMillis int    `json:"cpu_millis"`
	MemoryMiB int    `json:"memory_mib"`
	DiskGiB   int    `json:"disk_gib"`
	Target    int    `json:"target"`
}

// flagsFile renders a flagd flags file with the quota flag (clients, their rates) and
// the warm pool targets.
func flagsFile(clients map[string]quota, rates map[string]*rateEntry, pool []poolShape) (string, error) {
	if pool == nil {
		pool = []poolShape{}
	}
	variant := func(v any) map[string]any {
		return map[string]any{"state": "ENABLED", "variants": map[string]any{"on": v}, "defaultVariant": "on"}
	}
	doc := map[string]any{"flags": map[string]any{
		"space-api-client-concurrency-quotas": variant(map[string]any{
			"clients": clients,
			"default": quota{Concurrency: 10, LiveSandboxes: 50},
			"rate":    rates,
		}),
		"space-api-warm-pool": variant(map[string]any{"shapes": pool}),
	}}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", fmt.Errorf("flags file: %w", err)
	}
	return string(b), nil
}
