package bench

import (
	"context"
	"errors"
	"os/exec"
	"testing"

	"github.com/space-sandbox/space/internal/testenv"
)

func TestStartProcess(t *testing.T) {
	t.Parallel()

	t.Run("a process that exits at start because its address is in use is told apart", func(t *testing.T) {
		t.Parallel()
		e := &Env{Dir: t.TempDir()}
		cmd := exec.Command("sh", "-c", "echo 'listen tcp 127.0.0.1:1: bind: address already in use' >&2; exit 1")
		if _, err := e.startProcess(context.Background(), "taken", "taken", cmd, "http://127.0.0.1:1", ""); !errors.Is(err, testenv.ErrPortTaken) {
			t.Fatalf("startProcess = %v, want testenv.ErrPortTaken", err)
		}
		cmd = exec.Command("sh", "-c", "echo 'SPACE_HTTP_ADDR: not an address' >&2; exit 1")
		if _, err := e.startProcess(context.Background(), "bad", "bad", cmd, "http://127.0.0.1:1", ""); err == nil || errors.Is(err, testenv.ErrPortTaken) {
			t.Fatalf("startProcess = %v, want an error that is not testenv.ErrPortTaken", err)
		}
	})
}
