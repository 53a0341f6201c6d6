package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestMicroVMInstanceTCG is issue 17's end-to-end path under TCG: an OCI
// image built by the test (busybox and the test HTTP server) served from
// an in-test registry on loopback; an instance with runtime microvm
// created through the control plane is placed on an agent whose QEMU
// runtime has the microVM kernel and drover-init's initramfs; the agent
// pulls the image, builds its ext4 root filesystem, boots it
// (Booting → Ready by HTTP through the forward), health checks keep it
// Ready, a stop goes Draining → Stopped through the guest init; a
// workload that exits 3 is Failed with the code in its message; one that
// outgrows the VM's memory is Failed with reason oom_killed.
func TestMicroVMInstanceTCG(t *testing.T) {
	t0 := time.Now()
	h := startMicroVMHost(t, "mv-1", nil)
	e, img, rtDir := h.e, h.img, h.rtDir
	t.Logf("setup (kit, image, control plane, agent) took %v", time.Since(t0).Round(time.Millisecond))

	spec := api.InstanceSpec{Runtime: api.RuntimeMicroVM, VCPUs: 1, MemoryMiB: 256,
		Container:   &api.ContainerSpec{Image: img.Ref, Digest: img.Digest},
		Network:     api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 8080}}},
		Readiness:   api.Readiness{TCPPort: 8080, HTTPPath: "/health", Timeout: api.Duration(2 * time.Minute)},
		HealthCheck: &api.HealthCheck{Interval: api.Duration(time.Second)}, GracefulTimeout: api.Duration(30 * time.Second)}
	t1 := time.Now()
	in := e.createInstance(api.CreateInstanceRequest{Name: "web", HostID: "mv-1", Spec: spec})
	ready := e.waitPhase(in.ID, api.InstanceReady, "", 3*time.Minute)
	t.Logf("create → Ready (pull, rootfs, boot, HTTP) in %v", time.Since(t1).Round(time.Millisecond))
	if r := ready.Runtime; r == nil || r.Runtime != "qemu" || r.PID == 0 || r.Ports["http"] == 0 {
		t.Fatalf("ready runtime: %+v", ready.Runtime)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", ready.Runtime.Ports["http"]))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("GET /health through the forward: %q", body)
	}
	time.Sleep(3 * time.Second) // a few health checks
	if now := e.waitPhase(in.ID, api.InstanceReady, "", time.Second); now.Phase != api.InstanceReady {
		t.Errorf("after health checks: %s", now.Phase)
	}

	if st := e.op(http.MethodPost, "/api/v1/instances/"+in.ID+"/stop", nil, nil); st != http.StatusOK {
		t.Fatalf("stop: HTTP %d", st)
	}
	stopped := e.waitPhase(in.ID, api.InstanceStopped, api.ReasonTerminatedByOperator, 2*time.Minute)
	if !strings.HasPrefix(stopped.Message, "stopped gracefully") {
		t.Errorf("stop message %q, want a graceful stop", stopped.Message)
	}
	var evs []api.InstanceEvent
	e.op(http.MethodGet, "/api/v1/instances/"+in.ID+"/events", nil, &evs)
	var phases []string
	for _, ev := range evs {
		phases = append(phases, string(ev.Phase))
	}
	for _, want := range []api.InstancePhase{api.InstanceBooting, api.InstanceReady, api.InstanceDraining, api.InstanceStopped} {
		if !slices.Contains(phases, string(want)) {
			t.Errorf("events %v lack %s", phases, want)
		}
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left after stop: %v", procs)
	}

	// A workload that exits 3: Failed, the code in the message.
	bad := spec
	bad.Container = &api.ContainerSpec{Image: img.Ref, Digest: img.Digest, Command: []string{"/bin/sh", "-c", "exit 3"}}
	bad.Readiness, bad.HealthCheck = api.Readiness{}, nil
	in2 := e.createInstance(api.CreateInstanceRequest{Name: "bad", HostID: "mv-1", Spec: bad})
	failed := e.waitInstance(in2.ID, 2*time.Minute, "Failed with exit code 3", func(in api.Instance, st int) bool {
		return st == http.StatusOK && in.Phase == api.InstanceFailed && strings.Contains(in.Message, "exited with code 3")
	})
	t.Logf("exit 3: %s %q %q", failed.Phase, failed.ReasonCode, failed.Message)
	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in2.ID, nil, nil); st != http.StatusAccepted { // no restarts meanwhile
		t.Fatalf("delete: HTTP %d", st)
	}

	// A workload that outgrows the VM's memory: the guest kernel's OOM
	// killer ends it, drover-init reports it, the instance is Failed
	// with reason oom_killed.
	oom := bad
	oom.MemoryMiB = 128
	oom.Container = &api.ContainerSpec{Image: img.Ref, Digest: img.Digest,
		Command: []string{"/bin/sh", "-c", "x=0123456789; while :; do x=$x$x; done"}}
	in3 := e.createInstance(api.CreateInstanceRequest{Name: "oom", HostID: "mv-1", Spec: oom})
	oomed := e.waitPhase(in3.ID, api.InstanceFailed, api.ReasonOOMKilled, 2*time.Minute)
	t.Logf("oom: %s %q %q", oomed.Phase, oomed.ReasonCode, oomed.Message)
	for _, id := range []string{in.ID, in3.ID} {
		if st := e.op(http.MethodDelete, "/api/v1/instances/"+id, nil, nil); st != http.StatusAccepted {
			t.Fatalf("delete: HTTP %d", st)
		}
	}
	for _, id := range []string{in.ID, in2.ID, in3.ID} {
		e.waitGone(id, 2*time.Minute)
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left after delete: %v", procs)
	}
	t.Logf("whole test %v", time.Since(t0).Round(time.Millisecond))
}

// microVMHost is a control plane on SQLite with one agent (hostID) whose
// QEMU runtime has the microVM mode (the test kernel and drover-init's
// initramfs), and an in-test registry holding img: busybox and the test
// HTTP server (PORT=8080).
type microVMHost struct {
	e     *env
	reg   *ocitest.Registry
	img   ocitest.Image
	rtDir string
}

// startMicroVMHost starts it; tune edits the agent's configuration.
func startMicroVMHost(t *testing.T, hostID string, tune func(*agent.Config)) microVMHost {
	t.Helper()
	kit := microvmtest.Build(t, "")
	reg := ocitest.StartRegistry()
	t.Cleanup(reg.Close)
	server, err := ocitest.BuildTestServer(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := reg.Push("drover/web", "v1", server, "PORT=8080")
	if err != nil {
		t.Fatal(err)
	}
	rtDir, err := os.MkdirTemp("", "dmv") // unix socket paths stay short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(rtDir) })
	e := startEnv(t, openSQLite(t))
	bt := e.createHost(hostID)
	e.startAgent(hostID, bt.Token, agentOpts{runtime: "qemu", runtimeDir: rtDir, allowLocal: true, tune: tune,
		settings: map[string]string{"NODE_AGENT_QEMU_MICROVM_KERNEL": kit.Kernel, "NODE_AGENT_QEMU_MICROVM_INITRD": kit.Initrd}})
	e.waitHostStatus(hostID, api.HostHealthy, 60*time.Second)
	waitCapacity(t, e, hostID)
	var h api.Host
	e.op(http.MethodGet, "/api/v1/hosts/"+hostID, nil, &h)
	if c := h.Capabilities; c == nil || !slices.Contains(c.Runtimes, api.RuntimeMicroVM) {
		t.Fatalf("capabilities: %+v", h.Capabilities)
	}
	return microVMHost{e: e, reg: reg, img: img, rtDir: rtDir}
}
