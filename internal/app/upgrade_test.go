package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/testenv"
)

// A rolling upgrade runs the previous release and this code side by side on one
// Postgres (its schema migrated by this code while the old replicas serve), one Redis
// (each release's Lua scripts over the other's bucket keys), River's queue and one
// flags file. TestUpgradeSideBySide builds the previous release from git and drives
// work through a replica of each, on standalone Redis and on the cluster.

// keyLayout is how many bytes a release writes in each kind of admission key.
type keyLayout struct {
	cluster    int // the cluster bucket, or the shared remainder when tiers reserve
	client     int // a client bucket without a soft limit
	softClient int // a client bucket with one
	reserve    int // a tier's reserve
}

// thisLayout is this code's (the comments atop internal/admission/bucket.lua and
// reserve.lua).
var thisLayout = keyLayout{cluster: 32, client: 40, softClient: 40, reserve: 40}

// releases are this project's releases, newest first: the commit each was cut at,
// and what this code changed after it, as the test checks that release beside it (the
// key layout the release writes, and a field of a flags entry that this code added and
// the release refuses, with the whole quota flag). The commit, not the tag, names the
// release here: a clone need not carry its tags, and a shallow one need not carry its
// history (the test fetches the one commit it builds). Add a release at the top when it
// is cut; a release that writes this code's layout and refuses no field this code added
// has thisLayout and no newField.
var releases = []struct {
	tag, commit string
	layout      keyLayout
	newField    string
}{
	{
		tag: "v0.1.0", commit: "d9671edf60b5394e21e39dd2583e8cd09bf5f342",
		layout:   keyLayout{cluster: 24, client: 24, softClient: 32, reserve: 32},
		newField: `"max_lifetime_seconds": 3600`,
	},
}

// previousRelease is the release before this code, built.
type previousRelease struct {
	tag, commit string
	bin         string
	layout      keyLayout
	newField    string
}

// oldRelease is the previous release's build, made once per run of this test binary
// (both Redis modes share it) and removed by TestMain when the run ends.
var oldRelease struct {
	once sync.Once
	dir  string
	rel  previousRelease
	took time.Duration
	err  error
}

// previous returns the previous release, building it the first time.
func previous(t *testing.T) previousRelease {
	t.Helper()
	oldRelease.once.Do(func() {
		begin := time.Now()
		oldRelease.rel, oldRelease.err = buildPreviousRelease()
		oldRelease.took = time.Since(begin)
	})
	if oldRelease.err != nil {
		t.Fatalf("the previous release cannot be built, and this test runs it beside this code: %v", oldRelease.err)
	}
	t.Logf("previous release %s (%.12s), built in %v", oldRelease.rel.tag, oldRelease.rel.commit, oldRelease.took.Round(time.Second))
	return oldRelease.rel
}

// removePreviousRelease deletes the previous release's build, if one was made.
func removePreviousRelease() {
	if oldRelease.dir != "" {
		_ = os.RemoveAll(oldRelease.dir)
	}
}

// buildPreviousRelease finds the previous release, the newest of releases that is not
// HEAD itself, fetches its one commit into a temporary repository and builds its
// cmd/space-api there. The commit comes from this checkout when it holds it, else from
// its origin (a shallow clone); this checkout is never changed. A missing git, a source
// tarball or a commit neither holds is an error naming what is missing: the upgrade must
// not pass for untested.
//
// The build is a whole space-api: on an empty build cache a minute or two of CPU, so it
// is made once per run of the test binary. It is made with the race detector when the
// test binary was (make test), so that it reuses the dependencies the test's own build
// compiled: where the two releases require the same modules (v0.1.0 and this code do),
// only space-api's own packages are compiled again, some 20s.
func buildPreviousRelease() (previousRelease, error) {
	var rel previousRelease
	if _, err := exec.LookPath("git"); err != nil {
		return rel, errors.New("git is not installed: the previous release is built from the repository's history")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	git := func(dir string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	top, err := git(".", "rev-parse", "--show-toplevel")
	if err != nil {
		return rel, fmt.Errorf("this is not a git checkout (a source tarball?), and the previous release is built from its history: %w", err)
	}
	head, err := git(top, "rev-parse", "HEAD")
	if err != nil {
		return rel, err
	}
	for _, r := range releases {
		if r.commit != head {
			rel.tag, rel.commit, rel.layout, rel.newField = r.tag, r.commit, r.layout, r.newField
			break
		}
	}
	if rel.tag == "" {
		return rel, fmt.Errorf("HEAD %.12s is the only release listed: list the one before it", head)
	}
	// From this checkout when it holds the commit, else from where it was cloned.
	from := top
	if _, err := git(top, "cat-file", "-e", rel.commit+"^{commit}"); err != nil {
		origin, oerr := git(top, "remote", "get-url", "origin")
		if oerr != nil {
			return rel, fmt.Errorf("%s (%.12s) is not in this checkout, and it has no origin to fetch it from: %w", rel.tag, rel.commit, oerr)
		}
		from = origin
	} else if _, err := git(top, "merge-base", "--is-ancestor", rel.commit, "HEAD"); err != nil {
		return rel, fmt.Errorf("%s (%.12s) is not an ancestor of HEAD %.12s: is the releases table of another branch?", rel.tag, rel.commit, head)
	}

	oldRelease.dir, err = os.MkdirTemp("", "space-previous-release-")
	if err != nil {
		return rel, err
	}
	src := filepath.Join(oldRelease.dir, "src")
	if _, err := git(oldRelease.dir, "init", "--quiet", src); err != nil {
		return rel, err
	}
	if _, err := git(src, "fetch", "--quiet", "--depth", "1", from, rel.commit); err != nil {
		return rel, fmt.Errorf("fetching %s (%.12s): %w", rel.tag, rel.commit, err)
	}
	if _, err := git(src, "checkout", "--quiet", "FETCH_HEAD"); err != nil {
		return rel, err
	}
	// go test puts its own go first on the test's PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return rel, fmt.Errorf("no go on PATH to build the previous release with: %w", err)
	}
	rel.bin = filepath.Join(oldRelease.dir, "space-api-"+rel.tag)
	args := []string{"build", "-o", rel.bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, goBin, append(args, "./cmd/space-api")...)
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return rel, fmt.Errorf("go build of %s: %v\n%s", rel.tag, err, out)
	}
	return rel, nil
}

// raceEnabled reports whether this test binary was built with the race detector.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// migrate runs the release's `space-api migrate` with env.
func (p previousRelease) migrate(t *testing.T, env map[string]string) {
	t.Helper()
	cmd := exec.CommandContext(testenv.Context(t), p.bin, "migrate")
	cmd.Env = []string{"SPACE_DATABASE_URL=" + env["SPACE_DATABASE_URL"], "SPACE_LOG_LEVEL=warn"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s migrate: %v\n%s", p.tag, err, out)
	}
}

// start starts a replica of the release with env.
func (p previousRelease) start(t *testing.T, name string, env map[string]string) *replica {
	t.Helper()
	r := startReplicaCmd(t, name, func() *exec.Cmd { return exec.Command(p.bin, "serve") }, env)
	r.release = p.tag
	return r
}

// sideBySide is a replica of each release over one fleet, and what the test reads.
type sideBySide struct {
	t        *testing.T
	s        *server
	rdb      redis.UniversalClient
	prefix   string
	old, cur *replica
	// started are the replicas whose logs checkLogs reads.
	started     []*replica
	logsChecked bool
}

// checkLogs fails the test for each line of a started replica's log that says something
// went wrong (logProblems), once.
func (x *sideBySide) checkLogs() {
	if x.logsChecked {
		return
	}
	x.logsChecked = true
	for _, r := range x.started {
		if lines := logProblems(r.logs.String()); len(lines) > 0 {
			x.t.Errorf("replica %s logged what went wrong:\n%s", r.name, strings.Join(lines, "\n"))
		}
	}
}

// uncheckedClient sends the requests to another release's replicas: its answers are
// not this code's api/openapi.yaml's to check (an older release's lack the fields added
// since; see docs/operations.md, Upgrades).
var uncheckedClient = &http.Client{Transport: http.DefaultTransport}

// send sends a request (with header pairs) to r and returns the answer, or the error
// that kept it from one.
func (x *sideBySide) send(r *replica, method, path, client, body string, header ...string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, r.public+path, rd)
	if err != nil {
		return response{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if client != "" {
		req.Header.Set(api.HeaderClientID, client)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	hc := http.DefaultClient
	if r.release != "" {
		hc = uncheckedClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{resp, b}, err
}

// call sends a request to r; a 5xx, or no answer, fails the test.
func (x *sideBySide) call(r *replica, method, path, client, body string, header ...string) response {
	x.t.Helper()
	resp, err := x.send(r, method, path, client, body, header...)
	if err != nil {
		x.t.Fatalf("%s %s as %s on %s: %v", method, path, client, r.name, err)
	}
	if resp.StatusCode >= 500 {
		x.t.Errorf("%s %s as %s on %s = %d %s", method, path, client, r.name, resp.StatusCode, resp.body)
	}
	return resp
}

// create sends a synchronous create of client's to r, which must answer want (201 or
// 429, a 429 of bucket), and returns the sandbox made.
func (x *sideBySide) create(r *replica, client, body string, want int, bucket space.Bucket) space.Sandbox {
	x.t.Helper()
	resp := x.call(r, "POST", "/v1/sandboxes", client, body)
	var sb space.Sandbox
	switch {
	case resp.StatusCode != want:
		x.t.Fatalf("create of %s on %s = %d %s, want %d", client, r.name, resp.StatusCode, resp.body, want)
	case want == http.StatusCreated:
		resp.json(x.t, &sb)
	case want == http.StatusTooManyRequests:
		if p := resp.problem(x.t); p.Bucket != bucket {
			x.t.Fatalf("create of %s on %s refused by %q, want %q: %s", client, r.name, p.Bucket, bucket, resp.body)
		}
	}
	return sb
}

// creates sends one create of client's to each replica of rs in turn: the first
// admitted must be admitted, the rest refused by bucket.
func (x *sideBySide) creates(client, body string, admitted int, bucket space.Bucket, rs ...*replica) {
	x.t.Helper()
	for i, r := range rs {
		want := http.StatusCreated
		if i >= admitted {
			want = http.StatusTooManyRequests
		}
		x.create(r, client, body, want, bucket)
	}
}

// keyLen is the length of what key holds, failing when it holds nothing.
func (x *sideBySide) keyLen(key string) int {
	x.t.Helper()
	n, err := x.rdb.StrLen(testenv.Context(x.t), key).Result()
	if err != nil || n == 0 {
		x.t.Fatalf("STRLEN %s = %d, %v", key, n, err)
	}
	return int(n)
}

// wrote checks that key holds what r's release writes, want bytes: the other release's
// next decision reads it.
func (x *sideBySide) wrote(r *replica, key string, want int) {
	x.t.Helper()
	if got := x.keyLen(key); got != want {
		x.t.Fatalf("after %s's decision %s holds %d bytes, want the %d its release writes", r.name, key, got, want)
	}
}

// limits is client's GET /v1/limits on r.
func (x *sideBySide) limits(r *replica, client string) api.LimitsBody {
	x.t.Helper()
	var l api.LimitsBody
	resp := x.call(r, "GET", "/v1/limits", client, "")
	if resp.StatusCode != http.StatusOK {
		x.t.Fatalf("limits of %s on %s = %d %s", client, r.name, resp.StatusCode, resp.body)
	}
	resp.json(x.t, &l)
	return l
}

// clientBurst is the burst of client's bucket as r reports it, 0 when it has none.
func (x *sideBySide) clientBurst(r *replica, client string) int64 {
	x.t.Helper()
	if b := x.limits(r, client).ClientRate.BucketBody; b != nil {
		return b.Burst
	}
	return 0
}

// sandbox is sandbox id as r reads it.
func (x *sideBySide) sandbox(r *replica, client, id string) space.Sandbox {
	x.t.Helper()
	var sb space.Sandbox
	resp := x.call(r, "GET", "/v1/sandboxes/"+id, client, "")
	if resp.StatusCode != http.StatusOK {
		x.t.Fatalf("GET sandbox %s on %s = %d %s", id, r.name, resp.StatusCode, resp.body)
	}
	resp.json(x.t, &sb)
	return sb
}

// move pauses or restores (verb) sandbox id on r, synchronously, and checks the state
// it answers with.
func (x *sideBySide) move(r *replica, client, id, verb string, want space.SandboxState) {
	x.t.Helper()
	resp := x.call(r, "POST", "/v1/sandboxes/"+id+"/"+verb, client, "")
	var sb space.Sandbox
	if resp.StatusCode == http.StatusOK {
		resp.json(x.t, &sb)
	}
	if resp.StatusCode != http.StatusOK || sb.State != want {
		x.t.Fatalf("%s of sandbox %s on %s = %d %s, want 200 %s", verb, id, r.name, resp.StatusCode, resp.body, want)
	}
}

// operation polls operation id on r until it is final.
func (x *sideBySide) operation(r *replica, client, id string) space.Operation {
	x.t.Helper()
	var op space.Operation
	testenv.Eventually(x.t, time.Minute, "operation "+id+" to finish", func() bool {
		resp := x.call(r, "GET", "/v1/operations/"+id, client, "")
		if resp.StatusCode != http.StatusOK {
			x.t.Fatalf("GET operation %s on %s = %d %s", id, r.name, resp.StatusCode, resp.body)
		}
		resp.json(x.t, &op)
		return op.State.Done()
	})
	return op
}

// drive sends creates of client's for d from four callers at once, each turning
// between the replicas, and returns how many were admitted and the times that bound
// the decisions: the first sent and first answered, the last sent and last answered.
func (x *sideBySide) drive(client, body string, d time.Duration) (admitted int, firstSent, firstAnswered, lastSent, lastAnswered time.Time) {
	x.t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for g := range 4 {
		wg.Go(func() {
			rs := []*replica{x.old, x.cur}
			for i := g; time.Now().Before(stop); i++ {
				r := rs[i%2]
				sent := time.Now()
				resp, err := x.send(r, "POST", "/v1/sandboxes", client, body)
				answered := time.Now()
				if err != nil {
					x.t.Errorf("create of %s on %s: %v", client, r.name, err)
					return
				}
				code := resp.StatusCode
				mu.Lock()
				if firstSent.IsZero() || sent.Before(firstSent) {
					firstSent = sent
				}
				if firstAnswered.IsZero() || answered.Before(firstAnswered) {
					firstAnswered = answered
				}
				lastSent, lastAnswered = later(lastSent, sent), later(lastAnswered, answered)
				if code == http.StatusCreated {
					admitted++
				}
				mu.Unlock()
				switch code {
				case http.StatusCreated:
				case http.StatusTooManyRequests:
					// A refusal answers at once: a short pause keeps four callers from
					// spinning, and is far below the refill's 250ms a token.
					time.Sleep(20 * time.Millisecond)
				default:
					x.t.Errorf("create of %s on %s = %d, want 201 or 429", client, r.name, code)
					return
				}
			}
		})
	}
	wg.Wait()
	return admitted, firstSent, firstAnswered, lastSent, lastAnswered
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// logProblems returns the lines of a replica's log that say something went wrong: an
// error or a warning (a Lua script's failure, a key that would not read, is a
// warning of the admitter's), a line that is not JSON (a panic, a race report).
func logProblems(logs string) []string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var entry struct {
			Level string `json:"level"`
		}
		if err := json.Unmarshal([]byte(line), &entry); err != nil || entry.Level == "WARN" || entry.Level == "ERROR" {
			out = append(out, line)
		}
	}
	return out
}

// redisModes are the Redis deployments the replicas run on: each returns the
// variables that point a replica at it, and a client of it for the test.
var redisModes = []struct {
	name  string
	redis func(t *testing.T) (map[string]string, redis.UniversalClient)
}{
	{"standalone redis", func(t *testing.T) (map[string]string, redis.UniversalClient) {
		return map[string]string{"SPACE_REDIS_ADDRS": testenv.RedisAddr(t), "SPACE_REDIS_MODE": "standalone"}, testenv.Redis(t)
	}},
	{"redis cluster", func(t *testing.T) (map[string]string, redis.UniversalClient) {
		return map[string]string{"SPACE_REDIS_ADDRS": strings.Join(testenv.RedisClusterAddrs(t), ","), "SPACE_REDIS_MODE": "cluster"},
			testenv.RedisCluster(t)
	}},
}

// TestUpgradeSideBySide runs the previous release beside this code, as a rolling
// upgrade does, and checks that together they keep every budget and lose no work
// (docs/operations.md, Upgrades).
func TestUpgradeSideBySide(t *testing.T) {
	t.Parallel()
	prev := previous(t)
	for _, mode := range redisModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			t.Run("a rolling upgrade: migrate while the old release serves, then both serve every kind of work", func(t *testing.T) {
				rollingUpgrade(t, prev, mode.redis)
			})
			t.Run("tiers with reserves: both releases together admit the cluster's burst to the token", func(t *testing.T) {
				reservedTiers(t, prev, mode.redis)
			})
		})
	}
}

// upgradeQuota is the rolling upgrade's quota flag: clients whose rates the test
// counts, lowered with lowered's burst, and more (an entry or a client) at the end.
func upgradeQuota(lowered int, more string) string {
	return fmt.Sprintf(`{"clients": {
		"acme":    {"refill_rps": 0.000001, "burst": 8, "concurrency": 50, "live_sandboxes": 1000},
		"soft":    {"refill_rps": 0.000001, "burst": 8, "soft_refill_rps": 0.000001, "soft_burst": 3, "concurrency": 50, "live_sandboxes": 1000},
		"refill":  {"refill_rps": 4, "burst": 4, "concurrency": 50, "live_sandboxes": 1000},
		"lowered": {"refill_rps": 0.000001, "burst": %d, "concurrency": 50, "live_sandboxes": 1000},
		"queue":   {"concurrency": 50, "live_sandboxes": 1000},
		"pauser":  {"concurrency": 50, "live_sandboxes": 1000}%s
	}}`, lowered, more)
}

func rollingUpgrade(t *testing.T, prev previousRelease, redisEnv func(*testing.T) (map[string]string, redis.UniversalClient)) {
	extra, rdb := redisEnv(t)
	extra["SPACE_SIMULATED_COLD_START"] = "200ms"
	// A variable the previous release may not know: a release reads the variables it
	// declares and ignores the rest, so one env serves both.
	extra["SPACE_LIFECYCLE_INTERVAL"] = "1s"
	env := replicaEnv(t, quotaFlags(upgradeQuota(10, ""), ""), extra)
	env["SPACE_DATABASE_URL"] = testenv.EmptyDatabaseURL(t)
	flagsFile := env["SPACE_FLAGS_FILE"]
	x := &sideBySide{t: t, s: &server{t: t}, rdb: rdb, prefix: env["SPACE_REDIS_KEY_PREFIX"]}
	// The logs are read when the test ends, whatever ended it, unless it read them.
	defer x.checkLogs()
	clientKey := func(c string) string { return admission.ClientKey(x.prefix, space.ClientKey(c)) }

	// Before: the previous release alone, on the schema it migrated. It leaves a
	// paused sandbox and a client bucket it wrote.
	prev.migrate(t, env)
	before := prev.start(t, "old-0", env)
	x.old, x.started = before, []*replica{before}
	pre := x.create(before, "pauser", pythonBody, http.StatusCreated, "")
	x.move(before, "pauser", pre.ID, "pause", space.StatePaused)
	x.creates("acme", pythonBody, 2, "", before, before)
	x.wrote(before, clientKey("acme"), prev.layout.client)

	// The upgrade: this code's migrate while the old replica serves, as the chart's
	// init container runs it in the first new pod.
	getenv := func(k string) string { return env[k] }
	if err := Run(testenv.Context(t), []string{"migrate"}, getenv, io.Discard, io.Discard); err != nil {
		t.Fatalf("this code's migrate beside the serving %s: %v", prev.tag, err)
	}
	f := newFleet(t, env)
	if err := store.CheckMigrated(testenv.Context(t), f.db); err != nil {
		t.Fatalf("after this code's migrate: %v", err)
	}
	if sb := x.sandbox(before, "pauser", pre.ID); sb.State != space.StatePaused {
		t.Fatalf("the old replica reads its paused sandbox as %s after the migration", sb.State)
	}
	// Then the new replica, and a replica of the previous release started on the newer
	// schema (a pod of the old ReplicaSet restarted mid-rollout); the first old one
	// drains away.
	x.cur = startReplica(t, "new", env)
	x.old = prev.start(t, "old", env)
	x.started = append(x.started, x.cur, x.old)
	if err := before.terminate(); err != nil {
		t.Fatalf("the first old replica's drain: %v", err)
	}
	old, cur := x.old, x.cur

	// A client bucket the old release wrote, read by this code, and each release's
	// after the other's: 8 in all, 2 of them taken before the upgrade.
	for range 3 {
		x.create(cur, "acme", pythonBody, http.StatusCreated, "")
		x.wrote(cur, clientKey("acme"), thisLayout.client)
		x.create(old, "acme", pythonBody, http.StatusCreated, "")
		x.wrote(old, clientKey("acme"), prev.layout.client)
	}
	x.creates("acme", pythonBody, 0, space.BucketClientActivation, cur, old)

	// A soft limit of 3 inside a hard burst of 8, its key written by each release in
	// turn: the first 3 creates are within it, the 5 after over it, then refusals.
	for i := range 8 {
		r, layout := old, prev.layout.softClient
		if i%2 == 1 {
			r, layout = cur, thisLayout.softClient
		}
		sb := x.create(r, "soft", nodeBody, http.StatusCreated, "")
		if sb.SoftBreach != (i >= 3) {
			t.Fatalf("soft create %d on %s: soft_breach %v, want %v", i, r.name, sb.SoftBreach, i >= 3)
		}
		x.wrote(r, clientKey("soft"), layout)
	}
	x.creates("soft", nodeBody, 0, space.BucketClientActivation, old, cur)

	// A bucket refilling 4 a second, burst 4, drained from both releases for 2s: its
	// burst and what refilled while the creates ran, give or take the token refilling
	// at each end.
	const refillRPS, refillBurst = 4.0, 4.0
	n, firstSent, firstAnswered, lastSent, lastAnswered := x.drive("refill", nodeBody, 2*time.Second)
	most := int(refillBurst + refillRPS*lastAnswered.Sub(firstSent).Seconds())
	least := int(refillBurst+refillRPS*lastSent.Sub(firstAnswered).Seconds()) - 1
	if n < least || n > most {
		t.Fatalf("the refilling bucket admitted %d in %v across the releases, want %d to %d", n, lastAnswered.Sub(firstSent), least, most)
	}
	t.Logf("the refilling bucket admitted %d in %v (%d to %d)", n, lastAnswered.Sub(firstSent).Round(time.Millisecond), least, most)

	// A rate lowered in the flags file, seen by both: 8 of lowered's 10 left, clamped
	// to the new burst of 3.
	x.creates("lowered", pythonBody, 1, "", old)
	x.creates("lowered", pythonBody, 1, "", cur)
	writeFlags(t, flagsFile, quotaFlags(upgradeQuota(3, ""), ""))
	testenv.Eventually(t, 30*time.Second, "both replicas to read the lowered burst", func() bool {
		return x.clientBurst(old, "lowered") == 3 && x.clientBurst(cur, "lowered") == 3
	})
	x.creates("lowered", pythonBody, 3, space.BucketClientActivation, cur, old, cur, old, cur)

	// Pauses and restores crossing the releases: the sandbox paused before the
	// upgrade, one of each release's.
	x.move(cur, "pauser", pre.ID, "restore", space.StateRunning)
	fromOld := x.create(old, "pauser", pythonBody, http.StatusCreated, "")
	x.move(cur, "pauser", fromOld.ID, "pause", space.StatePaused)
	x.move(old, "pauser", fromOld.ID, "restore", space.StateRunning)
	fromCur := x.create(cur, "pauser", pythonBody, http.StatusCreated, "")
	x.move(old, "pauser", fromCur.ID, "pause", space.StatePaused)
	restore := x.s.accepted(x.call(cur, "POST", "/v1/sandboxes/"+fromCur.ID+"/restore", "pauser", "", "Prefer", async), "/v1/operations/")
	if op := x.operation(old, "pauser", restore.ID); op.State != space.OperationSucceeded {
		t.Fatalf("the queued restore, read on the old replica: %+v", op)
	}
	for _, id := range []string{pre.ID, fromOld.ID, fromCur.ID} {
		for _, r := range []*replica{old, cur} {
			if sb := x.sandbox(r, "pauser", id); sb.State != space.StateRunning {
				t.Fatalf("sandbox %s reads %s on %s, want running", id, sb.State, r.name)
			}
		}
	}

	// Queued creates accepted by each release, run by whichever replica's workers take
	// them: each is read on the other replica until it is final.
	type queued struct {
		id      string
		readsOn *replica
	}
	var ops []queued
	for i := range 12 {
		r, other := old, cur
		if i%2 == 1 {
			r, other = cur, old
		}
		op := x.s.accepted(x.call(r, "POST", "/v1/sandboxes", "queue", pythonBody, "Prefer", async), "/v1/operations/")
		ops = append(ops, queued{op.ID, other})
	}
	var ids []string
	for _, q := range ops {
		ids = append(ids, q.id)
		op := x.operation(q.readsOn, "queue", q.id)
		if op.State != space.OperationSucceeded || op.Sandbox == nil || op.Sandbox.State != space.StateRunning {
			t.Fatalf("queued create %s: %+v (sandbox %+v), want succeeded and running", q.id, op, op.Sandbox)
		}
	}
	// Each cold start takes 200ms and a replica runs 2 at once: 12 keep one replica
	// busy for over a second, and the other's workers, woken by each insert, take
	// their share. Both releases' workers ran some.
	if ran := f.count(`SELECT count(DISTINCT who) FROM river_job, unnest(attempted_by) AS who
		WHERE args->>'operation_id' = ANY($1)`, ids); ran < 2 {
		t.Fatalf("the queued operations were run by %d River client(s), want both replicas'", ran)
	}

	testenv.Eventually(t, time.Minute, "every sandbox and operation to settle, nothing orphaned", func() bool {
		sbs, unfinished := f.unsettled()
		orphans, missing := f.orphans()
		return sbs == 0 && unfinished == 0 && len(orphans) == 0 && len(missing) == 0
	})
	x.checkLogs()
	if t.Failed() {
		return
	}

	// A field this code added, in the flags file while an old replica serves: the old
	// release refuses the whole quota flag and keeps its last good one (so misses the
	// rate changed with it), and cannot start on the file. So the field waits until no
	// replica of the old release is left, and comes out again before a rollback.
	if prev.newField == "" {
		t.Logf("%s refuses no flags field this code added", prev.tag)
		return
	}
	writeFlags(t, flagsFile, quotaFlags(upgradeQuota(1, `, "lifecycled": {`+prev.newField+`}`), ""))
	testenv.Eventually(t, 30*time.Second, "this code to read the new flags", func() bool {
		return x.clientBurst(cur, "lowered") == 1
	})
	testenv.Eventually(t, 30*time.Second, "the old replica to refuse the new flags", func() bool {
		return strings.Contains(old.logs.String(), "reload failed; keeping the last good one")
	})
	if got := x.clientBurst(old, "lowered"); got != 3 {
		t.Fatalf("the old replica reads lowered's burst as %d, want the 3 of its last good flags", got)
	}
	ctx, cancel := context.WithTimeout(testenv.Context(t), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prev.bin, "serve")
	cmd.Env = []string{"SPACE_HTTP_ADDR=" + testenv.FreeAddr(t), "SPACE_INTERNAL_HTTP_ADDR=" + testenv.FreeAddr(t)}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown field") {
		t.Fatalf("%s started on flags with a field it does not know: %v\n%s", prev.tag, err, out)
	}
}

// tierQuota: free reserves nothing; pro reserves 8 of the cluster's 28 and lends
// nothing, ent 4 and lends all of it while idle. Each client's own bucket is far from
// binding.
const tierQuota = `{
	"tiers": {
		"free": {"refill_rps": 1, "burst": 1000, "concurrency": 50, "live_sandboxes": 1000},
		"pro":  {"refill_rps": 1, "burst": 1000, "concurrency": 50, "live_sandboxes": 1000,
		         "reserved_rps": 0.000002, "reserved_burst": 8, "lendable": 0},
		"ent":  {"refill_rps": 1, "burst": 1000, "concurrency": 50, "live_sandboxes": 1000,
		         "reserved_rps": 0.000001, "reserved_burst": 4, "lendable": 1}
	},
	"clients": {"on-free": {"tier": "free"}, "on-pro": {"tier": "pro"}, "on-ent": {"tier": "ent"}}
}`

// bigBody is a create of the template of activation cost 3.
const bigBody = `{"template":"big","cpu_millis":1000,"memory_mib":1024,"disk_gib":5}`

func reservedTiers(t *testing.T, prev previousRelease, redisEnv func(*testing.T) (map[string]string, redis.UniversalClient)) {
	extra, rdb := redisEnv(t)
	// The cluster: 28 tokens that barely refill (1e-5 a second, a hundredth of a token
	// over the test's minutes), 16 of them the shared remainder.
	extra["SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS"] = "0.00001"
	extra["SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST"] = "28"
	extra["SPACE_TEMPLATES_FILE"] = testenv.WriteFile(t, "templates.json", `{"templates": {
		"python-3.12": {"image": "python:3.12-slim"},
		"big": {"image": "big:1", "activation_cost": 3}
	}}`)
	// The floor tier for clients no entry places, which v0.1.0 requires of a tier table.
	extra["SPACE_FALLBACK_TIER"] = "free"
	env := replicaEnv(t, quotaFlags(tierQuota, ""), extra)
	x := &sideBySide{t: t, s: &server{t: t}, rdb: rdb, prefix: env["SPACE_REDIS_KEY_PREFIX"]}
	defer x.checkLogs()
	old, cur := prev.start(t, "old", env), startReplica(t, "new", env)
	x.old, x.cur, x.started = old, cur, []*replica{old, cur}
	shared := admission.ClusterKey(x.prefix)
	tierKey := func(tier string) string { return admission.TierKey(x.prefix, tier) }

	// ent asks on each release, the old one last: its reserve keeps 2, and ent is
	// busy (it lends nothing) for its refill interval, weeks here, whichever release
	// marked it. Each refusal below that could borrow reads ent's mark as lender, this
	// code reading the old release's first.
	x.create(cur, "on-ent", pythonBody, http.StatusCreated, "")
	x.wrote(cur, tierKey("ent"), thisLayout.reserve)
	x.create(old, "on-ent", pythonBody, http.StatusCreated, "")
	x.wrote(old, tierKey("ent"), prev.layout.reserve)
	// free takes 4 of the shared 16.
	for range 2 {
		x.create(old, "on-free", pythonBody, http.StatusCreated, "")
		x.wrote(old, shared, prev.layout.cluster)
		x.create(cur, "on-free", pythonBody, http.StatusCreated, "")
		x.wrote(cur, shared, thisLayout.cluster)
	}
	// pro draws 3 a create from its reserve of 8 and the shared 12, the releases in
	// turn: however each draws a cost (from one source, or across them), 6 are
	// admitted, and its reserve is left empty and the shared remainder with 2.
	x.create(old, "on-pro", bigBody, http.StatusCreated, "")
	x.wrote(old, tierKey("pro"), prev.layout.reserve)
	x.create(cur, "on-pro", bigBody, http.StatusCreated, "")
	x.wrote(cur, tierKey("pro"), thisLayout.reserve)
	x.creates("on-pro", bigBody, 4, space.BucketClusterActivation, old, cur, old, cur, old, cur, old, cur)
	// free gets those 2 and no more: ent lends none.
	x.creates("on-free", pythonBody, 2, space.BucketClusterActivation, old, cur, cur, old)
	// ent asks on this code (its reserve keeps 1), and the old release reads that mark
	// as lender: it lends nothing still.
	x.create(cur, "on-ent", pythonBody, http.StatusCreated, "")
	x.wrote(cur, tierKey("ent"), thisLayout.reserve)
	x.creates("on-free", pythonBody, 0, space.BucketClusterActivation, old, cur)
	x.creates("on-pro", pythonBody, 0, space.BucketClusterActivation, old, cur)
	// ent gets the last token its reserve kept.
	x.creates("on-ent", pythonBody, 1, space.BucketClusterActivation, old, cur, old)
	// 3 + 4 + 6×3 + 2 + 1: the cluster's 28, every one admitted once.
}
