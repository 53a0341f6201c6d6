package qemu

import (
	"slices"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

func baseLaunch() Launch {
	return Launch{
		Arch: "amd64", Accel: "tcg",
		Disk: "/s/overlays/vm1.qcow2", DiskFormat: "qcow2",
		QMPSocket: "/s/i/vm1/qmp.sock", SerialSocket: "/s/i/vm1/serial.sock", SerialLog: "/s/i/vm1/serial.log",
		PIDFile: "/s/i/vm1/qemu.pid", Daemonize: true,
	}
}

func baseSpec() runtime.Spec {
	return runtime.Spec{ID: "vm1", Resources: runtime.Resources{VCPUs: 2, MemoryMiB: 512}, Image: runtime.Image{URL: "file:///img", SHA256: strings.Repeat("a", 64)}, VM: &runtime.VMSpec{}}
}

func TestCommandLineBase(t *testing.T) {
	got := strings.Join(CommandLine(baseSpec(), baseLaunch()), " ")
	want := "-name drover-vm1 -machine q35 -accel tcg -m 512 -smp 2 -nodefaults -no-user-config " +
		"-display none -monitor none -device pvpanic-pci -action panic=shutdown " +
		"-drive if=none,id=disk0,file=/s/overlays/vm1.qcow2,format=qcow2 -device virtio-blk-pci,drive=disk0,bootindex=1 " +
		"-netdev user,id=n0 -device virtio-net-pci,netdev=n0 " +
		"-chardev socket,id=ser0,path=/s/i/vm1/serial.sock,server=on,wait=off,logfile=/s/i/vm1/serial.log,logappend=on " +
		"-serial chardev:ser0 -chardev socket,id=qmp0,path=/s/i/vm1/qmp.sock,server=on,wait=off -mon chardev=qmp0,mode=control " +
		"-pidfile /s/i/vm1/qemu.pid -daemonize"
	if got != want {
		t.Errorf("command line\n got: %s\nwant: %s", got, want)
	}
}

// hasSeq reports whether args contains seq contiguously.
func hasSeq(args, seq []string) bool {
	for i := 0; i+len(seq) <= len(args); i++ {
		if slices.Equal(args[i:i+len(seq)], seq) {
			return true
		}
	}
	return false
}

func TestCommandLineVariants(t *testing.T) {
	tests := []struct {
		name    string
		spec    func(*runtime.Spec)
		launch  func(*Launch)
		want    [][]string
		notWant [][]string
	}{
		{
			name: "user forwards sorted by name, explicit and chosen ports",
			spec: func(s *runtime.Spec) {
				s.Ports = []api.PortForward{{Name: "ssh", GuestPort: 22}, {Name: "http", GuestPort: 80, HostPort: 8080}, {GuestPort: 9000}}
				s.VM.Network.MAC = "52:54:00:12:34:56"
			},
			launch: func(l *Launch) { l.Ports = map[string]int{"ssh": 40022, "http": 8080, "9000": 40900} },
			want: [][]string{
				{"-netdev", "user,id=n0,hostfwd=tcp:127.0.0.1:40900-:9000,hostfwd=tcp:127.0.0.1:8080-:80,hostfwd=tcp:127.0.0.1:40022-:22"},
				{"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56"},
			},
		},
		{
			name: "tap",
			spec: func(s *runtime.Spec) { s.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap, Bridge: "br0"} },
			launch: func(l *Launch) {
				l.Tap = "dt0123456789abc"
			},
			want:    [][]string{{"-netdev", "tap,id=n0,ifname=dt0123456789abc,script=no,downscript=no"}},
			notWant: [][]string{{"-netdev", "user,id=n0"}},
		},
		{
			name: "vfio passthrough",
			spec: func(s *runtime.Spec) { s.Devices.PCI = []string{"0000:3b:00.0", "0000:3b:00.1"} },
			want: [][]string{{"-device", "vfio-pci,host=0000:3b:00.0", "-device", "vfio-pci,host=0000:3b:00.1"}},
		},
		{
			name: "direct boot",
			spec: func(s *runtime.Spec) {
				s.VM.Boot = &api.DirectBoot{Cmdline: "console=ttyS0 quiet drover.marker=X"}
			},
			launch: func(l *Launch) { l.Kernel, l.Initrd = "/c/sha256/k", "/c/sha256/i" },
			want:   [][]string{{"-kernel", "/c/sha256/k", "-initrd", "/c/sha256/i", "-append", "console=ttyS0 quiet drover.marker=X"}},
		},
		{
			name:    "direct boot without initrd or cmdline",
			spec:    func(s *runtime.Spec) { s.VM.Boot = &api.DirectBoot{} },
			launch:  func(l *Launch) { l.Kernel = "/k" },
			want:    [][]string{{"-kernel", "/k", "-netdev"}},
			notWant: [][]string{{"-initrd"}, {"-append"}},
		},
		{
			name:   "seed as a cdrom",
			launch: func(l *Launch) { l.Seed = "/s/i/vm1/seed.iso" },
			want: [][]string{{"-drive", "if=none,id=seed0,file=/s/i/vm1/seed.iso,format=raw,media=cdrom,readonly=on",
				"-device", "virtio-scsi-pci,id=scsi0", "-device", "scsi-cd,bus=scsi0.0,drive=seed0"}},
		},
		{
			name:   "boot device bypasses the page cache",
			launch: func(l *Launch) { l.Disk, l.DiskFormat, l.BlockDisk = "/dev/disk/by-id/nvme-x", "raw", true },
			want:   [][]string{{"-drive", "if=none,id=disk0,file=/dev/disk/by-id/nvme-x,format=raw,cache=none,aio=threads"}},
		},
		{
			name:   "commas in paths are doubled",
			launch: func(l *Launch) { l.Disk = "/a,b/o.qcow2"; l.QMPSocket = "/a,b/qmp.sock" },
			want: [][]string{{"-drive", "if=none,id=disk0,file=/a,,b/o.qcow2,format=qcow2"},
				{"-chardev", "socket,id=qmp0,path=/a,,b/qmp.sock,server=on,wait=off"}},
		},
		{
			name:   "kvm uses the host cpu",
			launch: func(l *Launch) { l.Accel = "kvm" },
			want:   [][]string{{"-machine", "q35", "-accel", "kvm", "-cpu", "host"}},
		},
		{
			name:    "nvmm keeps the default cpu",
			launch:  func(l *Launch) { l.Accel = "nvmm" },
			want:    [][]string{{"-accel", "nvmm", "-m"}},
			notWant: [][]string{{"-cpu"}},
		},
		{
			name:   "arm64 tcg",
			launch: func(l *Launch) { l.Arch = "arm64" },
			want:   [][]string{{"-machine", "virt", "-accel", "tcg", "-cpu", "max"}},
		},
		{
			name:    "no daemonize",
			launch:  func(l *Launch) { l.Daemonize = false },
			notWant: [][]string{{"-daemonize"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, l := baseSpec(), baseLaunch()
			if tc.spec != nil {
				tc.spec(&s)
			}
			if tc.launch != nil {
				tc.launch(&l)
			}
			args := CommandLine(s, l)
			for _, w := range tc.want {
				if !hasSeq(args, w) {
					t.Errorf("missing %q in\n%s", w, strings.Join(args, " "))
				}
			}
			for _, w := range tc.notWant {
				if hasSeq(args, w) {
					t.Errorf("unexpected %q in\n%s", w, strings.Join(args, " "))
				}
			}
		})
	}
}

func TestTapName(t *testing.T) {
	a, b := tapName("/var/lib/drover/qemu/instances/a"), tapName("/var/lib/drover/qemu/instances/b")
	if len(a) != 15 || a == b || a != tapName("/var/lib/drover/qemu/instances/a") {
		t.Errorf("tapName: %q %q: want 15 chars, distinct, stable", a, b)
	}
}
