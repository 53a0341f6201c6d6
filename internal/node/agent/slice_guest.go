package agent

// The agent's work inside slice VM guests, over the brokered SSH channel
// (slicevm, internal/node/guestssh): allocation.provision_user and
// deprovision_user for a params.vm_name, and the guest telemetry loop with
// its Prometheus gauges.

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/node/guestssh"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Result codes of allocation.provision_user and deprovision_user inside a
// slice VM (besides guestssh's dial codes: guest_terminal_unavailable,
// guest_ssh_unreachable, guest_host_key_mismatch, guest_auth_failed).
const (
	// CodeGuestNotOwned: the VM was not provisioned for the allocation.
	CodeGuestNotOwned = "guest_not_owned"
	// CodeGuestUserFailed: the guest refused or failed the user's change
	// (it was rolled back); the message carries the guest's error.
	CodeGuestUserFailed = "guest_user_failed"
)

// guestAllocHandlers wraps host's allocation.provision_user and
// deprovision_user: params naming vm_name run inside that slice VM through
// p; others run host's handler (the user on the host's OS).
func guestAllocHandlers(host Handlers, p *slicevm.Provisioner) Handlers {
	out := Handlers{}
	if h, ok := host[task.TypeAllocProvisionUser]; ok {
		out[task.TypeAllocProvisionUser] = Handler{Timeout: h.Timeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			prm, fe := task.DecodeAllocProvisionUserParams(t.Params)
			if fe != nil || prm.VMName == "" {
				return h.Run(ctx, t)
			}
			start := time.Now()
			out, err := p.ProvisionGuestUser(ctx, prm.VMName, guestssh.UserRequest{AllocationID: prm.AllocationID,
				Username: prm.Username, SSHAuthorizedKeys: prm.SSHAuthorizedKeys, Shell: prm.Shell, Sudo: prm.Sudo})
			return Outcome{Output: out, Timings: map[string]int64{"guest_user_ms": time.Since(start).Milliseconds()}},
				guestHandlerError(ctx, err)
		}}
	}
	if h, ok := host[task.TypeAllocDeprovisionUser]; ok {
		out[task.TypeAllocDeprovisionUser] = Handler{Timeout: h.Timeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			prm, fe := task.DecodeAllocDeprovisionUserParams(t.Params)
			if fe != nil || prm.VMName == "" {
				return h.Run(ctx, t)
			}
			start := time.Now()
			out, err := p.DeprovisionGuestUser(ctx, prm.VMName, prm.AllocationID, prm.Username, *prm.RemoveHome)
			return Outcome{Output: out, Timings: map[string]int64{"guest_user_ms": time.Since(start).Milliseconds()}},
				guestHandlerError(ctx, err)
		}}
	}
	return out
}

// guestHandlerError maps a guest failure to a *HandlerError naming the
// hop; when the task's context ended, err is left as is.
func guestHandlerError(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	var de *guestssh.DialError
	code := CodeGuestUserFailed
	switch {
	case errors.Is(err, slicevm.ErrNotOwned):
		code = CodeGuestNotOwned
	case errors.Is(err, slicevm.ErrNoTerminal), errors.Is(err, slicevm.ErrNotLocal):
		code = guestssh.CodeUnavailable
	case errors.As(err, &de):
		code = de.Code
	}
	return &HandlerError{api.CodedError{Code: code, Message: err.Error(), Err: err}}
}

// guestMetrics are the slice guests' telemetry gauges, labelled by vm.
type guestMetrics struct {
	up, uptime, load1, memTotal, memAvail, cpus, gpus *prometheus.GaugeVec
}

func newGuestMetrics(reg prometheus.Registerer) *guestMetrics {
	g := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "drover_agent_slice_guest_" + name, Help: help}, []string{"vm"})
	}
	m := &guestMetrics{
		up:       g("telemetry_up", "1 when the last telemetry collection over the brokered SSH channel succeeded."),
		uptime:   g("uptime_seconds", "Guest uptime (/proc/uptime)."),
		load1:    g("load1", "Guest 1-minute load average."),
		memTotal: g("memory_total_bytes", "Guest MemTotal."),
		memAvail: g("memory_available_bytes", "Guest MemAvailable."),
		cpus:     g("cpus", "CPUs the guest sees."),
		gpus:     g("gpus", "GPUs the guest sees (nvidia-smi -L, else /dev/nvidia<N>)."),
	}
	reg.MustRegister(m.up, m.uptime, m.load1, m.memTotal, m.memAvail, m.cpus, m.gpus)
	return m
}

func (m *guestMetrics) all() []*prometheus.GaugeVec {
	return []*prometheus.GaugeVec{m.up, m.uptime, m.load1, m.memTotal, m.memAvail, m.cpus, m.gpus}
}

// set replaces the gauges with guests' telemetry (guests without any
// collection yet are left out).
func (m *guestMetrics) set(guests []slicevm.Guest) {
	for _, v := range m.all() {
		v.Reset()
	}
	for _, g := range guests {
		t := g.Telemetry
		if t == nil {
			continue
		}
		up := 0.0
		if t.Ready {
			up = 1
		}
		m.up.WithLabelValues(g.VMName).Set(up)
		if !t.Ready {
			continue
		}
		m.uptime.WithLabelValues(g.VMName).Set(t.UptimeSeconds)
		m.load1.WithLabelValues(g.VMName).Set(t.Load1)
		m.memTotal.WithLabelValues(g.VMName).Set(float64(t.MemoryTotalBytes))
		m.memAvail.WithLabelValues(g.VMName).Set(float64(t.MemoryAvailableBytes))
		m.cpus.WithLabelValues(g.VMName).Set(float64(t.CPUs))
		m.gpus.WithLabelValues(g.VMName).Set(float64(t.GPUs))
	}
}

// guestTelemetryLoop collects every registered guest's telemetry every
// interval (each guest bounded by slicevm.TelemetryTimeout) until ctx
// ends, and publishes it as m's gauges.
func guestTelemetryLoop(ctx context.Context, p *slicevm.Provisioner, m *guestMetrics, interval time.Duration, log interface {
	Warn(string, ...any)
}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		guests, err := p.CollectTelemetry(ctx)
		if err != nil && ctx.Err() == nil {
			log.Warn("slice guest telemetry", "err", err)
		}
		if err == nil {
			m.set(guests)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
