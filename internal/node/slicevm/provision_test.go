package slicevm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/cloudinit"
	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

func asError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want *Error", err, err)
	}
	return e
}

func phaseNames(rs []PhaseResult) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Phase)
	}
	return out
}

func phaseResult(t *testing.T, rs []PhaseResult, name string) PhaseResult {
	t.Helper()
	for _, r := range rs {
		if r.Phase == name {
			return r
		}
	}
	t.Fatalf("no phase %s in %+v", name, rs)
	return PhaseResult{}
}

// TestProvisionAndReleaseWithSlot provisions vm-1 with a slot whose GPU
// and VF are bound to vfio-pci and whose NVMe is a file in the fake tree
// (qemu-img really writes the image onto it), then releases it with a
// wipe, then releases it again.
func TestProvisionAndReleaseWithSlot(t *testing.T) {
	e := newEnv(t, envOpts{qcow2: true})
	ctx := context.Background()
	var log phaseLog
	out, timings, err := e.p.Provision(ctx, e.slotParams(), log.progress)
	if err != nil {
		t.Fatalf("Provision: %v\nphases: %+v", err, out.Phases)
	}
	if !reflect.DeepEqual(log.names, ProvisionPhases()) || !reflect.DeepEqual(phaseNames(out.Phases), ProvisionPhases()) {
		t.Fatalf("progress %v\nphases %v\nwant %v", log.names, phaseNames(out.Phases), ProvisionPhases())
	}
	for _, ph := range ProvisionPhases() {
		if _, ok := timings[ph+"_ms"]; !ok || log.errs[ph] != nil {
			t.Errorf("phase %s: timing present %v, err %v", ph, ok, log.errs[ph])
		}
	}
	if len(timings) != len(ProvisionPhases()) || !reflect.DeepEqual(out.Timings, timings) {
		t.Errorf("timings = %v", timings)
	}
	if out.VMName != "vm-1" || out.DefaultUser != "drover" || out.PrivateIP != slotIP || out.SSHHost != slotIP ||
		out.SSHPort != 22 || out.SlotCount != 1 || out.RawVNC || out.ConsoleModel != "gateway_required" ||
		out.FailedPhase != "" || out.Cleanup != nil {
		t.Errorf("output = %+v", out)
	}
	if !out.Readiness.Ready || !out.Readiness.MarkerSeen || out.Readiness.SerialMarker != "DROVER-READY vm-1" {
		t.Errorf("readiness = %+v", out.Readiness)
	}
	if p := out.Performance; p.Accel != "mock" || p.VCPUs != 4 || p.MemoryMiB != 4096 || p.Runtime != "mock" ||
		p.BootToReadyMS < 0 || p.PID == 0 {
		t.Errorf("performance = %+v", p)
	}
	if !out.Image.Verified || out.Image.SHA256 != e.imgSHA || out.Image.Cached {
		t.Errorf("image = %+v", out.Image)
	}
	joined := strings.Join(out.Notes, "\n")
	for _, want := range []string{"instead of virt-install", "instead of running cloud-localds", "installed only with the agent's install_dependencies setting"} {
		if !strings.Contains(joined, want) {
			t.Errorf("notes lack %q: %v", want, out.Notes)
		}
	}
	b, _ := json.Marshal(out)
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"vm_name", "default_user", "private_ip", "ssh_port", "slot_count", "readiness",
		"performance", "timings", "raw_vnc", "console_model", "serial_socket", "notes"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("output JSON lacks %q: %s", k, b)
		}
	}

	// The image is on the NVMe, as raw bytes; the rest of the device is untouched.
	nv, err := os.ReadFile(e.nvmeFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(nv) != nvmeBytes || !bytes.Equal(nv[:imgBytes], e.rawImage) || nv[nvmeBytes-1] != 0xab {
		t.Errorf("nvme holds %d bytes; image written: %v", len(nv), bytes.Equal(nv[:imgBytes], e.rawImage))
	}
	if d := phaseResult(t, out.Phases, PhaseImageWriteConvert).Detail; !strings.Contains(d, "qemu-img convert -n -f qcow2 -O raw") {
		t.Errorf("image_write_convert detail = %q", d)
	}

	// What the runtime was asked to run.
	st, err := e.rt.Inspect(ctx, "vm-1")
	if err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(e.ciDir, "vm-1", "seed.iso")
	if st.State != runtime.StateRunning || st.Owner != "slice" || st.Spec.VM.BootDevice != e.nvme || st.Spec.Image != (runtime.Image{}) ||
		!reflect.DeepEqual(st.Spec.Devices.PCI, []string{gpuAddr, vfAddr}) || st.Spec.VM.SeedISO != iso ||
		st.Spec.VM.Network.Mode != "tap" || st.Spec.VM.Network.Bridge != "br-slice" || st.Spec.VM.Network.MAC != slotMAC ||
		st.Spec.Readiness.SerialMarker != "DROVER-READY vm-1" {
		t.Errorf("runtime status = %+v", st)
	}

	// Files: lease, DHCP reservation, telemetry, cloud-init dir, terminal key.
	l, err := e.p.readLease("slot-0")
	if err != nil || l.VMName != "vm-1" || l.AllocationID != "alloc-1" || l.NVMeDevice != e.nvme {
		t.Errorf("lease = %+v, %v", l, err)
	}
	if b, err := os.ReadFile(filepath.Join(e.state, "dhcp-hosts.d", "vm-1.conf")); err != nil || string(b) != slotMAC+","+slotIP+",vm-1\n" {
		t.Errorf("dhcp = %q, %v", b, err)
	}
	guests, err := e.p.Guests(ctx)
	if err != nil || len(guests) != 1 || guests[0].VMName != "vm-1" || guests[0].Slots[0].PCIAddress != gpuAddr {
		t.Errorf("guests = %+v, %v", guests, err)
	}
	if fi, err := os.Stat(filepath.Join(e.ciDir, "vm-1")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("cloud-init dir: %v, %v", fi, err)
	}
	if fi, err := os.Stat(iso); err != nil || fi.Size() == 0 {
		t.Errorf("seed.iso: %v", err)
	}
	ud, err := os.ReadFile(filepath.Join(e.ciDir, "vm-1", "user-data"))
	if err != nil || !strings.Contains(string(ud), out.TerminalKey.PublicKey) || !strings.Contains(string(ud), testSSHKey) ||
		!strings.Contains(string(ud), ReadyFile) {
		t.Errorf("user-data lacks keys or ready file: %s", ud)
	}
	if fi, err := os.Stat(filepath.Join(e.state, "keys", "vm-1")); err != nil || fi.Mode().Perm() != 0o600 ||
		!strings.HasPrefix(out.TerminalKey.Fingerprint, "SHA256:") {
		t.Errorf("terminal key: %v, %v, %+v", fi, err, out.TerminalKey)
	}

	// Release with a wipe: every step, the device zeroed, nothing left.
	var rlog phaseLog
	rel, rtimings, err := e.p.Release(ctx, task.VMReleaseParams{VMName: "vm-1", AllocationID: "alloc-1", Wipe: true}, rlog.progress)
	if err != nil {
		t.Fatalf("Release: %v\n%+v", err, rel.Phases)
	}
	wantRel := []string{ReleaseShutdown, ReleaseUndefine, ReleaseVFIORebind, ReleaseRemoveCloudInitDir, ReleaseDropDHCP,
		ReleaseWipe, ReleaseLeases, ReleaseUnregisterTelemetry}
	wantProgress := append(append(append([]string{}, wantRel[:5]...), "wipe:slot-0"), wantRel[5:]...)
	if !reflect.DeepEqual(phaseNames(rel.Phases), wantRel) || !reflect.DeepEqual(rlog.names, wantProgress) || len(rtimings) != len(wantRel) {
		t.Errorf("release phases %v, progress %v, timings %v", phaseNames(rel.Phases), rlog.names, rtimings)
	}
	if rel.HardStopped || rel.AlreadyReleased || !reflect.DeepEqual(rel.Slots, []string{"slot-0"}) ||
		len(rel.Wiped) != 1 || rel.Wiped[0].Bytes != nvmeBytes || rel.Wiped[0].Device != e.nvme {
		t.Errorf("release = %+v", rel)
	}
	if nv, err := os.ReadFile(e.nvmeFile); err != nil || len(nv) != nvmeBytes || !bytes.Equal(nv, make([]byte, nvmeBytes)) {
		t.Errorf("nvme not zeroed (%d bytes, %v)", len(nv), err)
	}
	assertGone(t, e, "vm-1", "slot-0")

	// Again: nothing left, and it says so.
	again, _, err := e.p.Release(ctx, task.VMReleaseParams{VMName: "vm-1"}, nil)
	if err != nil || !again.AlreadyReleased || again.HardStopped {
		t.Fatalf("second release = %+v, %v", again, err)
	}
	for _, ph := range again.Phases {
		if ph.Status != StatusSkipped {
			t.Errorf("second release phase %+v", ph)
		}
	}
}

// assertGone checks that nothing of vm is left: VM, lease, DHCP
// reservation, telemetry registration, cloud-init dir, terminal key.
func assertGone(t *testing.T, e *env, vm string, slots ...string) {
	t.Helper()
	if _, err := e.rt.Inspect(context.Background(), vm); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("vm %s still known to the runtime: %v", vm, err)
	}
	paths := []string{e.p.dhcpPath(vm), e.p.telemetryPath(vm), filepath.Join(e.ciDir, vm), e.p.keyPath(vm), e.p.keyPath(vm) + ".pub"}
	for _, s := range slots {
		paths = append(paths, e.p.leasePath(s))
	}
	for _, p := range paths {
		if exists(p) {
			t.Errorf("%s is left behind", p)
		}
	}
}

// failureParams has a slot without an NVMe device (so no qemu-img is
// needed) on the OVS bridge.
func (e *env) failureParams() task.VMProvisionParams {
	p := e.slotParams()
	p.Slots[0].NVMeDevice = ""
	return p
}

func cleanupNames(withVM bool) []string {
	n := []string{CleanupDHCP, CleanupTelemetry, CleanupLeases, CleanupCloudInitDir}
	if withVM {
		n = append([]string{CleanupVM}, n...)
	}
	return n
}

// TestProvisionFailureCleanup: a failure at a phase runs the deferred
// cleanup, which removes what the provision made and destroys the VM it
// created.
func TestProvisionFailureCleanup(t *testing.T) {
	tests := []struct {
		name      string
		behavior  mock.Behavior
		phase     string
		code      string
		msg       string
		destroyed bool
	}{
		{"create fails", mock.Behavior{CreateErr: api.ReasonImagePullFailed}, PhaseVirtInstall, CodeVMCreateFailed, "image_pull_failed", false},
		{"start fails", mock.Behavior{StartErr: api.ReasonVMStartFailed}, PhaseVirtInstall, CodeVMStartFailed, "vm_start_failed", true},
		{"never ready", mock.Behavior{NeverReady: true}, PhaseReadiness, CodeReadinessFailed, `serial marker "DROVER-READY vm-1" not seen`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{})
			e.rt.SetBehavior("vm-1", tc.behavior)
			var log phaseLog
			out, timings, err := e.p.Provision(context.Background(), e.failureParams(), log.progress)
			fe := asError(t, err)
			if fe.Phase != tc.phase || fe.Code != tc.code || !strings.Contains(fe.Message, tc.msg) || out.FailedPhase != tc.phase {
				t.Fatalf("err = %+v, failed phase %q", fe, out.FailedPhase)
			}
			upTo := ProvisionPhases()
			for i, ph := range upTo {
				if ph == tc.phase {
					upTo = upTo[:i+1]
					break
				}
			}
			wantCleanup := cleanupNames(tc.destroyed)
			if !reflect.DeepEqual(phaseNames(out.Phases), upTo) || !reflect.DeepEqual(phaseNames(out.Cleanup), wantCleanup) ||
				!reflect.DeepEqual(log.names, append(append([]string{}, upTo...), wantCleanup...)) {
				t.Fatalf("phases %v\ncleanup %v\nprogress %v", phaseNames(out.Phases), phaseNames(out.Cleanup), log.names)
			}
			for _, c := range out.Cleanup {
				if c.Status != StatusOK || timings[c.Phase+"_ms"] < 0 {
					t.Errorf("cleanup step %+v", c)
				}
			}
			if got := e.rt.CallCount("destroy", "vm-1"); (got > 0) != tc.destroyed {
				t.Errorf("destroy calls = %d, want destroyed=%v", got, tc.destroyed)
			}
			assertGone(t, e, "vm-1", "slot-0")
		})
	}
}

// TestVFIOBindFailure: a slot device not bound to vfio-pci is bound
// through driver_override and drivers_probe; when it stays on its driver
// (or cannot be bound at all) the phase fails with a blocker and the
// cleanup releases the lease.
func TestVFIOBindFailure(t *testing.T) {
	devDir := "sys/devices/pci0000:18/" + gpuAddr
	tests := []struct {
		name     string
		driver   string
		files    map[string]string // extra sysfs files (the bind interface)
		msg      string
		wantBind bool
	}{
		{"bound to nvidia, bind has no effect", "nvidia", map[string]string{
			devDir + "/driver_override": "", "sys/bus/pci/drivers/nvidia/unbind": "", "sys/bus/pci/drivers_probe": ""},
			`still bound to "nvidia" after drivers_probe`, true},
		{"unbound, no driver_override", "", nil, "set driver_override", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := sliceHost()
			host.PCI[0] = gpu(gpuAddr, tc.driver, "20")
			for k, v := range tc.files {
				host.Files[k] = v
			}
			e := newEnv(t, envOpts{host: host})
			var log phaseLog
			out, _, err := e.p.Provision(context.Background(), e.slotParams(), log.progress)
			fe := asError(t, err)
			if fe.Phase != PhaseVFIOBindCheck || fe.Code != CodeVFIOBindFailed || fe.Blocker != "vfio_not_bound:"+gpuAddr ||
				!strings.Contains(fe.Message, tc.msg) {
				t.Fatalf("err = %+v", fe)
			}
			if !reflect.DeepEqual(phaseNames(out.Cleanup), cleanupNames(false)) ||
				phaseResult(t, out.Cleanup, CleanupLeases).Detail != "released slot-0" {
				t.Errorf("cleanup = %+v", out.Cleanup)
			}
			if tc.wantBind {
				for path, want := range map[string]string{devDir + "/driver_override": "vfio-pci",
					"sys/bus/pci/drivers/nvidia/unbind": gpuAddr, "sys/bus/pci/drivers_probe": gpuAddr} {
					if b, err := os.ReadFile(filepath.Join(e.roots.Base, path)); err != nil || string(b) != want {
						t.Errorf("%s = %q, %v; want %q", path, b, err, want)
					}
				}
			}
			assertGone(t, e, "vm-1", "slot-0")
		})
	}
}

// TestLeaseConflict: a slot, or a device, leased to another VM fails
// lease_acquire; the cleanup releases only the leases this provision took
// (none, when a device is leased under another slot id: that is checked
// before any lease is taken).
func TestLeaseConflict(t *testing.T) {
	tests := []struct {
		name     string
		held     task.VMSlot // vm-a's lease
		slot1    task.VMSlot // params' second slot
		msg      string
		fields   []string
		released string
	}{
		{"slot id leased (stale lease of a device since gone)", task.VMSlot{SlotID: "slot-1", PCIAddress: "0000:77:00.0"},
			task.VMSlot{SlotID: "slot-1", SlotIndex: 1, PCIAddress: gpu2Addr},
			"slot slot-1 is leased to vm vm-a (allocation alloc-a)", nil, "released slot-0"},
		{"device leased under another slot id", task.VMSlot{SlotID: "slot-1", PCIAddress: gpu2Addr},
			task.VMSlot{SlotID: "slot-x", SlotIndex: 1, PCIAddress: gpu2Addr},
			"params.slots[1].pci_address: 0000:2a:00.0 is leased to vm vm-a (slot slot-1, allocation alloc-a)",
			[]string{"params.slots[1].pci_address"}, "skipped: no lease taken by this provision"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{host: twoGPUHost()})
			if created, err := e.p.acquireLease("vm-a", "alloc-a", tc.held); err != nil || !created {
				t.Fatalf("acquire = %v, %v", created, err)
			}
			params := e.failureParams()
			params.Slots = append(params.Slots, tc.slot1)
			out, _, err := e.p.Provision(context.Background(), params, nil)
			fe := asError(t, err)
			if fe.Phase != PhaseLeaseAcquire || fe.Code != CodeLeaseConflict || !strings.Contains(fe.Message, tc.msg) ||
				!reflect.DeepEqual(fieldNames(fe.Fields), tc.fields) {
				t.Fatalf("err = %+v", fe)
			}
			if d := phaseResult(t, out.Cleanup, CleanupLeases).Detail; d != tc.released {
				t.Errorf("cleanup = %+v", out.Cleanup)
			}
			if l, err := e.p.readLease("slot-1"); err != nil || l.VMName != "vm-a" {
				t.Errorf("vm-a's lease = %+v, %v", l, err)
			}
			for _, id := range []string{"slot-0", "slot-x"} {
				if exists(e.p.leasePath(id)) {
					t.Errorf("%s's lease was left behind", id)
				}
			}
		})
	}
}

func TestAcquireLeaseIdempotent(t *testing.T) {
	e := newEnv(t, envOpts{bare: true})
	s := task.VMSlot{SlotID: "slot-0", PCIAddress: gpuAddr}
	for i, want := range []bool{true, false} {
		created, err := e.p.acquireLease("vm-1", "alloc-1", s)
		if err != nil || created != want {
			t.Fatalf("acquire #%d = %v, %v", i, created, err)
		}
	}
	if _, err := e.p.acquireLease("vm-1", "alloc-2", s); asError(t, err).Code != CodeLeaseConflict {
		t.Errorf("another allocation of the same vm_name took the lease: %v", err)
	}
	if ok, err := e.p.releaseLease("vm-2", "slot-0"); ok || err != nil {
		t.Errorf("vm-2 released vm-1's lease: %v, %v", ok, err)
	}
	writeFile(t, e.p.leasePath("slot-9"), []byte("{"))
	if _, err := e.p.acquireLease("vm-1", "alloc-1", task.VMSlot{SlotID: "slot-9", PCIAddress: gpuAddr}); asError(t, err).Code != CodeLeaseFailed {
		t.Errorf("corrupt lease: %v", err)
	}
}

// TestSlotlessProvision: a plain VM on a host with no GPU boots an overlay
// of the cached image with user-mode networking, and readiness reads the
// guest's SSH banner through the forward.
func TestSlotlessProvision(t *testing.T) {
	e := newEnv(t, envOpts{bare: true})
	port := sshServer(t, "SSH-2.0-OpenSSH_9.6")
	params := task.VMProvisionParams{AllocationID: "alloc-2", VMName: "plain_1", ImageURL: "file://" + e.imgPath,
		ImageSHA256: e.imgSHA, ImageTrusted: true, VCPUs: 2, MemoryMiB: 1024, Accel: "tcg",
		Network: &api.NetworkSpec{Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22, HostPort: port}}}}
	out, _, err := e.p.Provision(context.Background(), params, nil)
	if err != nil {
		t.Fatalf("Provision: %v\n%+v", err, out.Phases)
	}
	if out.PrivateIP != UserNetGuestIP || out.SSHHost != "127.0.0.1" || out.SSHPort != port || out.SlotCount != 0 ||
		out.Readiness.SSHBanner != "SSH-2.0-OpenSSH_9.6" || !out.Readiness.Ready || out.Performance.Accel != "tcg" ||
		out.Performance.VCPUs != 2 || out.Performance.MemoryMiB != 1024 || out.Image.Verified {
		t.Errorf("output = %+v", out)
	}
	for name, want := range map[string]string{
		PhaseLeaseAcquire:         "skipped: no slots",
		PhaseVFIOBindCheck:        "skipped: no slots",
		PhaseImageDigestVerify:    "skipped: image_trusted",
		PhaseDHCPReservation:      "skipped: no slot has a mac_address and private_ip",
		PhaseImageWriteConvert:    "overlay: ",
		PhaseHostPassthroughCheck: "no slots: no passthrough needed",
	} {
		if d := phaseResult(t, out.Phases, name).Detail; !strings.Contains(d, want) {
			t.Errorf("%s detail = %q, want %q", name, d, want)
		}
	}
	st, err := e.rt.Inspect(context.Background(), "plain_1")
	if err != nil || st.Spec.Image != runtime.DiskImage(api.Artifact{URL: "file://" + e.imgPath, SHA256: e.imgSHA}) || st.Spec.VM.BootDevice != "" ||
		st.Spec.Devices.PCI != nil || st.Spec.VM.Network.Mode != "user" {
		t.Errorf("spec = %+v, %v", st.Spec, err)
	}
	if b, err := os.ReadFile(filepath.Join(e.ciDir, "plain_1", "meta-data")); err != nil || !strings.Contains(string(b), `"plain-1"`) {
		t.Errorf("meta-data = %s, %v", b, err)
	}
}

// TestReadinessNeedsSSHBanner: a forward that accepts and closes is not
// ready; the provision fails at readiness and cleans up.
func TestReadinessNeedsSSHBanner(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{bare: true})
	port := sshServer(t, "")
	params := task.VMProvisionParams{AllocationID: "a", VMName: "vm-2", ImagePath: e.imgPath, ImageSHA256: e.imgSHA,
		ReadinessTimeoutSeconds: 5, Network: &api.NetworkSpec{Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22, HostPort: port}}}}
	out, _, err := e.p.Provision(context.Background(), params, nil)
	fe := asError(t, err)
	if fe.Phase != PhaseReadiness || !strings.Contains(fe.Message, "did not answer") || !out.Readiness.MarkerSeen || out.Readiness.Ready {
		t.Fatalf("err = %+v, readiness %+v", fe, out.Readiness)
	}
	assertGone(t, e, "vm-2")
}

func TestImageFailures(t *testing.T) {
	e := newEnv(t, envOpts{bare: true})
	outside := filepath.Join(t.TempDir(), "elsewhere.img")
	writeFile(t, outside, []byte("x"))
	tests := []struct {
		name   string
		mutate func(*task.VMProvisionParams)
		code   string
		msg    string
	}{
		{"digest mismatch", func(p *task.VMProvisionParams) { p.ImageSHA256 = strings.Repeat("ab", 32) }, CodeImageDigest, "digest mismatch"},
		{"path not allowed", func(p *task.VMProvisionParams) { p.ImagePath = outside; p.ImageSHA256 = fileSHA(t, outside) },
			CodeImagePathNotAllow, "path not allowed"},
		{"missing url", func(p *task.VMProvisionParams) { p.ImagePath, p.ImageURL = "", "file://"+e.imgPath+".missing" },
			CodeImageFetchFailed, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			params := task.VMProvisionParams{AllocationID: "a", VMName: "vm-3", ImagePath: e.imgPath, ImageSHA256: e.imgSHA}
			tc.mutate(&params)
			out, _, err := e.p.Provision(context.Background(), params, nil)
			fe := asError(t, err)
			if fe.Phase != PhaseImageStatDownload || fe.Code != tc.code || !strings.Contains(fe.Message, tc.msg) {
				t.Fatalf("err = %+v", fe)
			}
			if len(out.Cleanup) != 4 {
				t.Errorf("cleanup = %+v", out.Cleanup)
			}
		})
	}
}

func TestHostChecksFail(t *testing.T) {
	noKVM := sliceHost()
	noKVM.KVM = false
	otherOS := sliceHost()
	otherOS.Files["etc/os-release"] = "NAME=Plan 9\nID=plan9\n"
	linuxBridge := sliceHost()
	linuxBridge.Virtual[0].Bridge = true
	tests := []struct {
		name    string
		o       envOpts
		phase   string
		code    string
		blocker string
	}{
		{"missing commands", envOpts{lookPath: lookPathWith("qemu-img", "ovs-vsctl")}, PhaseHostDependencies, CodeMissingDependency,
			"command_missing:qemu-img,command_missing:ovs-vsctl"},
		// A Linux bridge takes the tap without ovs-vsctl.
		{"linux bridge needs no ovs-vsctl", envOpts{host: linuxBridge, lookPath: lookPathWith("qemu-img", "ovs-vsctl")},
			PhaseHostDependencies, CodeMissingDependency, "command_missing:qemu-img"},
		// With the install setting on, a platform with no supported
		// package manager installs nothing and still reports the blocker.
		{"install on an unsupported platform", envOpts{host: otherOS, install: true, lookPath: lookPathWith("ovs-vsctl")},
			PhaseHostDependencies, CodeMissingDependency, "command_missing:ovs-vsctl"},
		{"accel does not work", envOpts{accel: func(context.Context, string) error { return errors.New("kvm_guest_hung") }},
			PhaseHostPassthroughCheck, CodeAccelUnavailable, "accel_unavailable:runtime default"},
		{"no kvm", envOpts{host: noKVM}, PhaseHostPassthroughCheck, CodePassthroughMissing, "kvm_missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.o)
			_, _, err := e.p.Provision(context.Background(), e.slotParams(), nil)
			if fe := asError(t, err); fe.Phase != tc.phase || fe.Code != tc.code || fe.Blocker != tc.blocker {
				t.Fatalf("err = %+v", fe)
			}
			assertGone(t, e, "vm-1", "slot-0")
		})
	}
}

func TestRuntimeValidate(t *testing.T) {
	mounted := sliceHost()
	mounted.Files["proc/self/mountinfo"] += "40 22 259:5 / /data rw - ext4 /dev/nvme0n1p1 rw\n"
	mounted.Block[0].Partitions = []string{"nvme0n1p1"}
	noBridge := sliceHost()
	noBridge.Virtual = nil
	tests := []struct {
		name    string
		host    hostinfotest.Host
		mutate  func(*env, *task.VMProvisionParams)
		code    string
		blocker string
		msg     string
	}{
		{"mounted", mounted, nil, CodeRuntimeInvalid, "nvme_busy:", "/dev/nvme0n1p1 is mounted at /data"},
		{"no bridge", noBridge, nil, CodeRuntimeInvalid, "ovs_bridge_missing:br-slice", "bridge br-slice does not exist"},
		{"name owned by the reconciler", sliceHost(), func(e *env, p *task.VMProvisionParams) {
			if _, err := e.rt.Create(context.Background(), runtime.Spec{ID: "vm-1", Owner: "reconciler"}); err != nil {
				t.Fatal(err)
			}
		}, CodeVMNameInUse, "", `owned by "reconciler"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{host: tc.host})
			params := e.slotParams()
			if tc.mutate != nil {
				tc.mutate(e, &params)
			}
			out, _, err := e.p.Provision(context.Background(), params, nil)
			fe := asError(t, err)
			if fe.Phase != PhaseRuntimeValidate || fe.Code != tc.code || !strings.HasPrefix(fe.Blocker, tc.blocker) ||
				!strings.Contains(fe.Message, tc.msg) {
				t.Fatalf("err = %+v", fe)
			}
			if phaseNames(out.Cleanup)[0] != CleanupDHCP || e.rt.CallCount("destroy", "vm-1") != 0 {
				t.Errorf("cleanup = %+v, destroy calls %d", out.Cleanup, e.rt.CallCount("destroy", "vm-1"))
			}
		})
	}
}

func TestInvalidParams(t *testing.T) {
	e := newEnv(t, envOpts{bare: true})
	_, _, err := e.p.Provision(context.Background(), task.VMProvisionParams{VMName: "../etc", ImageSHA256: e.imgSHA}, nil)
	if fe := asError(t, err); fe.Code != "invalid_params" || !strings.Contains(fe.Message, "params.vm_name") {
		t.Fatalf("err = %+v", fe)
	}
	_, _, err = e.p.Release(context.Background(), task.VMReleaseParams{VMName: "a/b"}, nil)
	if fe := asError(t, err); fe.Code != "invalid_params" {
		t.Fatalf("err = %+v", fe)
	}
	if exists(e.state) || exists(e.ciDir) {
		t.Error("invalid params created files")
	}
}

func TestReadinessMarkerMatchesCloudInit(t *testing.T) {
	if task.ReadinessMarkerPrefix != cloudinit.DefaultReadyPrefix {
		t.Errorf("task.ReadinessMarkerPrefix %q != cloudinit.DefaultReadyPrefix %q", task.ReadinessMarkerPrefix, cloudinit.DefaultReadyPrefix)
	}
}
