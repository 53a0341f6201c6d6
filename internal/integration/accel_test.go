package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestUnsupportedSelectedAccel: NODE_AGENT_QEMU_ACCEL=kvm on a host where
// only tcg works is refused at start-up with accel.UnsupportedMessage's wording, shown on
// the host, and the host is not schedulable.
func TestUnsupportedSelectedAccel(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("node-kvm")
	e.startAgent("node-kvm", bt.Token, agentOpts{accel: "kvm"})
	h := e.waitHostStatus("node-kvm", api.HostHealthy, 10*time.Second)
	if h.SelectedAccel != "kvm" || h.Capabilities == nil ||
		!strings.HasPrefix(h.Capabilities.AccelError, "selected_accel not supported by host: kvm") {
		t.Fatalf("host %+v capabilities %+v", h, h.Capabilities)
	}
	if h.Schedulable {
		t.Fatal("a host that cannot run its selected accelerator is schedulable")
	}
	if len(h.Capabilities.Accelerators) != 1 || h.Capabilities.Accelerators[0] != "tcg" {
		t.Fatalf("accelerators %v, want [tcg]", h.Capabilities.Accelerators)
	}
}

// TestAccelFallbackToTCG: with NODE_AGENT_ACCEL_FALLBACK=tcg the same host
// runs VMs under TCG instead of refusing, and stays schedulable.
func TestAccelFallbackToTCG(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("node-fb")
	e.startAgent("node-fb", bt.Token, agentOpts{accel: "kvm", fallback: "tcg"})
	h := e.waitHostStatus("node-fb", api.HostHealthy, 10*time.Second)
	if h.SelectedAccel != "tcg" || h.Capabilities == nil || h.Capabilities.AccelError != "" || !h.Schedulable {
		t.Fatalf("host selected %q, accel_error %q, schedulable %t; want tcg, none, true",
			h.SelectedAccel, h.Capabilities.AccelError, h.Schedulable)
	}
}

// TestAgentWithoutWorkingAccelerator: a host configured for QEMU where no
// accelerator works (no QEMU installed, no KVM) still enrols, heartbeats and
// runs tasks; it just runs no instances.
func TestAgentWithoutWorkingAccelerator(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("node-noaccel")
	e.startAgent("node-noaccel", bt.Token, agentOpts{runtime: "qemu", probe: fixedAccel(), runtimeDir: t.TempDir()})
	e.waitHostStatus("node-noaccel", api.HostHealthy, 10*time.Second)
	tk := e.enqueue("node-noaccel", "diag.health_probe", map[string]any{})
	if done := e.waitTask(tk.ID, 30*time.Second); done.State != api.TaskSucceeded {
		t.Fatalf("health probe on a host without accelerators: %s", done.State)
	}
}

// TestRealAcceleratorProbe runs the real probe (a KVM guest in a child
// process of this test binary, and QEMU's accelerator list). Whatever this
// machine supports, the host record must agree with it.
func TestRealAcceleratorProbe(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("node-probe")
	e.startAgent("node-probe", bt.Token, agentOpts{realProbe: true})
	var h api.Host
	deadline := time.Now().Add(30 * time.Second)
	for {
		e.op(http.MethodGet, "/api/v1/hosts/node-probe", nil, &h)
		if h.Status == api.HostHealthy && h.Capabilities != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("host never healthy: %+v", h)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := h.Capabilities
	t.Logf("working accelerators here: %v, selected %q", c.Accelerators, h.SelectedAccel)
	if c.AccelError != "" {
		t.Fatalf("no accelerator was selected, yet accel_error = %q", c.AccelError)
	}
	want := ""
	if len(c.Accelerators) > 0 {
		want = c.Accelerators[0] // the probe lists the best one first
	}
	if h.SelectedAccel != want {
		t.Fatalf("selected %q, want the best working one %q (working %v)", h.SelectedAccel, want, c.Accelerators)
	}
	// diag.health_probe carries the accelerator probe's verdicts.
	task := e.enqueue("node-probe", "diag.health_probe", nil)
	got := e.waitTask(task.ID, 30*time.Second)
	var out struct {
		AcceleratorProbe *struct {
			Accelerators []struct {
				Name   string `json:"name"`
				Works  bool   `json:"works"`
				Reason string `json:"reason"`
			} `json:"accelerators"`
		} `json:"accelerator_probe"`
	}
	if got.State != api.TaskSucceeded || json.Unmarshal(got.Result.Output, &out) != nil || out.AcceleratorProbe == nil {
		t.Fatalf("health probe: %s %s", got.State, got.Result.Output)
	}
	kvmSeen := false
	for _, a := range out.AcceleratorProbe.Accelerators {
		if a.Name == "kvm" {
			kvmSeen = true
			if a.Reason == "" {
				t.Errorf("kvm verdict without a reason: %+v", a)
			}
		}
	}
	if !kvmSeen {
		t.Fatalf("no kvm verdict in %+v", out.AcceleratorProbe)
	}
}
