package slicevm

// The readiness phase (runtime Ready, then an SSH banner through the ssh
// forward) and the deferred cleanup of a failed provision.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/guestssh"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// pollInterval is how often readiness re-inspects the VM between events.
const pollInterval = 250 * time.Millisecond

func (pr *provision) readiness(ctx context.Context) (step, error) {
	ctx, cancel := context.WithTimeout(ctx, pr.readinessTimeout())
	defer cancel()
	start := pr.p.opts.Now()
	defer func() { pr.out.Readiness.WaitedMS = pr.p.opts.Now().Sub(start).Milliseconds() }()
	st, readyAt, err := pr.p.waitReady(ctx, pr.params.VMName, pr.params.ReadinessMarker, pr.events)
	if err != nil {
		return step{}, err
	}
	pr.readyAt = readyAt
	pr.out.Readiness.MarkerSeen = true
	fwd := sshForward(pr.network)
	switch {
	case pr.network.Mode == api.NetworkTap:
		if len(pr.params.Slots) > 0 {
			pr.out.PrivateIP = pr.params.Slots[0].PrivateIP
		}
		pr.out.SSHHost, pr.out.SSHPort = pr.out.PrivateIP, 22
	default:
		pr.out.PrivateIP, pr.out.SSHHost = UserNetGuestIP, "127.0.0.1"
		pr.out.SSHPort = st.Ports[fwd]
	}
	addr, via := "", ""
	switch {
	case fwd != "" && pr.out.SSHPort != 0:
		addr, via = net.JoinHostPort("127.0.0.1", strconv.Itoa(pr.out.SSHPort)), fmt.Sprintf("forward %q", fwd)
	case pr.network.Mode == api.NetworkTap && pr.out.PrivateIP != "":
		// The VM's own address on the slice network, when the agent has
		// one (NODE_AGENT_SLICE_CIDR) and reserved that address for it.
		a := net.JoinHostPort(pr.out.PrivateIP, "22")
		sliceNet, own := pr.p.guestNet(pr.params.VMName)
		if err := guestssh.CheckAddr(a, sliceNet, own); err != nil {
			pr.out.Readiness.Ready = true
			return done("serial marker %q seen; ssh not checked: %v", pr.params.ReadinessMarker, err), nil
		}
		addr, via = a, "slice network "+sliceNet.String()
	}
	if addr == "" {
		pr.out.Readiness.Ready = true
		return done("serial marker %q seen; no ssh forward to check", pr.params.ReadinessMarker), nil
	}
	banner, err := waitSSH(ctx, addr)
	if err != nil && pr.network.Mode == api.NetworkTap {
		// The marker decides a tap VM's readiness; the node reaching its
		// ssh over the slice bridge is what its brokered terminal needs.
		pr.out.Readiness.Ready = true
		pr.p.opts.Log.Warn("slicevm: no brokered terminal for this vm", "vm_name", pr.params.VMName, "addr", addr, "err", err)
		return done("serial marker %q seen; no brokered terminal: ssh on %s (%s) did not answer within %s: %v",
			pr.params.ReadinessMarker, addr, via, pr.readinessTimeout(), err), nil
	}
	if err != nil {
		return step{}, failf(CodeReadinessFailed, "serial marker seen, but ssh on %s (%s) did not answer within %s: %w",
			addr, via, pr.readinessTimeout(), err)
	}
	pr.out.Readiness.Ready, pr.out.Readiness.SSHBanner = true, banner
	pinned, err := pr.recordTerminal(ctx, st)
	if err != nil {
		// The VM is ready; only its brokered terminal is not.
		pr.p.opts.Log.Warn("slicevm: no brokered terminal for this vm", "vm_name", pr.params.VMName, "err", err)
		pinned = "no brokered terminal: " + err.Error()
	} else {
		pinned += "; " + pr.firstTelemetry(ctx)
		pr.out.Readiness.TelemetryReady = pr.out.Telemetry != nil && pr.out.Telemetry.Ready
	}
	return done("serial marker %q seen; %s answered %q; %s", pr.params.ReadinessMarker, addr, banner, pinned), nil
}

// waitReady waits until the runtime says id is Ready (its serial marker
// appeared), failing at once if the VM exits. readyAt is the ready event's
// time when one arrived, else when Ready was observed.
func (p *Provisioner) waitReady(ctx context.Context, id, marker string, events <-chan runtime.Event) (runtime.Status, time.Time, error) {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var readyAt time.Time
	for {
		st, err := p.opts.Runtime.Inspect(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return st, readyAt, failf(CodeReadinessFailed, "serial marker %q not seen: %w", marker, ctx.Err())
			}
			return st, readyAt, failf(CodeReadinessFailed, "inspect %s: %w", id, err)
		}
		switch st.State {
		case runtime.StateCrashed, runtime.StateStopped:
			return st, readyAt, failf(CodeReadinessFailed, "%s %s before it was ready (reason %q: %s)",
				id, st.State, st.ExitReason, st.ExitDetail)
		}
		if st.Ready {
			if readyAt.IsZero() {
				readyAt = p.opts.Now()
			}
			return st, readyAt, nil
		}
		select {
		case <-ctx.Done():
			return st, readyAt, failf(CodeReadinessFailed, "serial marker %q not seen (vm %s): %w", marker, st.State, ctx.Err())
		case ev, ok := <-events:
			if !ok {
				events = nil
			} else if ev.ID == id && ev.Kind == runtime.EventReady {
				readyAt = ev.At
			}
		case <-tick.C:
		}
	}
}

// waitSSH connects to addr until it answers with an SSH banner ("SSH-..."),
// or ctx ends. A forward that accepts and closes (the guest's sshd is not
// up yet) is retried.
func waitSSH(ctx context.Context, addr string) (string, error) {
	var last error
	for {
		banner, err := sshBanner(ctx, addr)
		if err == nil {
			return banner, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w (last attempt: %v)", ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func sshBanner(ctx context.Context, addr string) (string, error) {
	d := net.Dialer{Timeout: 3 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	deadline := time.Now().Add(5 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetReadDeadline(deadline)
	buf := make([]byte, 256)
	n := 0
	for n < len(buf) {
		m, err := conn.Read(buf[n:])
		n += m
		if i := strings.IndexByte(string(buf[:n]), '\n'); i >= 0 {
			line := strings.TrimRight(string(buf[:i]), "\r")
			if !strings.HasPrefix(line, "SSH-") {
				return "", fmt.Errorf("not an SSH banner: %q", line)
			}
			return line, nil
		}
		if err != nil {
			return "", fmt.Errorf("read banner: %w", err)
		}
	}
	return "", errors.New("no SSH banner in the first 256 bytes")
}

// cleanup undoes what a failed provision made, in this order (drop
// DHCP, unregister telemetry, release leases, remove the cloud-init dir),
// after destroying the VM if this call created it. It runs even when ctx
// has ended, bounded by cleanupTimeout, and returns what failed ("" for
// nothing).
func (pr *provision) cleanup(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	p, vm := pr.p, pr.params.VMName
	var failed []string
	run := func(name string, fn func(context.Context) (step, error)) {
		if _, err := pr.t.run(ctx, name, fn); err != nil {
			failed = append(failed, err.Error())
		}
	}
	if pr.vmCreated {
		run(CleanupVM, func(ctx context.Context) (step, error) {
			if err := p.opts.Runtime.Destroy(ctx, vm); err != nil {
				return step{}, failf(CodeVMDestroyFailed, "destroy %s: %w", vm, err)
			}
			return done("destroyed %s", vm), nil
		})
	}
	removeOwn := func(path string, made, had bool) func(context.Context) (step, error) {
		return func(context.Context) (step, error) {
			switch {
			case made:
				if _, err := removeFile(path); err != nil {
					return step{}, err
				}
				return done("removed %s", path), nil
			case had:
				return skipped("kept %s: it existed before this provision", path), nil
			}
			return skipped("nothing written"), nil
		}
	}
	run(CleanupDHCP, removeOwn(p.dhcpPath(vm), pr.dhcpNew, pr.hadDHCP))
	run(CleanupTelemetry, removeOwn(p.telemetryPath(vm), pr.telemetryNew, pr.hadTelemetry))
	run(CleanupLeases, func(context.Context) (step, error) {
		if len(pr.leased) == 0 {
			return skipped("no lease taken by this provision"), nil
		}
		var released []string
		for _, id := range pr.leased {
			ok, err := p.releaseLease(vm, id)
			if err != nil {
				return step{}, fmt.Errorf("release lease of slot %s: %w", id, err)
			}
			if ok {
				released = append(released, id)
			}
		}
		return done("released %s", strings.Join(released, ", ")), nil
	})
	run(CleanupCloudInitDir, func(context.Context) (step, error) {
		var did []string
		if pr.dirCreated {
			if err := os.RemoveAll(pr.dir); err != nil {
				return step{}, err
			}
			did = append(did, "removed "+pr.dir)
		}
		if pr.keyCreated {
			if _, err := p.removeKeyPair(vm); err != nil {
				return step{}, err
			}
			did = append(did, "removed terminal key "+p.keyPath(vm))
		}
		if pr.vmCreated { // a VM found running keeps its terminal record
			if rec, err := p.removeTerminal(vm); err != nil {
				return step{}, err
			} else if rec {
				did = append(did, "removed terminal record "+p.terminalPath(vm))
			}
		}
		if len(did) == 0 {
			return skipped("nothing created by this provision"), nil
		}
		return done("%s", strings.Join(did, "; ")), nil
	})
	return strings.Join(failed, "; ")
}
