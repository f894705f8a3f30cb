package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

// serveEnv is the variable that turns the test binary into a space-api replica: the
// tests that need several processes (one killed mid-burst, one drained by SIGTERM)
// start the test binary itself with it, so no second build is needed.
const serveEnv = "SPACE_TEST_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := Run(ctx, []string{"serve"}, os.Getenv, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "space-api replica:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := runCheckingOpenAPI(m)
	removePreviousRelease()
	os.Exit(code)
}

// replica is a space-api serving in a process of its own: the test binary started with
// serveEnv.
type replica struct {
	t        *testing.T
	name     string
	cmd      *exec.Cmd
	public   string // base URL
	internal string
	logs     *testenv.Buffer
	done     chan error
	// release is the release a replica of another release's binary runs ("": this
	// code's).
	release string
}

// startReplica starts a replica with env (SPACE_* variables) plus listeners of its
// own, and waits until it is ready. It is killed when the test ends; its output goes to
// the test's log if the test failed.
func startReplica(t *testing.T, name string, env map[string]string) *replica {
	t.Helper()
	return startReplicaCmd(t, name, func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = []string{serveEnv + "=1"}
		return cmd
	}, env)
}

// startReplicaCmd is startReplica for a replica that the command newCmd makes serves
// (this code, or another release's binary): its Env gets env, the listeners and what
// startReplica passes on. A listener's port taken between testenv.FreeAddr and the
// replica's listen (by any socket of the machine: an outgoing connection's local port
// too) is retried on other ports.
func startReplicaCmd(t *testing.T, name string, newCmd func() *exec.Cmd, env map[string]string) *replica {
	t.Helper()
	r, err := testenv.OnFreePorts(2, 3, func(addrs []string) (*replica, error) {
		r, err := startReplicaOnce(t, name, newCmd(), env, addrs[0], addrs[1])
		if err != nil && testenv.PortTaken(r.logs.String()) {
			t.Logf("replica %s: a port was taken before it listened; again on others", name)
			return r, fmt.Errorf("%w: %w", testenv.ErrPortTaken, err)
		}
		return r, err
	})
	if err != nil {
		t.Fatalf("replica %s exited before it was ready: %v\n%s", name, err, r.logs.String())
	}
	return r
}

// startReplicaOnce starts cmd as startReplicaCmd does, listening on public and
// internal, and returns the replica once it is ready, or with the error it exited with
// before.
func startReplicaOnce(t *testing.T, name string, cmd *exec.Cmd, env map[string]string, public, internal string) (*replica, error) {
	t.Helper()
	cmd.Env = append(cmd.Env, "SPACE_HTTP_ADDR="+public, "SPACE_INTERNAL_HTTP_ADDR="+internal)
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "GORACE"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	r := &replica{t: t, name: name, cmd: cmd, public: "http://" + public, internal: "http://" + internal,
		logs: &testenv.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = r.logs, r.logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start replica %s: %v", name, err)
	}
	go func() { r.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("replica %s output:\n%s", name, r.logs.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(r.public + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r, nil
			}
		}
		select {
		case err := <-r.done:
			r.done <- err
			if err == nil {
				err = errors.New("exit status 0")
			}
			return r, err
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not ready within a minute:\n%s", name, r.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill ends the replica at once (SIGKILL), as a crash or an OOM kill does.
func (r *replica) kill() {
	_ = r.cmd.Process.Kill()
	err := <-r.done
	r.done <- err
}

// terminate sends SIGTERM, as Kubernetes does, and returns the exit error once the
// replica has exited.
func (r *replica) terminate() error {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	err := <-r.done
	r.done <- err
	return err
}

// replicaEnv is the configuration shared by the replicas of one test: one database, one
// Redis key prefix, one simulated substrate (a state directory), the test's flags.
func replicaEnv(t *testing.T, flags string, extra map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{
		"SPACE_DATABASE_URL":                            testenv.DatabaseURL(t),
		"SPACE_REDIS_ADDRS":                             testenv.RedisAddr(t),
		"SPACE_REDIS_KEY_PREFIX":                        testenv.Prefix(t),
		"SPACE_REDIS_TIMEOUT":                           "2s",
		"SPACE_TEMPLATES_FILE":                          testenv.WriteFile(t, "templates.json", testTemplates),
		"SPACE_AUTH_MODE":                               "trusted_header",
		"SPACE_TRUSTED_PROXY_CIDRS":                     "127.0.0.1/32",
		"SPACE_SIMULATED_STATE_DIR":                     t.TempDir(),
		"SPACE_LOG_LEVEL":                               "warn",
		"SPACE_DISPATCHER_WORKERS":                      "2",
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": "1000",
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      "10000",
	}
	if flags != "" {
		env["SPACE_FLAGS_FILE"] = testenv.WriteFile(t, "flags.json", flags)
		env["SPACE_FLAGS_POLL_INTERVAL"] = "100ms"
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// envString renders env for a failure message.
func envString(env map[string]string) string {
	var b strings.Builder
	for k, v := range env {
		fmt.Fprintf(&b, "%s=%s ", k, v)
	}
	return b.String()
}
