package slicevm

// slice.vm_provision: its 17 phases (docs/contract.md) and the deferred cleanup.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/cloudinit"
	"github.com/drover-dev/drover/internal/node/guestssh"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Output values fixed by the task's contract.
const (
	ConsoleModel = "gateway_required"
	// UserNetGuestIP is the guest's address on QEMU user-mode networking.
	UserNetGuestIP = "10.0.2.15"
	// cleanupTimeout bounds the deferred cleanup, which runs even when
	// the task's context has ended.
	cleanupTimeout = 2 * time.Minute
)

// ProvisionOutput is slice.vm_provision's result. On failure it holds the
// phases that ran, the failed phase and the cleanup steps.
type ProvisionOutput struct {
	VMName       string `json:"vm_name"`
	AllocationID string `json:"allocation_id"`
	DefaultUser  string `json:"default_user"`
	PrivateIP    string `json:"private_ip"`
	// SSHHost is where to reach SSHPort: the private IP on a slice
	// network, 127.0.0.1 with user-mode networking (SSHPort is then the
	// forwarded host port; 0 when there is no ssh forward).
	SSHHost     string      `json:"ssh_host"`
	SSHPort     int         `json:"ssh_port"`
	SlotCount   int         `json:"slot_count"`
	Readiness   Readiness   `json:"readiness"`
	Performance Performance `json:"performance"`
	// Telemetry is the guest's first telemetry, collected over the
	// brokered SSH channel right after readiness (nil without a terminal
	// record); the agent collects it again on an interval.
	Telemetry    *guestssh.Telemetry `json:"telemetry,omitempty"`
	Timings      map[string]int64    `json:"timings"`
	RawVNC       bool                `json:"raw_vnc"`
	ConsoleModel string              `json:"console_model"`
	SerialSocket string              `json:"serial_socket"`
	TerminalKey  TerminalKey         `json:"terminal_key"`
	Image        ImageInfo           `json:"image"`
	Runtime      string              `json:"runtime"`
	Phases       []PhaseResult       `json:"phases"`
	FailedPhase  string              `json:"failed_phase,omitempty"`
	Cleanup      []PhaseResult       `json:"cleanup,omitempty"`
	// Notes say where Drover does a step differently from the phase's name
	// (cloud_localds, virt_install).
	Notes []string `json:"notes"`
}

// Readiness says how the guest became ready.
type Readiness struct {
	Ready bool `json:"ready"`
	// SerialMarker is the line the runtime watched the serial console
	// for; MarkerSeen says it appeared (runtime Ready).
	SerialMarker string `json:"serial_marker"`
	MarkerSeen   bool   `json:"marker_seen"`
	// SSHBanner is what the ssh forward answered ("" without a forward).
	SSHBanner string `json:"ssh_banner,omitempty"`
	WaitedMS  int64  `json:"waited_ms"`
	// TelemetryReady says the first guest telemetry collection over the
	// brokered SSH channel succeeded (ProvisionOutput.Telemetry).
	TelemetryReady bool `json:"telemetry_ready"`
}

// Performance is what the runtime reports of the running VM.
type Performance struct {
	BootToReadyMS int64  `json:"boot_to_ready_ms"`
	Accel         string `json:"accel"`
	VCPUs         int    `json:"vcpus"`
	MemoryMiB     int    `json:"memory_mib"`
	Runtime       string `json:"runtime"`
	PID           int    `json:"pid,omitempty"`
	// Guest is the bounded probe run inside the guest over the brokered
	// SSH channel (CPU loop, memory and disk throughput, GPU visibility);
	// nil when it could not run, GuestProbeError saying why.
	Guest           *guestssh.Probe `json:"guest,omitempty"`
	GuestProbeError string          `json:"guest_probe_error,omitempty"`
}

// TerminalKey is the per-VM key the terminal gateway brokers SSH with.
type TerminalKey struct {
	PublicKey   string `json:"public_key,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Path        string `json:"path,omitempty"` // private key, on the node
}

// ImageInfo is the base image as cached.
type ImageInfo struct {
	Source   string `json:"source"`
	Path     string `json:"path,omitempty"`
	SHA256   string `json:"sha256"`
	Bytes    int64  `json:"bytes,omitempty"`
	Cached   bool   `json:"cached"`
	Verified bool   `json:"verified"`
}

// provision is one Provision call's state: what it found and what it
// made, so that cleanup undoes exactly that.
type provision struct {
	p      *Provisioner
	params task.VMProvisionParams
	t      *tracker
	out    *ProvisionOutput

	cmds        commands
	img         image.Result
	network     api.NetworkSpec
	dir, iso    string
	terminalPub string
	existing    *runtime.Status // the VM as found before virt_install
	events      <-chan runtime.Event
	startedAt   time.Time
	readyAt     time.Time

	leased        []string // slot ids whose lease this call created
	dirCreated    bool
	keyCreated    bool
	telemetryNew  bool
	dhcpNew       bool
	vmCreated     bool
	hadDHCP       bool
	hadTelemetry  bool
	hadCloudInitD bool
}

// Provision runs slice.vm_provision. params are validated again here
// (their names become file names). progress, when non-nil, is called as
// each phase and cleanup step finishes. On failure the deferred cleanup
// undoes what this call made (never another VM's leases or files), and
// the error is an *Error naming the failed phase; the output lists the
// phases and cleanup steps.
func (p *Provisioner) Provision(ctx context.Context, params task.VMProvisionParams, progress func(phase string, d time.Duration, err error)) (ProvisionOutput, map[string]int64, error) {
	t := newTracker(p.opts.Now, progress)
	out := ProvisionOutput{VMName: params.VMName, AllocationID: params.AllocationID, Timings: t.timings,
		ConsoleModel: ConsoleModel, Runtime: p.opts.Runtime.Name(), Phases: []PhaseResult{}, Notes: []string{}}
	params, err := revalidate(params)
	if err != nil {
		return out, t.timings, err
	}
	unlock := p.lockVM(params.VMName)
	defer unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	pr := &provision{p: p, params: params, t: t, out: &out, network: vmNetwork(params)}
	out.DefaultUser, out.SlotCount = params.DefaultUsername, len(params.Slots)
	out.Image = ImageInfo{Source: imageSource(params), SHA256: params.ImageSHA256}
	out.Readiness.SerialMarker = params.ReadinessMarker
	out.Notes = notes(params, pr.network)
	if err := p.checkDevices(ctx, provisionRefs(params.Slots)); err != nil {
		out.FailedPhase = PhaseDeviceCheck
		p.opts.Log.Warn("slicevm: provision refused", "vm_name", params.VMName, "err", err)
		return out, t.timings, err
	}
	err = pr.run(ctx)
	out.Phases = append(out.Phases, t.results...)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			out.FailedPhase = e.Phase
		}
		n := len(t.results)
		if cerr := pr.cleanup(ctx); cerr != "" && e != nil {
			e.Message += "; cleanup failed: " + cerr
		}
		out.Cleanup = append([]PhaseResult{}, t.results[n:]...)
		out.Timings = maps.Clone(t.timings)
		p.opts.Log.Warn("slicevm: provision failed", "vm_name", params.VMName, "err", err)
		return out, t.timings, err
	}
	out.Timings = maps.Clone(t.timings)
	p.opts.Log.Info("slicevm: provisioned", "vm_name", params.VMName, "slots", len(params.Slots),
		"boot_to_ready_ms", out.Performance.BootToReadyMS)
	return out, t.timings, nil
}

// revalidate runs params through the task contract again.
func revalidate(params task.VMProvisionParams) (task.VMProvisionParams, error) {
	b, err := json.Marshal(params)
	if err != nil {
		return params, &Error{CodedError: api.CodedError{Code: "invalid_params", Phase: "params", Message: err.Error(), Err: err}}
	}
	got, fe := task.DecodeVMProvisionParams(b)
	if fe != nil {
		return params, &Error{CodedError: api.CodedError{Code: "invalid_params", Phase: "params", Message: fieldErrs(fe)}}
	}
	return got, nil
}

func fieldErrs(fe []api.FieldError) string {
	parts := make([]string, len(fe))
	for i, f := range fe {
		parts[i] = f.Field + ": " + f.Message
	}
	return strings.Join(parts, "; ")
}

// vmNetwork is the VM's network: params.Network, else a tap on the OVS
// bridge (with slots), else user-mode networking with an ssh forward.
func vmNetwork(params task.VMProvisionParams) api.NetworkSpec {
	mac := ""
	if len(params.Slots) > 0 {
		mac = params.Slots[0].MACAddress
	}
	if params.Network != nil {
		n := *params.Network
		if n.Mode == "" {
			n.Mode = api.NetworkUser
		}
		if n.Mode == api.NetworkTap && n.MAC == "" {
			n.MAC = mac
		}
		return n
	}
	if len(params.Slots) > 0 && params.OVSBridge != "" {
		return api.NetworkSpec{Mode: api.NetworkTap, Bridge: params.OVSBridge, MAC: mac}
	}
	return api.NetworkSpec{Mode: api.NetworkUser, Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22}}}
}

// sshForward names the forward to guest port 22, if any.
func sshForward(n api.NetworkSpec) string {
	if n.Mode != api.NetworkUser {
		return ""
	}
	for _, f := range n.Forwards {
		if f.GuestPort == 22 {
			return f.Name
		}
	}
	return ""
}

func notes(params task.VMProvisionParams, n api.NetworkSpec) []string {
	out := []string{
		"host_dependencies: commands are looked up; missing packages are installed only with the agent's install_dependencies setting",
		"cloud_localds: the NoCloud seed ISO is built in Go (internal/node/cloudinit) instead of running cloud-localds",
		"virt_install: QEMU is launched directly through the runtime instead of virt-install/libvirt",
	}
	if bootDevice(params) == "" {
		out = append(out, "image_write_convert: no boot NVMe: the runtime boots a qcow2 overlay of the cached image")
	}
	nvme := 0
	for _, s := range params.Slots {
		if s.NVMeDevice != "" {
			nvme++
		}
	}
	if nvme > 1 {
		out = append(out, "only the first slot's NVMe is attached (as the boot disk); the other slots' NVMe devices are leased, checked and wiped on release but not attached")
	}
	if len(params.Slots) > 0 && params.DriverStrategy == task.DriverCloudInit {
		out = append(out, "driver_strategy cloud-init: the seed writes /etc/drover/slice.json naming the strategy; it does not install a GPU driver itself")
	}
	if n.Mode == api.NetworkUser && len(params.Slots) > 0 {
		out = append(out, "user-mode networking: the slots' DHCP reservations are written but the guest is reached through the ssh forward")
	}
	return out
}

// bootDevice is the first slot's NVMe, the VM's boot disk ("" for none).
func bootDevice(params task.VMProvisionParams) string {
	if len(params.Slots) > 0 {
		return params.Slots[0].NVMeDevice
	}
	return ""
}

func (pr *provision) run(ctx context.Context) error {
	p, params := pr.p, pr.params
	phases := []phase{
		{PhaseLeaseAcquire, pr.leaseAcquire},
		{PhaseHostDependencies, pr.hostDependencies},
		{PhaseHostPassthroughCheck, func(ctx context.Context) (step, error) { return p.hostPassthroughCheck(ctx, params) }},
		{PhaseVFIOBindCheck, func(ctx context.Context) (step, error) { return p.bindVFIO(ctx, passthroughDevices(params.Slots)) }},
		{PhaseImageStatDownload, func(ctx context.Context) (step, error) {
			var st step
			var err error
			pr.img, st, err = p.fetchImage(ctx, params)
			pr.out.Image.Path, pr.out.Image.Bytes, pr.out.Image.Cached = pr.img.Path, pr.img.Bytes, pr.img.Cached
			return st, err
		}},
		{PhaseImageDigestVerify, func(ctx context.Context) (step, error) {
			st, err := p.verifyImage(ctx, params)
			pr.out.Image.Verified = err == nil && !st.skipped
			return st, err
		}},
		{PhaseCloudInitDir, pr.cloudInitDir},
		{PhaseTerminalKey, pr.terminalKey},
		{PhaseGuestTelemetry, pr.registerTelemetry},
		{PhaseCloudInitSeedFiles, pr.seedFiles},
		{PhaseCloudLocalDS, pr.buildISO},
		{PhaseRuntimeValidate, pr.runtimeValidate},
		{PhaseDHCPReservation, pr.dhcpReservation},
		{PhaseImageWriteConvert, pr.imageWrite},
		{PhaseVirtInstall, pr.virtInstall},
		{PhaseReadiness, pr.readiness},
		{PhasePerformanceProbe, pr.performanceProbe},
	}
	for _, ph := range phases {
		if _, err := pr.t.run(ctx, ph.name, ph.fn); err != nil {
			return err
		}
	}
	return nil
}

func (pr *provision) leaseAcquire(context.Context) (step, error) {
	if len(pr.params.Slots) == 0 {
		return skipped("no slots"), nil
	}
	// Under leaseMu no other provision takes a lease between the check
	// and the last lease taken here.
	pr.p.leaseMu.Lock()
	defer pr.p.leaseMu.Unlock()
	fe, err := pr.p.leaseConflicts(pr.params.VMName, provisionRefs(pr.params.Slots))
	if err != nil {
		return step{}, failf(CodeLeaseFailed, "read leases: %w", err)
	}
	if err := deviceErr(CodeLeaseConflict, PhaseLeaseAcquire, fe); err != nil {
		return step{}, err
	}
	var kept []string
	for _, s := range pr.params.Slots {
		created, err := pr.p.acquireLease(pr.params.VMName, pr.params.AllocationID, s)
		if err != nil {
			return step{}, err
		}
		if created {
			pr.leased = append(pr.leased, s.SlotID)
		} else {
			kept = append(kept, s.SlotID)
		}
	}
	st := done("leased %s", strings.Join(pr.leased, ", "))
	if len(kept) > 0 {
		st.detail += fmt.Sprintf("; already held by this vm: %s", strings.Join(kept, ", "))
	}
	return st, nil
}

func (pr *provision) cloudInitDir(context.Context) (step, error) {
	pr.dir = filepath.Join(pr.p.opts.CloudInitDir, pr.params.VMName)
	pr.hadCloudInitD = exists(pr.dir)
	if err := os.MkdirAll(pr.p.opts.CloudInitDir, 0o755); err != nil {
		return step{}, failf(CodeCloudInitFailed, "create %s: %w", pr.p.opts.CloudInitDir, err)
	}
	if err := os.Mkdir(pr.dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return step{}, failf(CodeCloudInitFailed, "create %s: %w", pr.dir, err)
	}
	pr.dirCreated = !pr.hadCloudInitD
	if err := os.Chmod(pr.dir, 0o700); err != nil {
		return step{}, failf(CodeCloudInitFailed, "chmod %s: %w", pr.dir, err)
	}
	if pr.hadCloudInitD {
		return done("%s (existed)", pr.dir), nil
	}
	return done("%s", pr.dir), nil
}

func (pr *provision) terminalKey(context.Context) (step, error) {
	pub, fp, created, err := pr.p.terminalKey(pr.params.VMName)
	if err != nil {
		return step{}, failf(CodeTerminalKeyFailed, "terminal key for %s: %w", pr.params.VMName, err)
	}
	pr.terminalPub, pr.keyCreated = pub, created
	pr.out.TerminalKey = TerminalKey{PublicKey: pub, Fingerprint: fp, Path: pr.p.keyPath(pr.params.VMName)}
	if !created {
		return done("reused %s (%s)", pr.p.keyPath(pr.params.VMName), fp), nil
	}
	return done("generated ed25519 %s (%s)", pr.p.keyPath(pr.params.VMName), fp), nil
}

func (pr *provision) registerTelemetry(context.Context) (step, error) {
	path := pr.p.telemetryPath(pr.params.VMName)
	pr.hadTelemetry = exists(path)
	b, err := json.MarshalIndent(guestOf(pr.params, pr.p.opts.Now()), "", "  ")
	if err == nil {
		err = writeAtomic(path, append(b, '\n'), 0o644)
	}
	if err != nil {
		return step{}, failf(CodeTelemetryFailed, "register guest %s: %w", pr.params.VMName, err)
	}
	pr.telemetryNew = !pr.hadTelemetry
	return done("%s; telemetry is collected over the brokered ssh after readiness, then by the agent on its interval", path), nil
}

// sliceInfo is /etc/drover/slice.json in the guest.
type sliceInfo struct {
	VMName         string      `json:"vm_name"`
	AllocationID   string      `json:"allocation_id"`
	DriverStrategy string      `json:"driver_strategy"`
	Slots          []GuestSlot `json:"slots"`
}

func (pr *provision) seedFiles(context.Context) (step, error) {
	g := guestOf(pr.params, pr.p.opts.Now())
	info, err := json.MarshalIndent(sliceInfo{VMName: g.VMName, AllocationID: g.AllocationID,
		DriverStrategy: g.DriverStrategy, Slots: g.Slots}, "", "  ")
	if err != nil {
		return step{}, failf(CodeCloudInitFailed, "encode slice.json: %w", err)
	}
	keys := append(append([]string{}, pr.params.SSHPublicKeys...), pr.terminalPub)
	cfg := cloudinit.Config{
		InstanceID:        pr.params.VMName,
		User:              pr.params.DefaultUsername,
		SSHAuthorizedKeys: keys,
		ReadyMarker:       pr.params.ReadinessMarker,
		ReadyFile:         ReadyFile,
		Files:             []cloudinit.File{{Path: "/etc/drover/slice.json", Content: append(info, '\n'), Permissions: 0o644}},
	}
	if err := cloudinit.WriteSeedDir(pr.dir, cfg); err != nil {
		return step{}, failf(CodeCloudInitFailed, "write seed: %w", err)
	}
	return done("user-data, meta-data in %s (%d authorized keys incl. the terminal key)", pr.dir, len(keys)), nil
}

func (pr *provision) buildISO(ctx context.Context) (step, error) {
	pr.iso = filepath.Join(pr.dir, "seed.iso")
	if err := cloudinit.BuildISO(ctx, pr.dir, pr.iso); err != nil {
		return step{}, failf(CodeCloudInitFailed, "build seed ISO: %w", err)
	}
	return done("%s built in Go (label %s) instead of cloud-localds", pr.iso, cloudinit.VolumeLabel), nil
}

func (pr *provision) runtimeValidate(ctx context.Context) (step, error) {
	var details []string
	if pr.network.Mode == api.NetworkTap {
		if err := pr.p.checkBridge(pr.network.Bridge); err != nil {
			return step{}, err
		}
		details = append(details, "bridge "+pr.network.Bridge+" exists")
	}
	for _, s := range pr.params.Slots {
		if s.NVMeDevice == "" {
			continue
		}
		resolved, err := pr.p.checkDevice(s.NVMeDevice)
		if err != nil {
			return step{}, err
		}
		details = append(details, fmt.Sprintf("%s (%s) free", s.NVMeDevice, resolved))
	}
	st, err := pr.p.opts.Runtime.Inspect(ctx, pr.params.VMName)
	switch {
	case errors.Is(err, runtime.ErrNotFound):
	case err != nil:
		return step{}, failf(CodeRuntimeInvalid, "inspect %s: %w", pr.params.VMName, err)
	case st.Owner != Owner:
		return step{}, failf(CodeVMNameInUse, "vm_name %s is an instance owned by %q", pr.params.VMName, st.Owner)
	default:
		pr.existing = &st
		details = append(details, fmt.Sprintf("vm exists (%s)", st.State))
	}
	if len(details) == 0 {
		return done("network %s; no devices to check", pr.network.Mode), nil
	}
	return done("%s", strings.Join(details, "; ")), nil
}

func (pr *provision) imageWrite(ctx context.Context) (step, error) {
	dev := bootDevice(pr.params)
	if dev == "" {
		return done("overlay: the runtime boots a qcow2 overlay of %s", pr.img.Path), nil
	}
	if pr.existing != nil && pr.existing.State == runtime.StateRunning {
		return skipped("vm %s already runs from %s", pr.params.VMName, dev), nil
	}
	return pr.p.writeImage(ctx, pr.cmds.qemuImg, imageField(pr.params), pr.img.Path, dev)
}

// spec is the runtime spec of the VM.
func (pr *provision) spec() runtime.Spec {
	params := pr.params
	n := pr.network
	s := runtime.Spec{
		ID: params.VMName, Owner: Owner,
		Resources: runtime.Resources{VCPUs: params.TotalVCPUs(), MemoryMiB: params.TotalMemoryMiB()},
		Ports:     n.Forwards,
		Readiness: runtime.Readiness{Readiness: api.Readiness{SerialMarker: params.ReadinessMarker, Timeout: api.Duration(pr.readinessTimeout())}},
		Devices:   runtime.Devices{PCI: passthroughDevices(params.Slots)},
		VM: &runtime.VMSpec{Accel: params.Accel, SeedISO: pr.iso, Boot: params.Boot,
			Network: runtime.VMNetwork{Mode: n.Mode, Bridge: n.Bridge, MAC: n.MAC}},
	}
	if dev := bootDevice(params); dev != "" {
		s.VM.BootDevice = dev
	} else {
		s.Image = runtime.DiskImage(api.Artifact{URL: imageSource(params), SHA256: params.ImageSHA256})
	}
	return s
}

func (pr *provision) readinessTimeout() time.Duration {
	return time.Duration(pr.params.ReadinessTimeoutSeconds) * time.Second
}

func (pr *provision) virtInstall(ctx context.Context) (step, error) {
	rt := pr.p.opts.Runtime
	pr.events = rt.Subscribe(ctx) // before Start, so the ready event is not missed
	if _, err := rt.Create(ctx, pr.spec()); err != nil {
		return step{}, &Error{CodedError: api.CodedError{Code: CodeVMCreateFailed, Err: err,
			Message: fmt.Sprintf("create %s (%s): %v", pr.params.VMName, runtime.ReasonOf(err, api.ReasonVMStartFailed), err)}}
	}
	pr.vmCreated = pr.existing == nil
	st, err := rt.Start(ctx, pr.params.VMName)
	if err != nil {
		return step{}, &Error{CodedError: api.CodedError{Code: CodeVMStartFailed, Err: err,
			Message: fmt.Sprintf("start %s (%s): %v", pr.params.VMName, runtime.ReasonOf(err, api.ReasonVMStartFailed), err)}}
	}
	pr.startedAt = st.StartedAt
	if pr.startedAt.IsZero() {
		pr.startedAt = pr.p.opts.Now()
	}
	pr.out.SerialSocket = st.SerialSocket
	how := "created and started"
	if pr.existing != nil {
		how = "existed; started"
	}
	return done("%s %s through the %s runtime (pid %d, %d PCI devices) instead of virt-install",
		how, pr.params.VMName, rt.Name(), st.PID, len(pr.spec().Devices.PCI)), nil
}

func (pr *provision) performanceProbe(ctx context.Context) (step, error) {
	st, err := pr.p.opts.Runtime.Inspect(ctx, pr.params.VMName)
	if err != nil {
		return step{}, failf(CodeProbeFailed, "inspect %s: %w", pr.params.VMName, err)
	}
	if st.State != runtime.StateRunning {
		return step{}, failf(CodeProbeFailed, "%s is %s after readiness", pr.params.VMName, st.State)
	}
	perf := Performance{Guest: pr.out.Performance.Guest, Accel: st.Accel, VCPUs: st.Spec.Resources.VCPUs, MemoryMiB: st.Spec.Resources.MemoryMiB,
		Runtime: pr.p.opts.Runtime.Name(), PID: st.PID}
	if !pr.readyAt.IsZero() {
		perf.BootToReadyMS = pr.readyAt.Sub(pr.startedAt).Milliseconds()
	}
	pr.out.Performance = perf
	if st.SerialSocket != "" {
		pr.out.SerialSocket = st.SerialSocket
	}
	guest := "no guest probe: no brokered ssh to the guest"
	if _, err := pr.p.Terminal(pr.params.VMName, pr.params.AllocationID); err == nil {
		guest = pr.guestProbe(ctx)
	}
	return done("boot_to_ready %dms, accel %s, %d vcpus, %d MiB; %s", perf.BootToReadyMS, perf.Accel, perf.VCPUs, perf.MemoryMiB, guest), nil
}
