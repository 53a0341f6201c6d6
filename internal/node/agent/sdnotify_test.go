package agent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/sdnotify/sdnotifytest"
)

// Under systemd (Type=notify) the agent says READY=1 once it is enrolled
// and its loops run, pings the watchdog while it is alive, and says
// STOPPING=1 when it stops.
func TestNotifyAgentReadyWatchdogStopping(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", sock.Path)
	t.Setenv("WATCHDOG_USEC", "400000") // pings every 200ms
	t.Setenv("WATCHDOG_PID", "")
	f := newFakeCP(t)
	r := startAgent(t, f, t.TempDir(), (&counter{}).handlers())
	m, _ := sock.Wait(t, "READY=1", 5*time.Second)
	if !strings.Contains(m, "STATUS=node "+testNodeID+": ") {
		t.Fatalf("READY=1 without the node's status: %q", m)
	}
	m, _ = sock.Wait(t, "WATCHDOG=1", 5*time.Second)
	if !strings.Contains(m, "control plane "+f.srv.URL) {
		t.Fatalf("watchdog ping without status: %q", m)
	}
	r.stop(t)
	sock.Wait(t, "STOPPING=1", 5*time.Second)
}

// Without NOTIFY_SOCKET the agent sends nothing and runs as before.
func TestNotifyAgentWithoutSocket(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", "")
	f := newFakeCP(t)
	r := startAgent(t, f, t.TempDir(), (&counter{}).handlers())
	r.stop(t)
	if got := sock.Drain(); len(got) != 0 {
		t.Fatalf("notifications without NOTIFY_SOCKET: %q", got)
	}
}
