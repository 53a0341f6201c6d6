package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/sdnotify"
)

// notifyLoop speaks sd_notify to systemd (Type=notify; a no-op without
// NOTIFY_SOCKET). Run starts it with the main loops, once the identity is
// enrolled or loaded: READY=1 then, STATUS= lines from the status
// document, WATCHDOG=1 only while the agent is alive (checkAlive), and
// STOPPING=1 when the loops end.
// The Windows service reports Running at the same point (WithReadyHook).
func (a *Agent) notifyLoop(ctx context.Context) error {
	if a.onReady != nil {
		a.onReady()
	}
	n := sdnotify.New(a.log)
	if !n.Enabled() {
		return nil
	}
	ready := make(chan struct{})
	close(ready)
	n.Run(ctx, ready, a.notifyStatus, a.checkAlive)
	return nil
}

// notifyStatus is the one-line status systemctl status shows.
func (a *Agent) notifyStatus() string {
	st, _ := a.Status()
	var b strings.Builder
	fmt.Fprintf(&b, "node %s: %s", st.NodeID, st.Status)
	if st.Signal != "" && string(st.Signal) != st.Status {
		fmt.Fprintf(&b, " (%s)", st.Signal)
	}
	if st.LastHeartbeatAt != nil {
		fmt.Fprintf(&b, "; last heartbeat %s ago", a.now().Sub(*st.LastHeartbeatAt).Round(time.Second))
	}
	fmt.Fprintf(&b, "; control plane %s", st.ControlPlaneURL)
	return b.String()
}

// checkAlive is the watchdog's health check: the agent's shared state is
// not locked up and its local API answers. A control plane that cannot
// be reached is not a failure here (restarting would not help; the status
// document reports it).
func (a *Agent) checkAlive(ctx context.Context) error {
	locked := make(chan struct{})
	go func() {
		a.mu.Lock()
		//lint:ignore SA2001 it only checks that the lock can be taken
		a.mu.Unlock()
		close(locked)
	}()
	select {
	case <-locked:
	case <-ctx.Done():
		return errors.New("agent state lock held too long")
	}
	if a.localAddr == nil {
		return errors.New("local API not listening")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.localAddr.String()+"/healthz", nil)
	if err != nil {
		return fmt.Errorf("local API: %w", err)
	}
	// Its own transport: no proxy from the environment, no idle connections.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("local API does not answer: %w", err)
	}
	resp.Body.Close()
	return nil
}
