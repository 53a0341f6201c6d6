package agent_test

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
)

// The Windows service's Running comes from WithReadyHook, called once the
// agent has enrolled and started its loops (where systemd gets READY=1).
func TestServiceReadyHookAfterEnrolment(t *testing.T) {
	f := newFakeCP(t)
	ready := make(chan struct{}, 2)
	r := startAgent(t, f, t.TempDir(), (&counter{}).handlers(), agent.WithReadyHook(func() { ready <- struct{}{} }))
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
		t.Fatal("ready hook not called")
	}
	r.stop(t)
	if len(ready) != 0 {
		t.Error("ready hook called more than once")
	}
}
