package qemu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// TestRecoverFromDisk covers instances whose QEMU is not running: no
// process is needed.
func TestRecoverFromDisk(t *testing.T) {
	root := shortDir(t)
	r := newTestRuntime(t, root, nil)
	write := func(id string, spec *runtime.Spec, st *persisted, pidFile bool) string {
		dir := filepath.Join(r.instDir, id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if spec != nil {
			b, _ := json.Marshal(spec)
			if err := os.WriteFile(filepath.Join(dir, specFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if st != nil {
			b, _ := json.Marshal(st)
			if err := os.WriteFile(filepath.Join(dir, stateFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if pidFile {
			// Our own pid: alive, but its command line has no QMP socket of
			// this instance, as after pid reuse.
			if err := os.WriteFile(filepath.Join(dir, pidFileName), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	spec := func(id string) *runtime.Spec {
		s := baseSpec()
		s.ID, s.Owner = id, "slice"
		return &s
	}
	write("died", spec("died"), &persisted{State: runtime.StateRunning, PID: os.Getpid()}, true)
	write("stopping", spec("stopping"), &persisted{State: runtime.StateRunning, StopRequested: true}, false)
	write("idle", spec("idle"), &persisted{State: runtime.StateCreated}, false)
	half := write("half", nil, &persisted{State: runtime.StateCreated}, false)
	halfOverlay := filepath.Join(r.overlayDir, "half.qcow2")
	if err := os.WriteFile(halfOverlay, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.instDir, "not-a-dir"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	list, err := r.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.Status{}
	for _, st := range list {
		got[st.ID] = st
	}
	if len(got) != 3 {
		t.Fatalf("recovered %v, want died, stopping and idle", list)
	}
	if st := got["died"]; st.State != runtime.StateCrashed || st.Adopted || st.PID != 0 || st.ExitDetail == "" || st.Owner != "slice" {
		t.Errorf("died = %+v, want crashed, not adopted", st)
	}
	if _, err := os.Stat(filepath.Join(r.instDir, "died", pidFileName)); !os.IsNotExist(err) {
		t.Error("stale pid file kept")
	}
	if st := got["stopping"]; st.State != runtime.StateStopped {
		t.Errorf("stopping = %+v, want stopped", st)
	}
	if st := got["idle"]; st.State != runtime.StateCreated {
		t.Errorf("idle = %+v, want created", st)
	}
	for _, p := range []string{half, halfOverlay} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("half-created %s kept", p)
		}
	}
	// The verdict is persisted.
	st, err := readState(filepath.Join(r.instDir, "died"))
	if err != nil || st.State != runtime.StateCrashed {
		t.Errorf("persisted state %+v, %v", st, err)
	}
}
