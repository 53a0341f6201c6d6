package qemu

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestRealForwardPortTakenIsChosenAgain: a host port chosen for a forward
// that someone else binds before QEMU does (here: the test, holding the
// first port the picker hands out) fails QEMU's start-up; Start chooses
// the ports again and the instance boots with another one.
func TestRealForwardPortTakenIsChosenAgain(t *testing.T) {
	e := newRealEnv(t)
	if !e.g.CanNetwork {
		t.Skip("test kernel has no virtio-net modules")
	}
	ctx := context.Background()
	r := e.runtime(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	var picks atomic.Int32
	r.pickPorts = func(fwds []api.PortForward) (map[string]int, error) {
		if picks.Add(1) == 1 {
			return map[string]int{"http": takenPort}, nil
		}
		return pickPorts(fwds)
	}
	const id = "fwd-taken"
	destroyAtEnd(t, r, id)
	spec := e.spec(id, qemutest.KnobListen+"=8080")
	spec.Ports = []api.PortForward{{Name: "http", GuestPort: 8080}}
	if _, err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	st, err := r.Start(ctx, id)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if n := picks.Load(); n != 2 {
		t.Errorf("ports chosen %d times, want 2", n)
	}
	if st.State != runtime.StateRunning || st.Ports["http"] == 0 || st.Ports["http"] == takenPort {
		t.Fatalf("after the retry: %s ports %v (taken %d)", st.State, st.Ports, takenPort)
	}
}
