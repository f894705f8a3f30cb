// Package kubebin builds the etcd and kube-apiserver the tests run (internal/testenv/kubeenv),
// and the kube-scheduler and kwok of the fleet tests, from their Go modules, each pinned
// by a module of its own under tools/ (tools/etcd, tools/kube-apiserver,
// tools/kube-scheduler, tools/kwok), and caches them per machine: the first build of
// kube-apiserver costs minutes of CPU, every later run finds the binary. It imports nothing but the
// standard library, so that `make test` can start the build at once, before anything
// else compiles.
package kubebin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// BuildCommand is what a developer runs to build (or find) the binaries by hand; it
// prints their paths.
const BuildCommand = "go run ./internal/testenv/kubebin/cmd/kube-binaries"

// BuildTimeout bounds one build. A cold kube-apiserver is about 6 CPU-minutes; on 2
// cores shared with a test suite it can take four times that.
const BuildTimeout = 45 * time.Minute

// tool is one binary built from a module under tools/.
type tool struct {
	// name is the binary's name and the tools/ directory of its module.
	name string
	// module is the module whose version keys the cache (read from tools/<name>/go.mod).
	module string
	// pkg is the main package to build.
	pkg string
	// ldflags stamp the version where the binary reports one ("%s" is the version).
	ldflags string
}

var (
	etcdTool = tool{name: "etcd", module: "go.etcd.io/etcd/server/v3", pkg: "go.etcd.io/etcd/server/v3", ldflags: "-s -w"}
	// kube-apiserver reports the version it was stamped with (GET /version, and the
	// emulation version it derives from it); unstamped it would say v0.0.0.
	apiserverTool = tool{name: "kube-apiserver", module: "k8s.io/kubernetes", pkg: "k8s.io/kubernetes/cmd/kube-apiserver",
		ldflags: "-s -w -X k8s.io/component-base/version.gitVersion=%[1]s -X k8s.io/component-base/version.gitMajor=%[2]s -X k8s.io/component-base/version.gitMinor=%[3]s"}
	// kube-scheduler is built from the same k8s.io/kubernetes as kube-apiserver (its
	// module, tools/kube-scheduler, pins the same versions), so most of its packages
	// are already in Go's build cache when kube-apiserver was built first.
	schedulerTool = tool{name: "kube-scheduler", module: "k8s.io/kubernetes", pkg: "k8s.io/kubernetes/cmd/kube-scheduler",
		ldflags: apiserverTool.ldflags}
	kwokTool = tool{name: "kwok", module: "sigs.k8s.io/kwok", pkg: "sigs.k8s.io/kwok/cmd/kwok",
		ldflags: "-s -w"}
)

// Fleet are the paths of the fleet tests' kube-scheduler and kwok (FindOrBuildFleet).
type Fleet struct {
	Scheduler, Kwok string
	// SchedulerVersion and KwokVersion are the module versions they were built from.
	SchedulerVersion, KwokVersion string
}

// FindOrBuildFleet returns the cached kube-scheduler and kwok, building whichever is
// missing, as FindOrBuild does the servers. Only the fleet tests need them; the
// background build of `make test` builds them after the servers, so that the tests
// waiting on the servers do not wait on these too.
func FindOrBuildFleet(ctx context.Context, log func(format string, args ...any)) (Fleet, error) {
	root, err := repoRoot()
	if err != nil {
		return Fleet{}, err
	}
	cache, err := cacheDir()
	if err != nil {
		return Fleet{}, err
	}
	var f Fleet
	f.Scheduler, f.SchedulerVersion, err = findOrBuild(ctx, root, cache, schedulerTool, log)
	if err != nil {
		return Fleet{}, err
	}
	f.Kwok, f.KwokVersion, err = findOrBuild(ctx, root, cache, kwokTool, log)
	if err != nil {
		return Fleet{}, err
	}
	return f, nil
}

// Binaries are the paths of the built servers.
type Binaries struct {
	Etcd, APIServer string
	// EtcdVersion and APIServerVersion are the module versions they were built from.
	EtcdVersion, APIServerVersion string
}

// FindOrBuild returns the cached binaries, building whichever is missing. It is safe
// to call from several processes at once: each build runs under a file lock, and a
// process that finds the lock taken waits for the build and uses its result. log, when
// not nil, is told when a build starts and ends.
func FindOrBuild(ctx context.Context, log func(format string, args ...any)) (Binaries, error) {
	root, err := repoRoot()
	if err != nil {
		return Binaries{}, err
	}
	cache, err := cacheDir()
	if err != nil {
		return Binaries{}, err
	}
	var b Binaries
	b.Etcd, b.EtcdVersion, err = findOrBuild(ctx, root, cache, etcdTool, log)
	if err != nil {
		return Binaries{}, err
	}
	b.APIServer, b.APIServerVersion, err = findOrBuild(ctx, root, cache, apiserverTool, log)
	if err != nil {
		return Binaries{}, err
	}
	return b, nil
}

// cacheDir is ${XDG_CACHE_HOME:-$HOME/.cache}/space/kube: outside the checkout, so
// that every checkout and worktree of the machine shares one build.
func cacheDir() (string, error) {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("kube binaries: no cache directory (set XDG_CACHE_HOME or HOME): %w", err)
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "space", "kube"), nil
}

// findOrBuild returns tl's binary under cache/<name>-<version>-<hash>/, building it
// there first when it is missing. The hash is of the tool module's go.mod and go.sum,
// so that a changed replace or dependency is a new build, not a stale binary.
func findOrBuild(ctx context.Context, root, cache string, tl tool, log func(string, ...any)) (path, version string, err error) {
	modDir := filepath.Join(root, "tools", tl.name)
	version, key, err := toolVersion(modDir, tl.module)
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(cache, tl.name+"-"+version+"-"+key)
	path = filepath.Join(dir, tl.name)
	if runnable(path) {
		return path, version, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("kube binaries: %w", err)
	}
	unlock, err := lockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return "", "", err
	}
	defer unlock()
	if runnable(path) { // built by the process that held the lock
		return path, version, nil
	}
	if log != nil {
		log("building %s %s from its Go module (tools/%s) into %s; minutes the first time on this machine", tl.name, version, tl.name, dir)
	}
	began := time.Now()
	if err := build(ctx, modDir, dir, path, tl, version); err != nil {
		return "", "", err
	}
	if log != nil {
		log("built %s %s in %s", tl.name, version, time.Since(began).Round(time.Second))
	}
	return path, version, nil
}

func build(ctx context.Context, modDir, dir, path string, tl tool, version string) error {
	ctx, cancel := context.WithTimeout(ctx, BuildTimeout)
	defer cancel()
	ldflags := tl.ldflags
	if strings.Contains(ldflags, "%") {
		major, minor := majorMinor(version)
		ldflags = fmt.Sprintf(ldflags, version, major, minor)
	}
	tmp := path + ".tmp"
	logPath := filepath.Join(dir, "build.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("kube binaries: %w", err)
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", tmp, tl.pkg)
	cmd.Dir = modDir
	// Static, so that no C toolchain is needed, and outside the caller's GOFLAGS (a
	// -race there would slow the server down for nothing).
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	began := time.Now()
	if err := cmd.Run(); err != nil {
		tail, _ := os.ReadFile(logPath)
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return fmt.Errorf("build %s %s in tools/%s failed (%w); its log is %s, run it by hand with\n\t%s\n%s",
			tl.name, version, tl.name, err, logPath, BuildCommand, tail)
	}
	fmt.Fprintf(logFile, "built in %s\n", time.Since(began).Round(time.Second))
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("kube binaries: %w", err)
	}
	return nil
}

// toolVersion reads the version of module from the go.mod of modDir, and a short
// hash of that go.mod and its go.sum.
func toolVersion(modDir, module string) (version, hash string, err error) {
	gomod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return "", "", fmt.Errorf("kube binaries: %w", err)
	}
	gosum, err := os.ReadFile(filepath.Join(modDir, "go.sum"))
	if err != nil {
		return "", "", fmt.Errorf("kube binaries: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(f) >= 2 && f[0] == module {
			version = f[1]
			break
		}
	}
	if version == "" {
		return "", "", fmt.Errorf("kube binaries: %s/go.mod does not require %s", modDir, module)
	}
	sum := sha256.Sum256(append(gomod, gosum...))
	return version, hex.EncodeToString(sum[:4]), nil
}

// majorMinor splits v1.37.2 into "1" and "37".
func majorMinor(version string) (string, string) {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return "", ""
	}
	return parts[0], parts[1]
}

func runnable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// lockFile takes an exclusive lock on path, waiting for another process to release
// it; the returned function releases it.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kube binaries: lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("kube binaries: lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// repoRoot is the directory of space-api's go.mod: found upwards from the working
// directory (a test runs in its package's directory, the build command in the
// checkout), else from this source file.
func repoRoot() (string, error) {
	isRoot := func(dir string) bool {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		return err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module github.com/space-sandbox/space\n"))
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if isRoot(dir) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", errors.New("kube binaries: the space-api checkout (its go.mod) was not found above the working directory")
}
