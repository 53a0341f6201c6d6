package qemu

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// fakeGuest is a running instance whose QEMU is a fakeQMP: it counts power
// button presses (system_powerdown) and powers off on the offAt'th press
// (0: never, a guest that ignores the button); quit ends it too.
type fakeGuest struct {
	in      *instance
	p       *vmProc
	qmp     *fakeQMP
	presses atomic.Int32
	exit    sync.Once
}

func startFakeGuest(t *testing.T, r *Runtime, id string, offAt int32) *fakeGuest {
	t.Helper()
	g := &fakeGuest{}
	// end is what the monitor does once QEMU is gone: record the exit.
	end := func(conn net.Conn, reason string, w *json.Encoder) {
		g.exit.Do(func() {
			_ = w.Encode(map[string]any{"event": "SHUTDOWN", "data": map[string]any{"guest": reason == "guest-shutdown", "reason": reason}})
			_ = conn.Close()
			go r.exited(g.in, g.p)
		})
	}
	g.qmp = newFakeQMP(t, false, func(w *json.Encoder, cmd string, id json.RawMessage, conn net.Conn) {
		_ = w.Encode(map[string]any{"return": map[string]any{}, "id": id})
		switch cmd {
		case "system_powerdown":
			if n := g.presses.Add(1); n == offAt {
				end(conn, "guest-shutdown", w)
			}
		case "quit":
			end(conn, "host-qmp-quit", w)
		}
	})
	dir := filepath.Join(r.instDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// pid 0 is never "alive": the hard stop's SIGKILL has nothing to kill.
	g.p = newProc(0, g.qmp.path, discardLog())
	c, err := dialQMP(context.Background(), g.qmp.path, 2*time.Second, g.p.onEvent)
	if err != nil {
		t.Fatal(err)
	}
	g.p.setClient(c)
	g.in = &instance{id: id, dir: dir, spec: runtime.Spec{ID: id}, proc: g.p,
		st: persisted{State: runtime.StateRunning}}
	r.put(g.in)
	t.Cleanup(func() { g.p.detach(); _ = c.Close() })
	return g
}

func (g *fakeGuest) sawQuit() bool {
	g.qmp.mu.Lock()
	defer g.qmp.mu.Unlock()
	return slices.Contains(g.qmp.seen, "quit")
}

// A guest that misses the first presses (still booting, its button
// listener not up yet) is pressed again until it powers off: a graceful
// stop, not a hard one.
func TestStopPressesPowerButtonAgain(t *testing.T) {
	r := newTestRuntime(t, shortDir(t), nil)
	g := startFakeGuest(t, r, "late", 3)
	graceful := 8 * time.Second
	res, err := r.Stop(context.Background(), "late", graceful)
	if err != nil {
		t.Fatal(err)
	}
	if res.HardStopped || g.sawQuit() {
		t.Fatalf("stop = %+v (quit sent: %v) after %d presses; want a graceful stop on the 3rd press",
			res, g.sawQuit(), g.presses.Load())
	}
	if n := g.presses.Load(); n != 3 {
		t.Errorf("%d presses, want 3", n)
	}
	// Presses at 0, 1s and 3s (powerdownFirst, then doubling).
	if res.Took < powerdownFirst+2*powerdownFirst || res.Took > graceful {
		t.Errorf("took %v, want about 3s", res.Took)
	}
	if st := g.in.status(); st.State != runtime.StateStopped {
		t.Errorf("state %s, want stopped", st.State)
	}
}

// A guest that ignores the button is pressed until the graceful deadline,
// then quit: HardStopped.
func TestStopPressesUntilDeadlineThenStopsHard(t *testing.T) {
	r := newTestRuntime(t, shortDir(t), nil)
	g := startFakeGuest(t, r, "deaf", 0)
	graceful := 4500 * time.Millisecond
	res, err := r.Stop(context.Background(), "deaf", graceful)
	if err != nil {
		t.Fatal(err)
	}
	if !res.HardStopped || !g.sawQuit() || res.Took < graceful {
		t.Fatalf("stop = %+v (quit sent: %v), want HardStopped by quit after ≥ %v", res, g.sawQuit(), graceful)
	}
	// Presses at 0, 1s, 3s; the next would be at 5s, past the deadline.
	if n := g.presses.Load(); n != 3 {
		t.Errorf("%d presses within %v, want 3", n, graceful)
	}
	if st := g.in.status(); st.State != runtime.StateStopped {
		t.Errorf("state %s, want stopped", st.State)
	}
}

// A ctx that ends cuts the presses short: the stop goes hard at once.
func TestStopCtxEndsPresses(t *testing.T) {
	r := newTestRuntime(t, shortDir(t), nil)
	g := startFakeGuest(t, r, "ctx", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	res, err := r.Stop(ctx, "ctx", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !res.HardStopped || res.Took > 10*time.Second {
		t.Fatalf("stop = %+v, want HardStopped soon after the ctx ended", res)
	}
	if n := g.presses.Load(); n != 2 {
		t.Errorf("%d presses before the ctx ended, want 2 (at 0 and 1s)", n)
	}
}
