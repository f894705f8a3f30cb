package bench

import (
	"context"
	"errors"
	"os/exec"
	"testing"
)

func TestOnFreePorts(t *testing.T) {
	t.Parallel()

	t.Run("a server whose address was taken starts again on new ones", func(t *testing.T) {
		t.Parallel()
		var tried [][]string
		s, err := onFreePorts(2, func(addrs []string) (*apiServer, error) {
			tried = append(tried, addrs)
			if len(tried) < 3 {
				return nil, errAddrTaken
			}
			return &apiServer{Name: "third"}, nil
		})
		if err != nil || s == nil || s.Name != "third" {
			t.Fatalf("onFreePorts = %v, %v; want the third try's server", s, err)
		}
		if len(tried) != 3 || len(tried[0]) != 2 || tried[0][0] == tried[0][1] {
			t.Fatalf("tried %v, want three tries of two distinct addresses", tried)
		}
	})

	t.Run("any other failure is returned at once, and a taken address five times", func(t *testing.T) {
		t.Parallel()
		other := errors.New("bad flag")
		tries := 0
		if _, err := onFreePorts(1, func([]string) (*apiServer, error) { tries++; return nil, other }); !errors.Is(err, other) || tries != 1 {
			t.Fatalf("another failure: %v after %d tries, want it after 1", err, tries)
		}
		tries = 0
		if _, err := onFreePorts(1, func([]string) (*apiServer, error) { tries++; return nil, errAddrTaken }); !errors.Is(err, errAddrTaken) || tries != 5 {
			t.Fatalf("taken every time: %v after %d tries, want errAddrTaken after 5", err, tries)
		}
	})

	t.Run("a process that exits at start because its address is in use is told apart", func(t *testing.T) {
		t.Parallel()
		e := &Env{Dir: t.TempDir()}
		cmd := exec.Command("sh", "-c", "echo 'listen tcp 127.0.0.1:1: bind: address already in use' >&2; exit 1")
		if _, err := e.startProcess(context.Background(), "taken", "taken", cmd, "http://127.0.0.1:1", ""); !errors.Is(err, errAddrTaken) {
			t.Fatalf("startProcess = %v, want errAddrTaken", err)
		}
		cmd = exec.Command("sh", "-c", "echo 'SPACE_HTTP_ADDR: not an address' >&2; exit 1")
		if _, err := e.startProcess(context.Background(), "bad", "bad", cmd, "http://127.0.0.1:1", ""); err == nil || errors.Is(err, errAddrTaken) {
			t.Fatalf("startProcess = %v, want an error that is not errAddrTaken", err)
		}
	})
}
