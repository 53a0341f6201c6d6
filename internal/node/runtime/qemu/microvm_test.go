package qemu

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

func TestMicroVMCommandLine(t *testing.T) {
	spec := runtime.Spec{ID: "m1", Resources: runtime.Resources{VCPUs: 2, MemoryMiB: 256},
		Ports: []api.PortForward{{Name: "http", GuestPort: 8080}}, VM: &runtime.VMSpec{MicroVM: true}}
	l := Launch{Arch: "amd64", Accel: "kvm", Disk: "/o.qcow2", DiskFormat: "qcow2", Seed: "/c.img", Kernel: "/k", Initrd: "/i",
		Ports: map[string]int{"http": 4000}, SerialSocket: "/s", SerialLog: "/l", QMPSocket: "/q", PIDFile: "/p"}
	line := strings.Join(CommandLine(spec, l), " ")
	for _, want := range []string{"-machine microvm", "-cpu host", "-no-reboot", "-kernel /k -initrd /i",
		"virtio-blk-device,drive=disk0,serial=" + guestinit.RootSerial, "file=/c.img,format=raw,readonly=on",
		"virtio-blk-device,drive=cfg0,serial=" + guestinit.ConfigSerial, "hostfwd=tcp:127.0.0.1:4000-:8080",
		"virtio-net-device,netdev=n0"} {
		if !strings.Contains(line, want) {
			t.Errorf("kvm: %q not in %s", want, line)
		}
	}
	if strings.Contains(line, "pci") {
		t.Errorf("a microvm line names PCI: %s", line)
	}
	if strings.Contains(line, "tsc_early_khz") {
		t.Errorf("kvm: the kernel is told the TSC rate: %s", line)
	}
	l.Accel = "tcg" // the host's TSC rate unknown: q35
	line = strings.Join(CommandLine(spec, l), " ")
	if !strings.Contains(line, "-machine q35") || !strings.Contains(line, "virtio-blk-pci,drive=disk0") || strings.Contains(line, "tsc_early_khz") {
		t.Errorf("tcg default without the TSC rate: %s", line)
	}
	l.TSCKHz = 2300000 // known: microvm, and the kernel is told it
	line = strings.Join(CommandLine(spec, l), " ")
	if !strings.Contains(line, "-machine microvm") || !strings.Contains(line, "tsc_early_khz=2300000") {
		t.Errorf("tcg default with the TSC rate: %s", line)
	}
	l.TSCKHz, l.Machine = 0, "microvm"
	if line = strings.Join(CommandLine(spec, l), " "); !strings.Contains(line, "-machine microvm") {
		t.Errorf("tcg with machine microvm: %s", line)
	}
}

// TestMicroVMCommandLineBridge: a microVM in mode bridge gets netsetup's
// tap and MAC (no user networking, no hostfwd: the forwards are DNAT
// rules), and its config drive the lease's static address.
func TestMicroVMCommandLineBridge(t *testing.T) {
	spec := runtime.Spec{ID: "m1", Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128},
		Ports: []api.PortForward{{Name: "http", GuestPort: 8080}},
		VM:    &runtime.VMSpec{MicroVM: true, Network: runtime.VMNetwork{Mode: api.NetworkBridge}}}
	r := newTestRuntime(t, shortDir(t), nil)
	in := &instance{id: "m1", spec: spec}
	l := r.launchFor(in, persisted{Disk: "/o.qcow2", DiskFormat: "qcow2", Seed: "/c.img", Kernel: "/k", Initrd: "/i"},
		map[string]int{"http": 4000}, "")
	l.Arch, l.Accel = "amd64", "kvm"
	line := strings.Join(CommandLine(spec, l), " ")
	tap, mac := netsetup.TapName("m1"), netsetup.MACFor("m1")
	for _, want := range []string{"-netdev tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
		"-device virtio-net-device,netdev=n0,mac=" + mac} {
		if !strings.Contains(line, want) {
			t.Errorf("%q not in %s", want, line)
		}
	}
	if strings.Contains(line, "hostfwd") || strings.Contains(line, "user,") {
		t.Errorf("mode bridge has user networking: %s", line)
	}
	lease := netsetup.Lease{Tap: tap, MAC: mac, IP: netip.MustParseAddr("10.88.0.5"), Gateway: netip.MustParseAddr("10.88.0.1"),
		Prefix: 24, DNS: []netip.Addr{netip.MustParseAddr("1.1.1.1")}}
	if n := bridgeNetwork(lease); n != (guestinit.Network{Address: "10.88.0.5/24", Gateway: "10.88.0.1", DNS: "1.1.1.1"}) {
		t.Errorf("guest network %+v", n)
	}
	if f := bridgeForwards(spec.Ports, map[string]int{"http": 4000}); len(f) != 1 || f[0] != (netsetup.Forward{Proto: "tcp", HostPort: 4000, GuestPort: 8080}) {
		t.Errorf("forwards %+v", f)
	}
	in.st.LeaseIP = "10.88.0.5"
	if addr, direct, err := probeAddr(in, 9000); err != nil || !direct || addr != "10.88.0.5:9000" {
		t.Errorf("readiness probe address %q %v %v, want the lease's 10.88.0.5:9000", addr, direct, err)
	}
}

func TestMicroVMValidate(t *testing.T) {
	r := newTestRuntime(t, shortDir(t), nil)
	ok := runtime.Spec{ID: "m1", Image: runtime.Image{URL: "file:///r.ext4", SHA256: strings.Repeat("a", 64)},
		Command: []string{"/srv"}, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}, VM: &runtime.VMSpec{MicroVM: true}}
	if err := r.validate(ok); err == nil || !strings.Contains(err.Error(), "no microVM kernel") {
		t.Errorf("without the mode: %v", err)
	}
	r.opts.MicroVM = &MicroVMOptions{Kernel: "/k", Initrd: "/i"}
	if err := r.validate(ok); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*runtime.Spec){
		"no command":  func(s *runtime.Spec) { s.Command = nil },
		"oci, no oci": func(s *runtime.Spec) { s.Image = runtime.Image{Kind: runtime.ImageOCI, Ref: "r/x:1"} },
		"tap": func(s *runtime.Spec) {
			s.VM = &runtime.VMSpec{MicroVM: true, Network: runtime.VMNetwork{Mode: api.NetworkTap}}
		},
		"cloud-init": func(s *runtime.Spec) { s.VM = &runtime.VMSpec{MicroVM: true, CloudInit: &api.CloudInit{}} },
		"pci":        func(s *runtime.Spec) { s.Devices.PCI = []string{"0000:3b:00.0"} },
		"memory":     func(s *runtime.Spec) { s.Resources.MemoryMiB = 32 },
		"no forward": func(s *runtime.Spec) { s.Readiness.TCPPort = 80 },
		"bridge without netsetup": func(s *runtime.Spec) {
			s.VM = &runtime.VMSpec{MicroVM: true, Network: runtime.VMNetwork{Mode: api.NetworkBridge}}
		},
	} {
		s := ok
		mod(&s)
		if err := r.validate(s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMicroVMVerdict(t *testing.T) {
	dir := t.TempDir()
	in := &instance{id: "m1", dir: dir}
	r := &Runtime{}
	write := func(reps ...guestinit.Report) {
		var b strings.Builder
		b.WriteString("[ 0.3] kernel noise\r\n")
		for _, rep := range reps {
			b.WriteString("app output" + rep.Line())
		}
		if err := os.WriteFile(filepath.Join(dir, serialLogName), []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	started := guestinit.Report{Event: guestinit.EventStarted, PID: 9}
	for _, tc := range []struct {
		rep    guestinit.Report
		stop   bool
		state  runtime.State
		reason api.ReasonCode
		detail string
	}{
		{guestinit.Report{Event: guestinit.EventExited, ExitCode: 3}, false, runtime.StateCrashed, "", "workload exited with code 3"},
		{guestinit.Report{Event: guestinit.EventExited}, false, runtime.StateStopped, "", "workload exited with code 0"},
		{guestinit.Report{Event: guestinit.EventExited, ExitCode: 137, Signal: "SIGKILL", OOMKilled: true}, false,
			runtime.StateCrashed, api.ReasonOOMKilled, "workload killed by the guest kernel's OOM killer (exit code 137)"},
		{guestinit.Report{Event: guestinit.EventFailed, Error: "disks not found"}, false, runtime.StateCrashed, api.ReasonVMStartFailed, "drover-init: disks not found"},
		{guestinit.Report{Event: guestinit.EventExited, ExitCode: 143}, true, runtime.StateStopped, "", "stopped on request"},
	} {
		write(started, tc.rep)
		st, reason, detail := r.microvmVerdict(in, tc.stop, runtime.StateStopped, "", "stopped on request")
		if st != tc.state || reason != tc.reason || detail != tc.detail {
			t.Errorf("%+v: %s %q %q", tc.rep, st, reason, detail)
		}
	}
	write(started) // still running when QEMU died: the QEMU verdict stands
	if st, _, d := r.microvmVerdict(in, false, runtime.StateCrashed, "", "killed"); st != runtime.StateCrashed || d != "killed" {
		t.Errorf("no exit report: %s %q", st, d)
	}
}

func TestHostTSCKHz(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, text string
		want       int
	}{
		{"x86", "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu MHz\t\t: 2300.000\ncache size\t: 1 KB\ncpu MHz\t\t: 1.0\n", 2300000},
		{"fraction", "cpu MHz : 2199.998\n", 2199998},
		{"none (arm64)", "processor\t: 0\nBogoMIPS\t: 50.00\n", 0},
		{"garbage", "cpu MHz : fast\n", 0},
		{"absurd", "cpu MHz : 1e9\n", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name)
			if err := os.WriteFile(p, []byte(c.text), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := hostTSCKHz(p); got != c.want {
				t.Errorf("hostTSCKHz = %d, want %d", got, c.want)
			}
		})
	}
	if got := hostTSCKHz(filepath.Join(dir, "absent")); got != 0 {
		t.Errorf("absent file: %d", got)
	}
}
