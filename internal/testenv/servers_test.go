package testenv

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeSource is a serverSource whose environment, engine probe and container starter
// are the test's: the choice between them runs here without Docker.
type fakeSource struct {
	env       map[string]string
	engineErr error
	startErr  error

	probes atomic.Int32
	starts sync.Map // variable → *atomic.Int32
}

func (f *fakeSource) source() *serverSource {
	return &serverSource{
		getenv: func(name string) string { return f.env[name] },
		engine: func(context.Context) error {
			f.probes.Add(1)
			return f.engineErr
		},
		start: func(_ context.Context, variable string) (string, error) {
			n, _ := f.starts.LoadOrStore(variable, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			if f.startErr != nil {
				return "", f.startErr
			}
			return "container-for-" + variable, nil
		},
	}
}

func (f *fakeSource) startsOf(variable string) int32 {
	n, ok := f.starts.Load(variable)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

func TestServerSource(t *testing.T) {
	t.Parallel()

	t.Run("a set variable is used as it is and no engine is asked", func(t *testing.T) {
		t.Parallel()
		f := &fakeSource{env: map[string]string{envRedisAddr: " 127.0.0.1:6379 "}}
		v, err := f.source().get(envRedisAddr)
		if err != nil || v != "127.0.0.1:6379" {
			t.Fatalf("get = %q, %v; want the variable's value", v, err)
		}
		if f.probes.Load() != 0 || f.startsOf(envRedisAddr) != 0 {
			t.Errorf("probed the engine %d times and started %d containers for a set variable", f.probes.Load(), f.startsOf(envRedisAddr))
		}
	})

	t.Run("an unset variable gets a container when an engine answers, started once for the whole process", func(t *testing.T) {
		t.Parallel()
		f := &fakeSource{}
		s := f.source()
		var wg sync.WaitGroup
		values := make([]string, 8)
		for i := range values {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := s.get(envDatabaseURL)
				if err != nil {
					t.Errorf("get: %v", err)
				}
				values[i] = v
			}()
		}
		wg.Wait()
		for _, v := range values {
			if v != "container-for-"+envDatabaseURL {
				t.Fatalf("values %q; want the container's", values)
			}
		}
		if n := f.startsOf(envDatabaseURL); n != 1 {
			t.Errorf("started %d containers for eight tests of one process, want 1", n)
		}
		if _, err := s.get(envClusterAddrs); err != nil {
			t.Fatal(err)
		}
		if f.probes.Load() != 1 || f.startsOf(envClusterAddrs) != 1 {
			t.Errorf("probes %d, cluster containers %d: want one probe for the process and one container per kind", f.probes.Load(), f.startsOf(envClusterAddrs))
		}
	})

	t.Run("an unset variable with no engine fails with the command that starts the services, and nothing starts", func(t *testing.T) {
		t.Parallel()
		f := &fakeSource{engineErr: errors.New("Cannot connect to the Docker daemon")}
		s := f.source()
		for range 2 { // the second test of the process gets the same answer
			_, err := s.get(envClusterAddrs)
			if err == nil {
				t.Fatal("no error without the variable and without an engine")
			}
			for _, want := range []string{envClusterAddrs + " is not set", "no Docker engine answers", "Cannot connect to the Docker daemon", StartCommand} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		}
		if f.startsOf(envClusterAddrs) != 0 || f.probes.Load() != 1 {
			t.Errorf("started %d containers, probed %d times; want none and one", f.startsOf(envClusterAddrs), f.probes.Load())
		}
	})

	t.Run("a container that does not start fails the test with why and with the command", func(t *testing.T) {
		t.Parallel()
		f := &fakeSource{startErr: errors.New("pull access denied")}
		_, err := f.source().get(envRedisAddr)
		if err == nil || !strings.Contains(err.Error(), "pull access denied") || !strings.Contains(err.Error(), StartCommand) {
			t.Fatalf("error %v; want the start's error and the command", err)
		}
	})

	t.Run("the process's source starts a container only for a kind it names", func(t *testing.T) {
		t.Parallel()
		if _, err := startContainer(context.Background(), "SPACE_TEST_NOTHING"); err == nil {
			t.Fatal("a container for an unknown variable")
		}
	})
}

func TestDockerEngineProbe(t *testing.T) {
	t.Parallel()

	t.Run("the probe answers within its timeout, engine or not", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		err := dockerEngineAnswers(ctx)
		// Either answer is right: this only checks that the probe neither hangs nor
		// panics on a machine without an engine (these machines) or with one.
		t.Logf("Docker engine probe: %v", err)
		if ctx.Err() != nil {
			t.Fatalf("the probe ran into its %s timeout", probeTimeout)
		}
	})
}
