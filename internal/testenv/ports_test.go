package testenv

import (
	"errors"
	"testing"
)

func TestOnFreePorts(t *testing.T) {
	t.Parallel()

	t.Run("a server whose port was taken starts again on new ones", func(t *testing.T) {
		t.Parallel()
		var tried [][]string
		v, err := OnFreePorts(2, 5, func(addrs []string) (string, error) {
			tried = append(tried, addrs)
			if len(tried) < 3 {
				return "", ErrPortTaken
			}
			return "third", nil
		})
		if err != nil || v != "third" {
			t.Fatalf("OnFreePorts = %q, %v; want the third try's", v, err)
		}
		if len(tried) != 3 || len(tried[0]) != 2 || tried[0][0] == tried[0][1] {
			t.Fatalf("tried %v, want three tries of two distinct addresses", tried)
		}
	})

	t.Run("any other failure is returned at once, and a taken port after the last try", func(t *testing.T) {
		t.Parallel()
		other := errors.New("bad flag")
		tries := 0
		if _, err := OnFreePorts(1, 5, func([]string) (int, error) { tries++; return 0, other }); !errors.Is(err, other) || tries != 1 {
			t.Fatalf("another failure: %v after %d tries, want it after 1", err, tries)
		}
		tries = 0
		if _, err := OnFreePorts(1, 5, func([]string) (int, error) { tries++; return 0, ErrPortTaken }); !errors.Is(err, ErrPortTaken) || tries != 5 {
			t.Fatalf("taken every time: %v after %d tries, want ErrPortTaken after 5", err, tries)
		}
	})

	t.Run("a log saying the address is in use is a port taken", func(t *testing.T) {
		t.Parallel()
		if !PortTaken("space-api: listen SPACE_HTTP_ADDR 127.0.0.1:1: listen tcp 127.0.0.1:1: bind: address already in use") {
			t.Fatal("a bind failure not told as a port taken")
		}
		if PortTaken("SPACE_HTTP_ADDR: not an address") {
			t.Fatal("another failure told as a port taken")
		}
	})
}
