//go:build !windows

package statedir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestPermissions(t *testing.T) {
	old := syscall.Umask(0o022) // the usual umask; Open must not depend on it
	defer syscall.Umask(old)

	path := filepath.Join(t.TempDir(), "state")
	d := openT(t, path)
	if _, err := d.NodeID(""); err != nil {
		t.Fatal(err)
	}
	if err := d.SaveIdentity(testIdentity(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Begin("perm-task", "", t0.Add(time.Hour), t0); err != nil {
		t.Fatal(err)
	}
	if err := d.SaveResult("perm-task", result("x")); err != nil {
		t.Fatal(err)
	}
	want := map[string]fs.FileMode{
		path:                                           0o700,
		filepath.Join(path, "tasks"):                   0o700,
		filepath.Join(path, "node_id"):                 0o600,
		filepath.Join(path, "identity.json"):           0o600,
		filepath.Join(path, "tasks", "perm-task.json"): 0o600,
	}
	for p, m := range want {
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if got := fi.Mode().Perm(); got != m {
			t.Errorf("%s mode = %#o, want %#o", p, got, m)
		}
	}
}

func TestOpenRefusesWritableByOthers(t *testing.T) {
	tests := []struct {
		mode    fs.FileMode
		wantErr bool
	}{
		{0o700, false},
		{0o750, false},
		{0o755, false},
		{0o770, true},
		{0o720, true},
		{0o702, true},
		{0o777, true},
	}
	for _, tc := range tests {
		path := filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tc.mode); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path)
		if got := errors.Is(err, ErrInsecure); got != tc.wantErr {
			t.Errorf("Open(dir mode %#o) err = %v, want insecure=%v", tc.mode, err, tc.wantErr)
		}
	}
	// tasks/ is checked too.
	path := filepath.Join(t.TempDir(), "state")
	openT(t, path)
	if err := os.Chmod(filepath.Join(path, "tasks"), 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); !errors.Is(err, ErrInsecure) {
		t.Errorf("Open with a world-writable tasks dir: %v", err)
	}
}
