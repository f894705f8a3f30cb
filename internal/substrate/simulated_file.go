package substrate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// fileState keeps the simulated substrate's data in <dir>/state.json, shared by every
// process that points at dir. Each update holds an exclusive flock on <dir>/lock, reads
// the file, applies the change and, when something changed, replaces the file by a
// rename: a process killed at any point leaves either the old data or the new.
type fileState struct {
	dir string
	mu  sync.Mutex // flock serialises processes; this, goroutines of one process
}

func (f *fileState) update(fn func(d *simData) error) (err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return fmt.Errorf("simulated substrate state: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(f.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("simulated substrate state: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("simulated substrate state: lock: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()

	path := filepath.Join(f.dir, "state.json")
	before, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("simulated substrate state: %w", err)
	}
	d := simData{Resources: map[string]*simResource{}, Snapshots: map[string]*simSnapshot{}}
	if len(before) > 0 {
		if err := json.Unmarshal(before, &d); err != nil {
			return fmt.Errorf("simulated substrate state %s: %w", path, err)
		}
	}
	if err := fn(&d); err != nil {
		return err
	}
	after, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("simulated substrate state: %w", err)
	}
	if bytes.Equal(before, after) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, after, 0o644); err != nil {
		return fmt.Errorf("simulated substrate state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("simulated substrate state: %w", err)
	}
	return nil
}
