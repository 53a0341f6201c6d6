package qemu

import (
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/runtimetest"
)

// TestConformance runs the runtime.Runtime conformance suite against real
// QEMU (TCG) with the qemutest guest.
func TestConformance(t *testing.T) {
	e := newRealEnv(t)
	var mu sync.Mutex
	type entry struct {
		r    *Runtime
		root string
	}
	byTest := map[*testing.T]entry{}
	newRT := func(t *testing.T) runtime.Runtime {
		env := realEnv{g: e.g, root: shortDir(t)}
		r := env.runtime(t)
		mu.Lock()
		byTest[t] = entry{r, env.root}
		mu.Unlock()
		return r
	}
	reopen := func(t *testing.T) runtime.Runtime {
		mu.Lock()
		defer mu.Unlock()
		old, ok := byTest[t]
		if !ok {
			t.Fatal("Reopen before newRT")
		}
		// The old agent exits: it lets go of its QMP connections.
		if err := old.r.Close(); err != nil {
			t.Fatal(err)
		}
		r := realEnv{g: e.g, root: old.root}.runtime(t)
		byTest[t] = entry{r, old.root}
		return r
	}
	runtimetest.Run(t, newRT, func(t *testing.T, id string) runtime.Spec { return e.spec(id) },
		runtimetest.Options{ReadyTimeout: readyTimeout, Graceful: 30 * time.Second, Reopen: reopen})
}
