package qemu

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pattern"
)

// ErrInvalidSpec is wrapped by every spec validation failure (inside a
// *runtime.Error whose reason says which step the spec cannot pass).
var ErrInvalidSpec = errors.New("invalid spec")

var (
	bdfRE       = regexp.MustCompile(`^([0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	macRE       = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)
	ifnameRE    = pattern.Must(`^[A-Za-z0-9_.-]{1,15}$`, `^[A-Za-z0-9_.-]*$`, 1, 15)
	secretRE    = pattern.Must(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`, `^[A-Za-z0-9][A-Za-z0-9_.-]*$`, 1, 128)
	knownAccels = []string{"kvm", "nvmm", "hvf", "tcg", "whpx"}
)

const (
	maxSunPath = 107 // sizeof(sockaddr_un.sun_path) - 1 on Linux
	serialSock = "serial.sock"
	qmpSock    = "qmp.sock"
)

// invalid returns a validation error with reason.
func invalid(reason api.ReasonCode, id, format string, args ...any) *runtime.Error {
	return &runtime.Error{Reason: reason, Op: "create", ID: id,
		Err: fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))}
}

// validate checks spec against the runtime's options. It does no I/O.
func (r *Runtime) validate(spec runtime.Spec) error {
	id := spec.ID
	if spec.VMOrZero().MicroVM {
		return r.validateMicroVM(spec)
	}
	if !runtime.ValidID(id) {
		return invalid(api.ReasonVMStartFailed, id, "id %q: want 1-63 of [a-z0-9_-], starting with a letter or digit", id)
	}
	if err := unsupported(spec); err != nil {
		return err
	}
	res, vm := spec.Resources, spec.VMOrZero()
	if res.VCPUs < 1 || res.VCPUs > 1024 {
		return invalid(api.ReasonVMStartFailed, id, "vcpus %d: want 1-1024", res.VCPUs)
	}
	if res.MemoryMiB < 16 || res.MemoryMiB > 16<<20 {
		return invalid(api.ReasonVMStartFailed, id, "memory_mib %d: want 16-16777216", res.MemoryMiB)
	}
	if res.DiskGiB < 0 {
		return invalid(api.ReasonRootfsBuildFailed, id, "disk_gib %d is negative", res.DiskGiB)
	}
	hasImage := spec.Image.URL != "" || spec.Image.SHA256 != ""
	switch {
	case hasImage && vm.BootDevice != "":
		return invalid(api.ReasonRootfsBuildFailed, id, "image and boot_device are exclusive")
	case !hasImage && vm.BootDevice == "":
		return invalid(api.ReasonRootfsBuildFailed, id, "one of image or boot_device is required")
	case hasImage && (spec.Image.URL == "" || spec.Image.SHA256 == ""):
		return invalid(api.ReasonImagePullFailed, id, "image needs both url and sha256")
	case vm.BootDevice != "":
		if err := r.checkDevice(vm.BootDevice); err != nil {
			return invalid(api.ReasonVolumeAttachFailed, id, "boot_device: %v", err)
		}
		if res.DiskGiB != 0 {
			return invalid(api.ReasonRootfsBuildFailed, id, "disk_gib needs an image (a boot device is not resized)")
		}
	}
	if b := vm.Boot; b != nil {
		if b.Kernel.URL == "" || b.Kernel.SHA256 == "" {
			return invalid(api.ReasonImagePullFailed, id, "boot.kernel needs both url and sha256")
		}
		if b.Initrd != nil && (b.Initrd.URL == "" || b.Initrd.SHA256 == "") {
			return invalid(api.ReasonImagePullFailed, id, "boot.initrd needs both url and sha256")
		}
	}
	if vm.Accel != "" && vm.Accel != r.opts.Accel && vm.Accel != "tcg" {
		return invalid(api.ReasonVMStartFailed, id, "accel %q: this host runs %q (or tcg)", vm.Accel, r.opts.Accel)
	}
	if vm.Network.Mode == api.NetworkBridge {
		return invalid(api.ReasonNetworkSetupFailed, id, "network.mode bridge is for microVMs (a VM names its bridge with mode tap)")
	}
	if err := validateNetwork(vm.Network, spec.Ports); err != nil {
		return invalid(api.ReasonNetworkSetupFailed, id, "%v", err)
	}
	for i, bdf := range spec.Devices.PCI {
		if !bdfRE.MatchString(bdf) {
			return invalid(api.ReasonVMStartFailed, id, "pci_devices[%d] %q: want a PCI address like 0000:3b:00.0", i, bdf)
		}
	}
	if vm.CloudInit != nil && vm.SeedISO != "" {
		return invalid(api.ReasonRootfsBuildFailed, id, "cloud_init and seed_iso are exclusive")
	}
	if vm.SeedISO != "" && !filepath.IsAbs(vm.SeedISO) {
		return invalid(api.ReasonRootfsBuildFailed, id, "seed_iso %q is not absolute", vm.SeedISO)
	}
	if len(spec.Secrets) > 0 && vm.CloudInit == nil {
		return invalid(api.ReasonSecretsInjectionFailed, id, "secrets need cloud_init (they travel in its seed)")
	}
	for name := range spec.Secrets {
		if !secretRE.MatchString(name) {
			return invalid(api.ReasonSecretsInjectionFailed, id, "secret name %q: want 1-128 of [A-Za-z0-9_.-]", name)
		}
	}
	if m := spec.Readiness.SerialMarker; strings.ContainsAny(m, "\r\n") {
		return invalid(api.ReasonVMStartFailed, id, "readiness.serial_marker must be one line")
	}
	if p := spec.Readiness.TCPPort; p != 0 {
		if vm.Network.Mode == api.NetworkTap {
			return invalid(api.ReasonVMStartFailed, id, "readiness.tcp_port needs user networking (the guest's tap address is unknown)")
		}
		if _, ok := forwardFor(spec, p); !ok {
			return invalid(api.ReasonVMStartFailed, id, "readiness.tcp_port %d has no forward for that guest port", p)
		}
	}
	if n := len(filepath.Join(r.instDir, id, serialSock)); n > maxSunPath {
		return invalid(api.ReasonVMStartFailed, id, "socket path %s is %d bytes, over the unix socket limit %d (use a shorter root)",
			filepath.Join(r.instDir, id, serialSock), n, maxSunPath)
	}
	return nil
}

// unsupported refuses what a Spec may carry but a QEMU VM cannot run,
// naming the field.
func unsupported(spec runtime.Spec) error {
	id := spec.ID
	switch k := spec.Image.Kind; k {
	case runtime.ImageDisk:
		if spec.Image.Ref != "" || spec.Image.Digest != "" {
			return invalid(api.ReasonImagePullFailed, id, "spec.image.ref: a disk image has a url and sha256, not an OCI reference")
		}
	case runtime.ImageOCI:
		return invalid(api.ReasonImagePullFailed, id, "spec.image.kind: oci images need a container or microVM runtime")
	default:
		return invalid(api.ReasonImagePullFailed, id, "spec.image.kind %q: want a disk image (\"\") or \"oci\"", k)
	}
	switch {
	case len(spec.Command) > 0 || len(spec.Args) > 0:
		return invalid(api.ReasonVMStartFailed, id, "spec.command: a VM boots its image's own init (vm.boot.cmdline sets a direct-boot kernel's)")
	case len(spec.Env) > 0:
		return invalid(api.ReasonVMStartFailed, id, "spec.env: a VM has no environment to set (use cloud-init)")
	case len(spec.Volumes) > 0:
		return invalid(api.ReasonVolumeAttachFailed, id, "spec.volumes: the qemu runtime attaches no volumes (a boot device only: vm.boot_device)")
	case len(spec.Devices.GPUs) > 0:
		return invalid(api.ReasonVMStartFailed, id, "spec.devices.gpus: the qemu runtime passes GPUs through by PCI address (devices.pci)")
	}
	return nil
}

func validateNetwork(n runtime.VMNetwork, ports []api.PortForward) error {
	if n.MAC != "" && !macRE.MatchString(n.MAC) {
		return fmt.Errorf("network.mac %q: want xx:xx:xx:xx:xx:xx", n.MAC)
	}
	switch n.Mode {
	case "", api.NetworkUser, api.NetworkBridge:
		if n.Bridge != "" {
			return errors.New("network.bridge needs tap mode")
		}
		seen := map[string]bool{}
		hostPorts := map[int]bool{}
		for i, f := range ports {
			if f.GuestPort < 1 || f.GuestPort > 65535 || f.HostPort < 0 || f.HostPort > 65535 {
				return fmt.Errorf("ports[%d]: ports out of range", i)
			}
			name := forwardName(f)
			if seen[name] {
				return fmt.Errorf("ports[%d]: duplicate name %q", i, name)
			}
			seen[name] = true
			if f.HostPort != 0 {
				if hostPorts[f.HostPort] {
					return fmt.Errorf("ports[%d]: host port %d used twice", i, f.HostPort)
				}
				hostPorts[f.HostPort] = true
			}
		}
	case api.NetworkTap:
		if !ifnameRE.MatchString(n.Bridge) {
			return fmt.Errorf("network.bridge %q: tap mode needs a bridge interface name", n.Bridge)
		}
		if len(ports) > 0 {
			return errors.New("ports need user networking (forwards)")
		}
	default:
		return fmt.Errorf("network.mode %q: want user, tap or bridge", n.Mode)
	}
	return nil
}

// forwardFor returns the forward of a guest port.
func forwardFor(spec runtime.Spec, guestPort int) (api.PortForward, bool) {
	for _, f := range spec.Ports {
		if f.GuestPort == guestPort {
			return f, true
		}
	}
	return api.PortForward{}, false
}

// checkDevice reports whether dev lies under one of the allowed device
// prefixes: an existing directory (/dev/disk/by-id) allows what is inside
// it, any other prefix (/dev/nvme) the names in its directory that start
// with it. The check is lexical: /dev/disk/by-id entries are symlinks by
// design.
func (r *Runtime) checkDevice(dev string) error {
	if !filepath.IsAbs(dev) {
		return fmt.Errorf("%q is not absolute", dev)
	}
	clean := filepath.Clean(dev)
	for _, p := range r.opts.DeviceDirs {
		p = filepath.Clean(p)
		if clean == p || !strings.HasPrefix(clean, p) {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			if clean[len(p)] == '/' {
				return nil
			}
			continue
		}
		if filepath.Dir(clean) == filepath.Dir(p) {
			return nil
		}
	}
	return fmt.Errorf("%q is not under %s", dev, strings.Join(r.opts.DeviceDirs, ", "))
}

// specJSON is the persisted form of a spec (secrets are never encoded).
func specJSON(spec runtime.Spec) ([]byte, error) {
	return json.MarshalIndent(spec, "", "  ")
}

// sameSpec compares specs by their persisted form.
func sameSpec(a, b runtime.Spec) bool {
	ja, errA := specJSON(a)
	jb, errB := specJSON(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// secretsDigest identifies a set of secrets (names and values) without
// storing them: an HMAC-SHA256 under key (Runtime.digestKey, random and in
// memory only, so a digest is of no use to someone who reads it, and none
// is ever persisted: a low-entropy value could be guessed from a plain
// hash); "" for none.
func secretsDigest(key []byte, s map[string][]byte) string {
	if len(s) == 0 {
		return ""
	}
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	h := hmac.New(sha256.New, key)
	for _, n := range names {
		fmt.Fprintf(h, "%d:%s%d:", len(n), n, len(s[n]))
		h.Write(s[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// secretNames are the sorted names of s; nil for none.
func secretNames(s map[string][]byte) []string {
	var names []string
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
