package servicestest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/internal/testenv"
)

// pgStateRoot is where scripts/services.sh keeps Postgres's data when run as root.
const pgStateRoot = "/var/lib/space-services"

// readyTimeout bounds `make run` from start to a 200 on /readyz. It builds
// bin/space-api first: seconds with a warm build cache, minutes on 2 cores without one.
const readyTimeout = 5 * time.Minute

// TestServicesAndRunWorkInACheckoutOtherUsersCannotEnter runs `make services`,
// `make run`, `make services-down` and `make services-clean` (their scripts) in a clone
// under 0700 directories. As root, `up` used to fail there: Postgres runs as the postgres
// user, which could not reach its data under the checkout's .services/.
func TestServicesAndRunWorkInACheckoutOtherUsersCannotEnter(t *testing.T) {
	t.Parallel()
	root := os.Geteuid() == 0
	parent, checkout := privateClone(t)
	services := filepath.Join(checkout, ".services")
	pgPort, redisPort := freePort(t), freePort(t)
	// Only Postgres and the standalone Redis, which `make run` uses: the 3-node cluster
	// would add seconds and test nothing more about where the data goes.
	env := scriptEnv(
		"SPACE_SERVICES_PG_PORT="+pgPort,
		"SPACE_SERVICES_REDIS_PORT="+redisPort,
		"SPACE_SERVICES_ONLY=postgres redis",
	)
	script := func(t *testing.T, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(checkout, "scripts", name), args...)
		cmd.Dir, cmd.Env = checkout, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("scripts/%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// Whatever fails, stop what the scripts started and delete the data, the part
	// outside the checkout included; t.TempDir removes the rest.
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(checkout, "scripts", "services.sh"), "clean")
		cmd.Dir, cmd.Env = checkout, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("scripts/services.sh clean: %v\n%s", err, out)
		}
	})

	// Where docs/testing.md says Postgres's data lives: outside the checkout as root (in a
	// directory of the postgres user), inside it otherwise.
	pgData := filepath.Join(services, "postgres")

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{{"the checkout and its parent are closed to other users", func(t *testing.T) {
		for _, d := range []string{parent, checkout} {
			fi, err := os.Stat(d)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o700 {
				t.Fatalf("%s has mode %v, want 0700", d, fi.Mode().Perm())
			}
		}
		if root {
			if err := exec.Command("runuser", "-u", "postgres", "--", "test", "-x", checkout).Run(); err == nil {
				t.Fatalf("the postgres user can enter %s", checkout)
			}
		}
	}}, {"up starts Postgres and Redis", func(t *testing.T) {
		script(t, "services.sh", "up")
		status := script(t, "services.sh", "status")
		for _, want := range []string{"postgres: running on 127.0.0.1:" + pgPort, "redis: running on 127.0.0.1:" + redisPort} {
			if !strings.Contains(status, want) {
				t.Fatalf("status says\n%s\nwant a line %q", status, want)
			}
		}
	}}, {"Postgres keeps its data where docs/testing.md says", func(t *testing.T) {
		link, err := os.Lstat(pgData)
		if err != nil {
			t.Fatal(err)
		}
		if !root {
			if !link.IsDir() || int(link.Sys().(*syscall.Stat_t).Uid) != os.Geteuid() {
				t.Fatalf("%s: %v, want a directory of our own", pgData, link.Mode())
			}
			return
		}
		if link.Mode()&fs.ModeSymlink == 0 {
			t.Fatalf("%s is %v, want a symlink to the data outside the checkout", pgData, link.Mode())
		}
		target, err := os.Readlink(pgData)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(filepath.Dir(target)) != pgStateRoot || filepath.Base(target) != "postgres" {
			t.Fatalf("%s links to %s, want %s/<hash>/postgres", pgData, target, pgStateRoot)
		}
		pgData = target
		pgUser, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(pgData)
		if err != nil {
			t.Fatal(err)
		}
		if uid := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); uid != pgUser.Uid || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: uid %s, mode %v; want the postgres user's (%s), 0700", pgData, uid, fi.Mode().Perm(), pgUser.Uid)
		}
		// The note beside the data names the checkout, for whoever finds it there.
		note, err := os.ReadFile(filepath.Join(filepath.Dir(pgData), "services-dir"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(note)); got != services {
			t.Fatalf("services-dir names %q, want %q", got, services)
		}
	}}, {"the database answers a query from that data directory", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+pgPort+"/space?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var db, dataDir string
		if err := conn.QueryRow(ctx, "SELECT current_database(), current_setting('data_directory')").Scan(&db, &dataDir); err != nil {
			t.Fatal(err)
		}
		if db != "space" || dataDir != pgData {
			t.Fatalf("database %q in %q, want %q in %q", db, dataDir, "space", pgData)
		}
	}}, {"make run answers /readyz", func(t *testing.T) {
		runAndWaitReady(t, checkout, parent, env)
	}}, {"down stops Postgres and Redis and keeps the data", func(t *testing.T) {
		postmasterPID := pidFrom(t, filepath.Join(pgData, "postmaster.pid"))
		redisPID := pidFrom(t, filepath.Join(services, "redis", "redis.pid"))
		script(t, "services.sh", "down")
		for name, pid := range map[string]int{"postgres": postmasterPID, "redis-server": redisPID} {
			if !exited(pid) {
				t.Errorf("%s (pid %d) still runs after down", name, pid)
			}
		}
		if _, err := os.Stat(filepath.Join(pgData, "PG_VERSION")); err != nil {
			t.Errorf("the data went with down: %v", err)
		}
	}}, {"clean deletes the data, outside the checkout too", func(t *testing.T) {
		script(t, "services.sh", "clean")
		gone := []string{filepath.Join(services, "postgres"), pgData}
		if root {
			gone = append(gone, filepath.Dir(pgData))
		}
		for _, p := range gone {
			if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s is still there after clean (%v)", p, err)
			}
		}
	}}}
	// Each step needs the one before it.
	for _, step := range steps {
		if !t.Run(step.name, step.run) {
			break
		}
	}
}

// privateClone clones the repository this test sits in, at HEAD, into a directory of
// mode 0700 under a parent of mode 0700, and returns both.
func privateClone(t *testing.T) (parent, checkout string) {
	t.Helper()
	top := strings.TrimSpace(git(t, "", "rev-parse", "--show-toplevel"))
	head := strings.TrimSpace(git(t, top, "rev-parse", "HEAD"))
	parent = t.TempDir()
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	checkout, err := os.MkdirTemp(parent, "checkout-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(checkout, 0o700); err != nil {
		t.Fatal(err)
	}
	// --shared borrows the objects instead of copying them: the clone is thrown away.
	git(t, "", "clone", "--quiet", "--shared", "--no-checkout", top, checkout)
	git(t, checkout, "checkout", "--quiet", "--detach", head)
	// The scripts resolve symlinks in the checkout's path (TMPDIR may have some), and
	// so does Postgres in the data directory it reports.
	if checkout, err = filepath.EvalSymlinks(checkout); err != nil {
		t.Fatal(err)
	}
	return parent, checkout
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// scriptEnv is this process's environment without any SPACE_* variable (those of
// `make test` name the shared services, not the clone's), plus extra.
func scriptEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPACE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(testenv.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// runAndWaitReady starts scripts/run.sh (`make run`) in its own process group, polls
// /readyz until it answers 200, and stops the group.
func runAndWaitReady(t *testing.T, checkout, logDir string, env []string) {
	t.Helper()
	addr, internal := testenv.FreeAddr(t), testenv.FreeAddr(t)
	logPath := filepath.Join(logDir, "run.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(checkout, "scripts", "run.sh"))
	cmd.Dir = checkout
	cmd.Env = append(env, "SPACE_HTTP_ADDR="+addr, "SPACE_INTERNAL_HTTP_ADDR="+internal)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	// The group holds run.sh, then the space-api it execs (and, before, go build).
	stop := sync.OnceFunc(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	defer stop()
	runLog := func() string {
		b, _ := os.ReadFile(logPath)
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		return string(b)
	}

	client := &http.Client{Timeout: 2 * time.Second}
	url := "http://" + addr + "/readyz"
	deadline := time.Now().Add(readyTimeout)
	for {
		status, body := get(client, url)
		if status == http.StatusOK {
			t.Logf("/readyz answered 200 %s after start", time.Since(start).Round(time.Second))
			break
		}
		select {
		case <-done:
			t.Fatalf("scripts/run.sh exited (%v) before /readyz answered 200; its output ends:\n%s", waitErr, runLog())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz did not answer 200 within %v (last: %d %s); scripts/run.sh output ends:\n%s", readyTimeout, status, body, runLog())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func get(client *http.Client, url string) (int, string) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// pidFrom reads the PID on the first line of a PID file (postmaster.pid, redis.pid).
func pidFrom(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// exited says whether a process is gone or a zombie (which the init of a container may
// never reap).
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// TestUpMovesAsideFromPortsAnotherProcessHolds is a clean clone in CI beside a working
// copy whose services hold the default ports, or a connection holding one as its own:
// `up` takes free ports, says so, records them, and env hands them to the tests. A
// port set explicitly is never moved.
func TestUpMovesAsideFromPortsAnotherProcessHolds(t *testing.T) {
	t.Parallel()
	_, checkout := privateClone(t)
	// Two ports held by "another checkout's services", recorded as this checkout's last
	// ones: what `up` finds when the defaults (55432, 56379) are taken.
	held := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		return port
	}
	// A port no server listens on but an outgoing connection holds as its own: the
	// defaults lie inside the kernel's ephemeral range, and a test's connection once
	// held 55432 so, which Postgres then failed to bind.
	connected := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, port, _ := net.SplitHostPort(c.LocalAddr().String())
		return port
	}
	pgHeld, redisHeld := connected(), held()
	if err := os.MkdirAll(filepath.Join(checkout, ".services"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(checkout, ".services", "ports"),
		[]byte("pg="+pgHeld+"\nredis="+redisHeld+"\ncluster=37001 37002 37003\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(checkout, "scripts", "services.sh"), args...)
		cmd.Dir, cmd.Env = checkout, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	env := scriptEnv("SPACE_SERVICES_ONLY=postgres redis")
	t.Cleanup(func() {
		if out, err := script(env, "clean"); err != nil {
			t.Errorf("scripts/services.sh clean: %v\n%s", err, out)
		}
	})

	t.Run("a port set explicitly is never moved: up fails naming it", func(t *testing.T) {
		out, err := script(scriptEnv("SPACE_SERVICES_ONLY=redis", "SPACE_SERVICES_REDIS_PORT="+redisHeld), "up")
		if err == nil || !strings.Contains(out, "port "+redisHeld+" is taken") {
			t.Fatalf("up with a taken explicit port: %v\n%s", err, out)
		}
	})

	t.Run("up takes free ports, and env hands them on", func(t *testing.T) {
		out, err := script(env, "up")
		if err != nil {
			t.Fatalf("up: %v\n%s", err, out)
		}
		for _, p := range []string{pgHeld, redisHeld} {
			if !strings.Contains(out, "port "+p+" is taken") {
				t.Errorf("up did not say it moved from %s:\n%s", p, out)
			}
		}
		vars, err := script(env, "env")
		if err != nil {
			t.Fatal(err)
		}
		url := regexp.MustCompile(`SPACE_TEST_DATABASE_URL='([^']+)'`).FindStringSubmatch(vars)
		addr := regexp.MustCompile(`SPACE_TEST_REDIS_ADDR='([^']+)'`).FindStringSubmatch(vars)
		if url == nil || addr == nil || strings.Contains(url[1], ":"+pgHeld+"/") || strings.HasSuffix(addr[1], ":"+redisHeld) {
			t.Fatalf("env still names the taken ports:\n%s", vars)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url[1])
		if err != nil {
			t.Fatalf("postgres on the port env names: %v", err)
		}
		conn.Close(ctx)
		if c, err := net.DialTimeout("tcp", addr[1], 5*time.Second); err != nil {
			t.Fatalf("redis on the port env names: %v", err)
		} else {
			c.Close()
		}
		again, err := script(env, "up")
		if err != nil || strings.Contains(again, "is taken") {
			t.Fatalf("a second up moved running services: %v\n%s", err, again)
		}
	})
}

// TestUpAfterAnUpKilledHalfwayFinishesTheJob is `up` killed while it waits for a slow
// cluster node, with two nodes (and the standalone Redis) already up on ports set
// explicitly. The next `up` must not take those nodes for another process's ("ports
// ... are taken (set explicitly)", every time): it takes them over and finishes the
// cluster. It also makes anew a cluster left half made by a `--cluster create` cut
// short.
func TestUpAfterAnUpKilledHalfwayFinishesTheJob(t *testing.T) {
	t.Parallel()
	_, checkout := privateClone(t)
	services := filepath.Join(checkout, ".services")
	redisPort, ports := freePort(t), clusterPorts(t)
	env := scriptEnv(
		"SPACE_SERVICES_ONLY=redis cluster",
		"SPACE_SERVICES_REDIS_PORT="+redisPort,
		"SPACE_SERVICES_CLUSTER_PORTS="+strings.Join(ports, " "),
	)
	t.Cleanup(func() { servicesClean(t, checkout, env) })
	nodePID := func(port string) int { return pidFrom(t, filepath.Join(services, "cluster-"+port, "redis.pid")) }
	var redisPID, firstPIDs = 0, map[string]int{}
	// For what must outlive the step that set it up.
	cleanupAtEnd := t.Cleanup

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{{"up is killed while the third node is still starting", func(t *testing.T) {
		// The third node never answers: its "redis-server" is a sleep, which writes its
		// PID to hanging first.
		hanging := filepath.Join(t.TempDir(), "hanging.pid")
		fakeEnv := append(fakeRedisServer(t, env), "FAKE_REDIS_HANG_PORT="+ports[2], "FAKE_REDIS_HANG_PID="+hanging,
			// Long enough that `up` is still waiting when it is killed, however loaded
			// the machine: it cannot give up on the node first.
			"SPACE_SERVICES_WAIT=600")
		logPath := filepath.Join(t.TempDir(), "up.log")
		logFile, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		defer logFile.Close()
		cmd := exec.Command(filepath.Join(checkout, "scripts", "services.sh"), "up")
		cmd.Dir, cmd.Env = checkout, fakeEnv
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		upLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
		// Halfway: the first two nodes answer, the third's process runs.
		deadline := time.Now().Add(2 * time.Minute)
		for !(redisAnswers("127.0.0.1:"+ports[0]) && redisAnswers("127.0.0.1:"+ports[1]) && fileExists(hanging)) {
			select {
			case err := <-done:
				t.Fatalf("up exited (%v) before it was killed:\n%s", err, upLog())
			default:
			}
			if time.Now().After(deadline) {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				t.Fatalf("the first two cluster nodes did not answer within 2m; up says:\n%s", upLog())
			}
			time.Sleep(50 * time.Millisecond)
		}
		// SIGKILL: no trap of the script runs, as when a CI job is cut off. The group is
		// the script and its foreground commands; the servers are in sessions of their own.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-done
		sleeper := pidFrom(t, hanging)
		cleanupAtEnd(func() { killIfNamed(sleeper, "sleep") })
		redisPID = pidFrom(t, filepath.Join(services, "redis", "redis.pid"))
		for _, p := range ports[:2] {
			firstPIDs[p] = nodePID(p)
		}
		t.Logf("up killed; it had said:\n%s", upLog())
	}}, {"up again takes over the running servers and finishes the cluster", func(t *testing.T) {
		// The third node's PID file names a live process, the sleep, which is no server
		// of this checkout's.
		out := servicesUp(t, checkout, env)
		if !strings.Contains(out, "taking over the nodes on "+ports[0]+" "+ports[1]) {
			t.Errorf("up did not say it took over the nodes on %s and %s:\n%s", ports[0], ports[1], out)
		}
		checkCluster(t, ports)
		for p, pid := range firstPIDs {
			if got := nodePID(p); got != pid || exited(pid) {
				t.Errorf("node %s: pid %d now, %d before (exited: %v); want the first up's server, taken over", p, got, pid, exited(pid))
			}
		}
		if got := pidFrom(t, filepath.Join(services, "redis", "redis.pid")); got != redisPID || exited(redisPID) {
			t.Errorf("redis: pid %d now, %d before; want the first up's server, taken over", got, redisPID)
		}
	}}, {"up again makes anew a cluster whose creation was cut short", func(t *testing.T) {
		// What `redis-cli --cluster create` leaves when it is stopped after its first
		// step: nodes that do not know each other, one with a third of the slots.
		for _, p := range ports {
			redisDo(t, "127.0.0.1:"+p, "flushall")
			redisDo(t, "127.0.0.1:"+p, "cluster", "reset", "hard")
		}
		redisDo(t, "127.0.0.1:"+ports[0], "cluster", "addslotsrange", "0", "5460")
		out := servicesUp(t, checkout, env)
		if !strings.Contains(out, "half-made cluster") {
			t.Errorf("up did not say the cluster was half made:\n%s", out)
		}
		checkCluster(t, ports)
	}}}
	for _, step := range steps {
		if !t.Run(step.name, step.run) {
			break
		}
	}
}

// TestAFailedUpStopsWhatItStarted is `up` failing part way, once for a cluster port
// another process holds and once for a cluster node that exits at start: each time it
// says what failed and leaves no server of its own running. Then `up` succeeds.
func TestAFailedUpStopsWhatItStarted(t *testing.T) {
	t.Parallel()
	_, checkout := privateClone(t)
	services := filepath.Join(checkout, ".services")
	pgPort, redisPort, ports := freePort(t), freePort(t), clusterPorts(t)
	env := scriptEnv(
		"SPACE_SERVICES_PG_PORT="+pgPort,
		"SPACE_SERVICES_REDIS_PORT="+redisPort,
		"SPACE_SERVICES_CLUSTER_PORTS="+strings.Join(ports, " "),
	)
	t.Cleanup(func() { servicesClean(t, checkout, env) })
	up := func(env []string) (string, error) {
		cmd := exec.Command(filepath.Join(checkout, "scripts", "services.sh"), "up")
		cmd.Dir, cmd.Env = checkout, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// nothingOfOursRuns checks that no process works in the checkout's .services/ or in
	// Postgres's data directory (a Redis server works in its --dir, a Postgres server
	// in its data directory) and that nothing answers on the services' ports.
	nothingOfOursRuns := func(t *testing.T) {
		t.Helper()
		dirs := []string{services}
		if pgData, err := filepath.EvalSymlinks(filepath.Join(services, "postgres")); err == nil {
			dirs = append(dirs, pgData)
		}
		for _, p := range processesIn(t, dirs...) {
			t.Errorf("still running after a failed up: %s", p)
		}
		for _, p := range append([]string{pgPort, redisPort}, ports...) {
			if c, err := net.DialTimeout("tcp", "127.0.0.1:"+p, time.Second); err == nil {
				c.Close()
				t.Errorf("something still listens on port %s after a failed up", p)
			}
		}
	}

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{{"a cluster port another process holds: up says so and stops Postgres and Redis", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:"+ports[1])
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		out, err := up(env)
		if err == nil {
			t.Fatalf("up succeeded with cluster port %s held by another process:\n%s", ports[1], out)
		}
		for _, want := range []string{"starting postgres", "starting redis", "ports " + ports[1] + " of " + strings.Join(ports, " ") + " (or their bus ports, +10000) are taken by another process (set explicitly)"} {
			if !strings.Contains(out, want) {
				t.Errorf("up did not say %q:\n%s", want, out)
			}
		}
		ln.Close()
		nothingOfOursRuns(t)
	}}, {"a node that exits at start: up names it, shows its log and stops the rest", func(t *testing.T) {
		out, err := up(append(fakeRedisServer(t, env), "FAKE_REDIS_FAIL_PORT="+ports[1]))
		if err == nil {
			t.Fatalf("up succeeded with node %s failing:\n%s", ports[1], out)
		}
		for _, want := range []string{
			"redis cluster-" + ports[1],
			"exited before it answered on 127.0.0.1:" + ports[1],
			"fake redis-server: refusing to start on port " + ports[1], // the end of its log
			"stopping the servers it started",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("up did not say %q:\n%s", want, out)
			}
		}
		nothingOfOursRuns(t)
	}}, {"up then succeeds", func(t *testing.T) {
		servicesUp(t, checkout, env)
		checkCluster(t, ports)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+pgPort+"/space_test?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if !redisAnswers("127.0.0.1:" + redisPort) {
			t.Errorf("redis does not answer on %s", redisPort)
		}
	}}}
	for _, step := range steps {
		if !t.Run(step.name, step.run) {
			break
		}
	}
}

// clusterPorts returns three ports for a Redis Cluster that nothing listens on, nor on
// their bus ports (+10000), below the kernel's ephemeral range as the script's own are.
func clusterPorts(t *testing.T) []string {
	t.Helper()
	var ports []string
	seen := map[int]bool{}
	for len(ports) < 3 {
		p := 12000 + rand.IntN(10000) // bus ports 22000–31999, below 32768
		if seen[p] {
			continue
		}
		seen[p] = true
		if canListen(p) && canListen(p+10000) {
			ports = append(ports, strconv.Itoa(p))
		}
	}
	return ports
}

func canListen(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// fakeRedisServer puts a redis-server first on PATH, in env's copy, that runs the real
// one except on FAKE_REDIS_FAIL_PORT, where it exits at once, and on
// FAKE_REDIS_HANG_PORT, where it writes its PID to the file FAKE_REDIS_HANG_PID and
// becomes a sleep that never answers.
func fakeRedisServer(t *testing.T, env []string) []string {
	t.Helper()
	real, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	script := `#!/bin/sh
case " $* " in
*" --port ${FAKE_REDIS_FAIL_PORT:-none} "*)
  echo "fake redis-server: refusing to start on port $FAKE_REDIS_FAIL_PORT" >&2
  exit 1 ;;
*" --port ${FAKE_REDIS_HANG_PORT:-none} "*)
  echo $$ >"$FAKE_REDIS_HANG_PID.new" && mv "$FAKE_REDIS_HANG_PID.new" "$FAKE_REDIS_HANG_PID"
  exec sleep 3600 ;;
esac
exec ` + real + ` "$@"
`
	if err := os.WriteFile(filepath.Join(bin, "redis-server"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			kv = "PATH=" + bin + string(os.PathListSeparator) + v
		}
		out = append(out, kv)
	}
	return out
}

func servicesUp(t *testing.T, checkout string, env []string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(checkout, "scripts", "services.sh"), "up")
	cmd.Dir, cmd.Env = checkout, env
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/services.sh up: %v\n%s", err, out)
	}
	t.Logf("up took %v:\n%s", time.Since(start).Round(100*time.Millisecond), out)
	return string(out)
}

// servicesClean stops what the script started and deletes the data (Postgres's outside
// the checkout included); t.TempDir removes the rest.
func servicesClean(t *testing.T, checkout string, env []string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(checkout, "scripts", "services.sh"), "clean")
	cmd.Dir, cmd.Env = checkout, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("scripts/services.sh clean: %v\n%s", err, out)
	}
}

func redisAnswers(addr string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err() == nil
}

func redisDo(t *testing.T, addr string, args ...any) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Text()
	if err != nil {
		t.Fatalf("%s: %v: %v", addr, args, err)
	}
	return v
}

// checkCluster checks that every node says the cluster is ok with all 16384 slots and
// the 3 nodes, and that a cluster client writes and reads keys over every node.
func checkCluster(t *testing.T, ports []string) {
	t.Helper()
	var addrs []string
	for _, p := range ports {
		addr := "127.0.0.1:" + p
		addrs = append(addrs, addr)
		info := map[string]string{}
		for _, line := range strings.Split(redisDo(t, addr, "cluster", "info"), "\n") {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
				info[k] = v
			}
		}
		if info["cluster_state"] != "ok" || info["cluster_slots_assigned"] != "16384" || info["cluster_known_nodes"] != "3" {
			t.Errorf("node %s: cluster_state:%s cluster_slots_assigned:%s cluster_known_nodes:%s; want ok, 16384, 3",
				addr, info["cluster_state"], info["cluster_slots_assigned"], info["cluster_known_nodes"])
		}
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Keys spread over the slots, so every node serves some.
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		if err := c.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s on the cluster: %v", key, err)
		}
		if got, err := c.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s on the cluster: %d, %v; want %d", key, got, err, i)
		}
	}
}

// processesIn describes the live processes whose working directory is one of dirs or
// under one.
func processesIn(t *testing.T, dirs ...string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if err != nil || exited(pid) {
			continue
		}
		for _, d := range dirs {
			if cwd == d || strings.HasPrefix(cwd, d+"/") {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				found = append(found, fmt.Sprintf("pid %d (%s) in %s", pid, strings.TrimSpace(string(comm)), cwd))
			}
		}
	}
	return found
}

// killIfNamed kills pid if it still runs the command name, so that a PID reused since
// is left alone.
func killIfNamed(pid int, name string) {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err == nil && strings.TrimSpace(string(comm)) == name {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
