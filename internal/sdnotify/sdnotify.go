// Package sdnotify tells a service manager that speaks the sd_notify
// protocol (systemd's Type=notify) how the process is doing: READY=1 once
// it serves, STATUS= lines saying what it does, WATCHDOG=1 keep-alives
// while its own health check passes, and STOPPING=1 on shutdown.
//
// Everything is a no-op when NOTIFY_SOCKET is unset: not started by
// systemd, or a platform without it (the protocol code is pure Go and
// builds everywhere).
package sdnotify

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// statusEvery is how often STATUS= is refreshed when there is no watchdog
// (or a longer one).
const statusEvery = 30 * time.Second

// Notifier sends notifications to the socket in NOTIFY_SOCKET.
type Notifier struct {
	log      *slog.Logger
	enabled  bool
	watchdog time.Duration // WATCHDOG_USEC for this process; 0 when off
}

// New reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID from the
// environment. A malformed watchdog setting is logged and turns the
// watchdog off.
func New(log *slog.Logger) *Notifier {
	n := &Notifier{log: log, enabled: os.Getenv("NOTIFY_SOCKET") != ""}
	if !n.enabled {
		return n
	}
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("sd_notify: watchdog setting ignored", "err", err)
	}
	n.watchdog = d
	return n
}

// Enabled reports whether a service manager listens (NOTIFY_SOCKET set).
func (n *Notifier) Enabled() bool { return n.enabled }

// WatchdogInterval is WATCHDOG_USEC (0: no watchdog).
func (n *Notifier) WatchdogInterval() time.Duration { return n.watchdog }

// Send sends one notification (newline-separated KEY=VALUE assignments).
// Failures are logged, not returned: the service manager is advisory.
func (n *Notifier) Send(state string) {
	if !n.enabled {
		return
	}
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify failed", "state", state, "err", err)
	}
}

// Ready says start-up is complete.
func (n *Notifier) Ready(status string) { n.Send(daemon.SdNotifyReady + "\nSTATUS=" + status) }

// Status sets the one-line status `systemctl status` shows.
func (n *Notifier) Status(status string) { n.Send("STATUS=" + status) }

// Stopping says shutdown has begun.
func (n *Notifier) Stopping(status string) {
	n.Send(daemon.SdNotifyStopping + "\nSTATUS=" + status)
}

// Run is the whole lifecycle. It waits for ready (or ctx), sends READY=1
// with status(), then, until ctx ends, ticks at half the watchdog interval
// (every statusEvery without one): each tick runs healthy and sends
// WATCHDOG=1 only when it passes, so a process whose loops are stuck stops
// pinging and the service manager restarts it; STATUS= is refreshed from
// status() (or says why the check failed). When ctx ends it sends
// STOPPING=1. Without NOTIFY_SOCKET it returns at once. healthy gets a
// context that ends at the next tick; it must return by then to count.
func (n *Notifier) Run(ctx context.Context, ready <-chan struct{}, status func() string, healthy func(context.Context) error) {
	if !n.enabled {
		return
	}
	select {
	case <-ready:
	case <-ctx.Done():
		n.Stopping("stopping before it was ready")
		return
	}
	n.Ready(status())
	every := statusEvery
	if n.watchdog > 0 {
		every = min(n.watchdog/2, statusEvery)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			n.Stopping("stopping")
			return
		case <-t.C:
		}
		if err := check(ctx, every, healthy); err != nil {
			n.log.Warn("health check failed; no watchdog keep-alive sent", "err", err)
			n.Status("unhealthy: " + err.Error())
			continue
		}
		state := "STATUS=" + status()
		if n.watchdog > 0 {
			state = daemon.SdNotifyWatchdog + "\n" + state
		}
		n.Send(state)
	}
}

// check runs healthy with a deadline of limit; a check that does not
// return by then fails.
func check(ctx context.Context, limit time.Duration, healthy func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- healthy(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return fmt.Errorf("health check did not answer within %s: %w", limit, ctx.Err())
	}
}
