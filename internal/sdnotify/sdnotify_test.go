package sdnotify

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/sdnotify/sdnotifytest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestNotifyNoSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "100000")
	n := New(quiet())
	if n.Enabled() || n.WatchdogInterval() != 0 {
		t.Fatalf("enabled=%v watchdog=%s without NOTIFY_SOCKET", n.Enabled(), n.WatchdogInterval())
	}
	done := make(chan struct{})
	go func() {
		n.Run(context.Background(), make(chan struct{}), func() string { return "" },
			func(context.Context) error { return nil })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run blocked without NOTIFY_SOCKET")
	}
	n.Ready("x") // no socket, no panic
}

func TestNotifyReadyWatchdogStopping(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", sock.Path)
	t.Setenv("WATCHDOG_USEC", "200000") // pings every 100ms
	t.Setenv("WATCHDOG_PID", "")
	n := New(quiet())
	if !n.Enabled() || n.WatchdogInterval() != 200*time.Millisecond {
		t.Fatalf("enabled=%v watchdog=%s", n.Enabled(), n.WatchdogInterval())
	}
	var sick atomic.Bool
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx, ready, func() string { return "serving" }, func(context.Context) error {
			if sick.Load() {
				return errors.New("loops stalled")
			}
			return nil
		})
	}()
	time.Sleep(150 * time.Millisecond)
	if got := sock.Drain(); len(got) != 0 {
		t.Fatalf("sent %q before ready", got)
	}
	close(ready)
	if m, _ := sock.Wait(t, "READY=1", 2*time.Second); !strings.Contains(m, "STATUS=serving") {
		t.Fatalf("READY without status: %q", m)
	}
	sock.Wait(t, "WATCHDOG=1", 2*time.Second)
	sock.Wait(t, "WATCHDOG=1", 2*time.Second)

	sick.Store(true)
	sock.Wait(t, "STATUS=unhealthy: loops stalled", 2*time.Second)
	time.Sleep(350 * time.Millisecond)
	for _, m := range sock.Drain() {
		if strings.Contains(m, "WATCHDOG=1") {
			t.Fatalf("watchdog pinged while the health check fails: %q", m)
		}
	}
	sick.Store(false)
	sock.Wait(t, "WATCHDOG=1", 2*time.Second)

	cancel()
	sock.Wait(t, "STOPPING=1", 2*time.Second)
	<-done
}

func TestNotifyWatchdogForAnotherPID(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", sock.Path)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", "1") // the watchdog is some other process's
	if n := New(quiet()); n.WatchdogInterval() != 0 {
		t.Fatalf("watchdog %s for another pid", n.WatchdogInterval())
	}
}

func TestNotifyHealthCheckThatHangsFails(t *testing.T) {
	err := check(context.Background(), 50*time.Millisecond, func(context.Context) error {
		select {} // ignores its context
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}
