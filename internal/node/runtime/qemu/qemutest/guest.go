// Package qemutest builds a tiny bootable guest for tests of the QEMU
// runtime: the host's (or CI's cached) Debian kernel and a busybox-static
// initramfs written here in Go, plus an empty qcow2 base disk. The guest
// prints a marker on ttyS0 once it can handle the ACPI power button, and
// powers off when the button is pressed, so QMP system_powerdown is a
// graceful stop. Kernel command-line knobs vary it (see Knob*).
//
// It only builds files; it never launches QEMU. Only tests may import it:
// Build skips the test (or fails it when CI=true) when the kernel, a static
// busybox or QEMU is missing.
package qemutest

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"testing"
)

// Markers the guest prints on its serial console (ttyS0).
const (
	// DefaultMarker is printed once the guest is up and listens for the
	// power button; KnobMarker replaces it.
	DefaultMarker = "DROVER-GUEST-READY"
	// PoweroffMarker is printed when the power button was pressed, right
	// before `poweroff -f`.
	PoweroffMarker = "DROVER-GUEST-POWEROFF"
)

// Kernel command-line knobs the guest's /init understands; append them to
// Guest.Cmdline.
const (
	// KnobMarker + "=WORD" prints WORD instead of DefaultMarker.
	KnobMarker = "drover.marker"
	// KnobNoButton ignores the ACPI power button (the button module is not
	// loaded): system_powerdown does nothing, as in a hung guest.
	KnobNoButton = "drover.nobutton=1"
	// KnobCrash panics the kernel right after the marker; with a pvpanic
	// device QEMU sees GUEST_PANICKED. Needs Guest.CanPanic.
	KnobCrash = "drover.crash=1"
	// KnobListen + "=PORT" brings eth0 up as 10.0.2.15 (QEMU user
	// networking's guest address) after the marker, waits KnobListenDelay
	// seconds (default 0), prints ListeningMarker and serves HTTP on PORT.
	// Needs Guest.CanNetwork.
	KnobListen      = "drover.listen"
	KnobListenDelay = "drover.listendelay"
)

// ListeningMarker is printed right before the KnobListen server starts.
const ListeningMarker = "DROVER-GUEST-LISTENING"

// EnvKernelDir names a directory holding boot/vmlinuz-<ver> and
// lib/modules/<ver> (a Debian linux-image package extracted).
const EnvKernelDir = "DROVER_TEST_KERNEL_DIR"

// kernelDirs are searched after EnvKernelDir.
var kernelDirs = []string{"/var/cache/drover-test/kernel", "/tmp/kern/root", "/"}

// Guest is a tiny bootable guest.
type Guest struct {
	Kernel  string // path of the kernel image
	Initrd  string // path of the gzip'd newc initramfs
	Cmdline string // kernel command line (console=ttyS0 ...)
	Marker  string // printed on ttyS0 when the guest is up
	Disk    string // a small empty qcow2 base image, for the runtime's overlay

	KernelSHA256, InitrdSHA256, DiskSHA256 string

	// KernelVersion is the version the modules belong to.
	KernelVersion string
	// CanPanic says the pvpanic modules are in the initramfs, so KnobCrash
	// reaches QEMU as GUEST_PANICKED.
	CanPanic bool
	// CanNetwork says the virtio-net modules are in the initramfs, so
	// KnobListen works.
	CanNetwork bool
	// CanSSHD says the guest was built with Options.SSHD: it runs OpenSSH's
	// sshd on port 22 for the cloud-init seed's user (KnobSSHD).
	CanSSHD bool
	// QEMU and QEMUImg are the binaries found on PATH.
	QEMU, QEMUImg string
}

// Options vary what Build puts into the guest; the zero value is the
// plain guest.
type Options struct {
	// SSHD adds the host's OpenSSH sshd and ssh-keygen with their shared
	// libraries and the CD-ROM and ISO 9660 modules, and KnobSSHD to the
	// command line: before the marker, the guest mounts the cloud-init seed
	// (NoCloud ISO), creates its user with the seed's ssh-* authorized keys,
	// generates an ed25519 host key, prints it on ttyS0 between
	// HostKeysBegin and HostKeysEnd (as cloud-init does) and starts sshd on
	// port 22 of 10.0.2.15. Only tests that ask pay for the bigger initramfs.
	SSHD bool
}

// Build writes the guest's files into dir (t.TempDir() when dir is "") and
// returns it. It skips t when a kernel, a static busybox or QEMU is missing,
// and fails it instead when the environment variable CI is "true".
func Build(t testing.TB, dir string) Guest {
	t.Helper()
	return BuildWith(t, dir, Options{})
}

// BuildWith is Build with options; it also skips (or fails under CI) when
// what an option needs is missing.
func BuildWith(t testing.TB, dir string, o Options) Guest {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	g, missing, err := build(dir, o)
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("qemutest: %s (required when CI=true)", missing)
		}
		t.Skipf("qemutest: %s; skipping the real-QEMU test", missing)
	}
	if err != nil {
		t.Fatalf("qemutest: %v", err)
	}
	return g
}

// build returns a non-empty missing when a prerequisite is absent.
func build(dir string, o Options) (g Guest, missing string, err error) {
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[goruntime.GOARCH]
	if arch == "" {
		return g, "no test guest for GOARCH " + goruntime.GOARCH, nil
	}
	if g.QEMU, err = exec.LookPath("qemu-system-" + arch); err != nil {
		return g, "qemu-system-" + arch + " not found on PATH", nil
	}
	if g.QEMUImg, err = exec.LookPath("qemu-img"); err != nil {
		return g, "qemu-img not found on PATH", nil
	}
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return g, "no /bin/busybox (install busybox-static)", nil
	}
	if !isStatic(busybox) {
		return g, "/bin/busybox is not statically linked (install busybox-static)", nil
	}
	k, missing := findKernel()
	if missing != "" {
		return g, missing, nil
	}
	g.Kernel, g.KernelVersion = k.vmlinuz, k.version
	g.CanPanic = k.modules["pvpanic.ko"] != "" && k.modules["pvpanic-pci.ko"] != ""
	g.CanNetwork = true
	for _, m := range netModules {
		g.CanNetwork = g.CanNetwork && k.modules[m] != ""
	}

	modules, extra := k.modules, []cpioFile(nil)
	if o.SSHD {
		if !g.CanNetwork {
			return g, "the kernel's virtio-net modules are missing (needed by Options.SSHD)", nil
		}
		mods, missing := sshdModuleFiles(k)
		if missing != "" {
			return g, missing, nil
		}
		modules = maps.Clone(k.modules)
		maps.Copy(modules, mods)
		if extra, missing, err = sshdFiles(); missing != "" || err != nil {
			return g, missing, err
		}
		g.CanSSHD = true
	}
	initrd, err := initramfs(busybox, modules, extra)
	if err != nil {
		return g, "", err
	}
	g.Initrd = filepath.Join(dir, "initrd.gz")
	if err := os.WriteFile(g.Initrd, initrd, 0o644); err != nil {
		return g, "", err
	}
	g.Disk = filepath.Join(dir, "base.qcow2")
	if out, err := exec.Command(g.QEMUImg, "create", "-q", "-f", "qcow2", g.Disk, "64M").CombinedOutput(); err != nil {
		return g, "", fmt.Errorf("qemu-img create: %v: %s", err, out)
	}
	g.Marker = DefaultMarker
	g.Cmdline = "console=ttyS0 quiet panic=0 rdinit=/init"
	if g.CanSSHD {
		g.Cmdline += " " + KnobSSHD
	}
	for _, f := range []struct {
		path string
		sum  *string
	}{{g.Kernel, &g.KernelSHA256}, {g.Initrd, &g.InitrdSHA256}, {g.Disk, &g.DiskSHA256}} {
		if *f.sum, err = FileSHA256(f.path); err != nil {
			return g, "", err
		}
	}
	return g, "", nil
}

// FileSHA256 is the lowercase hex SHA-256 of a file.
func FileSHA256(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// isStatic reports whether an ELF executable has no program interpreter.
func isStatic(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return false
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

type kernel struct {
	vmlinuz, version string
	modules          map[string]string // base name → path
}

// wantModules are copied into the initramfs; evdev and button are required.
var wantModules = map[string]string{
	"evdev.ko":                 "drivers/input/evdev.ko",
	"button.ko":                "drivers/acpi/button.ko",
	"pvpanic.ko":               "drivers/misc/pvpanic/pvpanic.ko",
	"pvpanic-pci.ko":           "drivers/misc/pvpanic/pvpanic-pci.ko",
	"virtio_ring.ko":           "drivers/virtio/virtio_ring.ko",
	"virtio.ko":                "drivers/virtio/virtio.ko",
	"virtio_pci_modern_dev.ko": "drivers/virtio/virtio_pci_modern_dev.ko",
	"virtio_pci_legacy_dev.ko": "drivers/virtio/virtio_pci_legacy_dev.ko",
	"virtio_pci.ko":            "drivers/virtio/virtio_pci.ko",
	"failover.ko":              "net/core/failover.ko",
	"net_failover.ko":          "drivers/net/net_failover.ko",
	"virtio_net.ko":            "drivers/net/virtio_net.ko",
}

// netModules load, in this order, for KnobListen.
var netModules = []string{"virtio_ring.ko", "virtio.ko", "virtio_pci_modern_dev.ko", "virtio_pci_legacy_dev.ko",
	"virtio_pci.ko", "failover.ko", "net_failover.ko", "virtio_net.ko"}

// findKernel returns the first readable kernel with its modules.
func findKernel() (kernel, string) {
	dirs := kernelDirs
	if d := os.Getenv(EnvKernelDir); d != "" {
		dirs = append([]string{d}, dirs...)
	}
	var tried []string
	for _, d := range dirs {
		vms, _ := filepath.Glob(filepath.Join(d, "boot", "vmlinuz-*"))
		sort.Sort(sort.Reverse(sort.StringSlice(vms)))
		for _, vm := range vms {
			ver := strings.TrimPrefix(filepath.Base(vm), "vmlinuz-")
			tried = append(tried, vm)
			f, err := os.Open(vm)
			if err != nil {
				continue // /boot/vmlinuz-* is often root-only
			}
			_ = f.Close()
			k := kernel{vmlinuz: vm, version: ver, modules: map[string]string{}}
			for name, rel := range wantModules {
				p := filepath.Join(d, "lib", "modules", ver, "kernel", rel)
				if _, err := os.Stat(p); err == nil {
					k.modules[name] = p
				}
			}
			if k.modules["evdev.ko"] != "" && k.modules["button.ko"] != "" {
				return k, ""
			}
		}
	}
	return kernel{}, fmt.Sprintf("no readable kernel with uncompressed evdev.ko and button.ko modules (set %s; tried %s)",
		EnvKernelDir, strings.Join(append(dirs, tried...), ", "))
}

// applets get a symlink to busybox in /bin.
var applets = []string{"sh", "mount", "insmod", "cat", "head", "sleep", "poweroff", "reboot", "echo",
	"ifconfig", "route", "httpd", "mkdir", "grep", "sed", "tr", "chmod", "chown", "printf", "id", "stty", "tty",
	"ls", "false"}

// initramfs is the gzip'd newc archive: /init, /bin/busybox and its applet
// links, /lib/modules/*.ko, /dev/console, and the extra files with their
// directories.
func initramfs(busybox []byte, modules map[string]string, extra []cpioFile) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	c := newCPIOWriter(zw)
	for _, d := range []string{"bin", "dev", "proc", "sys", "lib", "lib/modules", "run", "tmp"} {
		c.Dir(d, 0o755)
	}
	c.CharDev("dev/console", 0o600, 5, 1)
	c.File("bin/busybox", 0o755, busybox)
	for _, a := range applets {
		c.Symlink("bin/"+a, "busybox")
	}
	names := make([]string, 0, len(modules))
	for n := range modules {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(modules[n])
		if err != nil {
			return nil, err
		}
		c.File("lib/modules/"+n, 0o644, b)
	}
	made := map[string]bool{"bin": true, "dev": true, "proc": true, "sys": true, "lib": true, "lib/modules": true,
		"run": true, "tmp": true}
	for _, f := range extra {
		var parents []string
		for d := path.Dir(f.name); d != "." && !made[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			c.Dir(parents[i], 0o755)
			made[parents[i]] = true
		}
		c.File(f.name, f.perm, f.data)
	}
	c.File("init", 0o755, []byte(initScript()))
	c.File("bin/dhcp-script", 0o755, []byte(dhcpScript))
	if err := c.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// initScript is the guest's PID 1.
func initScript() string {
	return `#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
` + sshdFunc() + `marker=` + DefaultMarker + `
crash=0
nobutton=0
listen=
listendelay=0
sshd=0
dhcp=0
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	` + KnobMarker + `=*) marker="${arg#` + KnobMarker + `=}" ;;
	` + KnobListen + `=*) listen="${arg#` + KnobListen + `=}" ;;
	` + KnobListenDelay + `=*) listendelay="${arg#` + KnobListenDelay + `=}" ;;
	` + KnobCrash + `) crash=1 ;;
	` + KnobNoButton + `) nobutton=1 ;;
	` + KnobSSHD + `) sshd=1 ;;
	` + KnobDHCP + `) dhcp=1 ;;
	esac
done
insmod /lib/modules/evdev.ko
ev=
if [ "$nobutton" != 1 ]; then
	insmod /lib/modules/button.ko
	i=0
	while [ -z "$ev" ] && [ "$i" -lt 200 ]; do
		for d in /sys/class/input/event*; do
			[ "$(cat "$d/device/name" 2>/dev/null)" = "Power Button" ] && ev="${d##*/}"
		done
		[ -n "$ev" ] || { sleep 0.05; i=$((i+1)); }
	done
	if [ -z "$ev" ]; then
		echo "drover-guest: no Power Button input device; not announcing readiness" > /dev/ttyS0
		while :; do sleep 3600; done
	fi
	# Listen before announcing readiness: evdev queues events only for
	# readers that hold the device open, so a press right after the marker
	# waits in fd 3 instead of being dropped while head is still starting.
	exec 3< "/dev/input/$ev"
fi
[ "$sshd" = 1 ] && start_sshd
echo "$marker" > /dev/ttyS0
if [ "$crash" = 1 ]; then
	insmod /lib/modules/pvpanic.ko
	insmod /lib/modules/pvpanic-pci.ko
	echo c > /proc/sysrq-trigger
fi
if [ -n "$listen" ]; then
	for m in ` + strings.Join(netModules, " ") + `; do insmod /lib/modules/$m; done
	i=0
	while ! ifconfig eth0 10.0.2.15 netmask 255.255.255.0 up 2>/dev/null && [ "$i" -lt 100 ]; do
		sleep 0.05; i=$((i+1))
	done
	route add default gw 10.0.2.2
	sleep "$listendelay"
	mkdir -p /www
	echo ok > /www/index.html
	echo ` + ListeningMarker + ` > /dev/ttyS0
	httpd -p "$listen" -h /www 3<&-
fi
if [ -n "$ev" ]; then
	head -c 1 <&3 > /dev/null
	echo ` + PoweroffMarker + ` > /dev/ttyS0
	poweroff -f
fi
while :; do sleep 3600; done
`
}
