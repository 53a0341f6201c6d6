package slicevm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/slice"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

const (
	nvmeCtrlAddr = "0000:19:00.0" // the slot NVMe's controller, bound to nvme
	pfAddr       = "0000:1a:00.0" // the ConnectX-7 PF, bound to mlx5_core
)

func fieldNames(fe []api.FieldError) []string {
	var out []string
	for _, f := range fe {
		out = append(out, f.Field)
	}
	return out
}

// bindHost is sliceHost with the sysfs bind interface in place for the
// NVMe controller and the fabric PF, so that binding either of them to
// vfio-pci would visibly write driver_override, unbind and drivers_probe.
func bindHost() hostinfotest.Host {
	h := sliceHost()
	for k, v := range bindFiles() {
		h.Files[k] = v
	}
	return h
}

func bindFiles() map[string]string {
	return map[string]string{
		"sys/devices/pci0000:19/" + nvmeCtrlAddr + "/driver_override": "",
		"sys/devices/pci0000:1a/" + pfAddr + "/driver_override":       "",
		"sys/bus/pci/drivers/nvme/unbind":                             "",
		"sys/bus/pci/drivers/mlx5_core/unbind":                        "",
		"sys/bus/pci/drivers_probe":                                   "",
	}
}

// assertUntouched checks that no bind file was written, no host device
// changed driver, nothing was leased and no VM was created.
func assertUntouched(t *testing.T, e *env, vm string) {
	t.Helper()
	for path := range bindFiles() {
		if b, err := os.ReadFile(filepath.Join(e.roots.Base, path)); err != nil || len(b) != 0 {
			t.Errorf("%s = %q, %v; want it unwritten", path, b, err)
		}
	}
	for addr, want := range map[string]string{nvmeCtrlAddr: "nvme", pfAddr: "mlx5_core", gpuAddr: vfioDriver} {
		if drv, err := e.p.driverOf(addr); err != nil || drv != want {
			t.Errorf("driver of %s = %q, %v; want %q", addr, drv, err, want)
		}
	}
	if got := e.rt.CallCount("create", vm) + e.rt.CallCount("stop", vm) + e.rt.CallCount("destroy", vm); got != 0 {
		t.Errorf("runtime calls for %s = %d", vm, got)
	}
	if ents, err := os.ReadDir(e.p.leaseDir()); err == nil && len(ents) != 0 {
		t.Errorf("leases left: %v", ents)
	}
}

// TestProvisionRefusesForeignDevices: a well-formed provision naming a
// device that is not, in its role, a device of a slot of this host's
// topology is refused before anything is touched.
func TestProvisionRefusesForeignDevices(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*testing.T, *env, *task.VMSlot) string // returns a file that must stay as it is
		field  string
		msg    string
	}{
		{"pci_address of the host's NVMe controller", func(_ *testing.T, _ *env, s *task.VMSlot) string {
			s.PCIAddress = nvmeCtrlAddr
			return ""
		}, "params.slots[0].pci_address", "0000:19:00.0 is not a device of an approved slot on this host"},
		{"pci_address of a PCI address not on the host", func(_ *testing.T, _ *env, s *task.VMSlot) string {
			s.PCIAddress = "0000:3b:00.0"
			return ""
		}, "params.slots[0].pci_address", "0000:3b:00.0 is not a device of an approved slot on this host"},
		{"pci_address of the slot's fabric VF", func(_ *testing.T, _ *env, s *task.VMSlot) string {
			s.PCIAddress, s.FabricDevice = vfAddr, ""
			return ""
		}, "params.slots[0].pci_address", "not the GPU of any slot"},
		{"fabric_device of the fabric PF", func(_ *testing.T, _ *env, s *task.VMSlot) string {
			s.FabricDevice = pfAddr
			return ""
		}, "params.slots[0].fabric_device", "0000:1a:00.0 is not a device of an approved slot on this host"},
		{"nvme_device an arbitrary file under /dev", func(t *testing.T, e *env, s *task.VMSlot) string {
			s.NVMeDevice = filepath.Join(e.roots.Dev, "xyz")
			writeFile(t, s.NVMeDevice, bytes.Repeat([]byte{0xcd}, 4096))
			return s.NVMeDevice
		}, "params.slots[0].nvme_device", "xyz is not a device of an approved slot on this host"},
		{"nvme_device a symlink under /dev to a file elsewhere", func(t *testing.T, e *env, s *task.VMSlot) string {
			target := filepath.Join(e.roots.Root, "secret")
			writeFile(t, target, []byte("keep me"))
			s.NVMeDevice = filepath.Join(e.roots.Dev, "disk", "by-id", "nvme-evil")
			if err := os.Symlink(target, s.NVMeDevice); err != nil {
				t.Fatal(err)
			}
			return target
		}, "params.slots[0].nvme_device", "secret is not the NVMe namespace of any slot"},
		{"nvme_device the mounted OS disk", func(_ *testing.T, e *env, s *task.VMSlot) string {
			s.NVMeDevice = filepath.Join(e.roots.Dev, "nvme8n1")
			return ""
		}, "params.slots[0].nvme_device", "nvme8n1 is in use: mounted at /"},
		{"nvme_device not clean", func(_ *testing.T, e *env, s *task.VMSlot) string {
			s.NVMeDevice = e.roots.Dev + "//nvme0n1"
			return ""
		}, "params.slots[0].nvme_device", "is not a clean absolute path"},
		{"nvme_device missing", func(_ *testing.T, e *env, s *task.VMSlot) string {
			s.NVMeDevice = filepath.Join(e.roots.Dev, "nvme7n1")
			return ""
		}, "params.slots[0].nvme_device", "cannot resolve it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{host: bindHost()})
			params := e.slotParams()
			keep := tc.mutate(t, e, &params.Slots[0])
			var before []byte
			if keep != "" {
				before, _ = os.ReadFile(keep)
			}
			nvmeBefore, _ := os.ReadFile(e.nvmeFile)
			out, _, err := e.p.Provision(context.Background(), params, nil)
			fe := asError(t, err)
			if fe.Code != CodeDeviceNotAllowed || fe.Phase != PhaseDeviceCheck || !errors.Is(err, ErrDeviceNotAllowed) ||
				!reflect.DeepEqual(fieldNames(fe.Fields), []string{tc.field}) || !strings.Contains(fe.Message, tc.field+": ") ||
				!strings.Contains(fe.Fields[0].Message, tc.msg) || out.FailedPhase != PhaseDeviceCheck {
				t.Fatalf("err = %+v", fe)
			}
			if len(out.Phases) != 0 || len(out.Cleanup) != 0 {
				t.Errorf("phases ran: %+v, cleanup %+v", out.Phases, out.Cleanup)
			}
			if keep != "" {
				if after, err := os.ReadFile(keep); err != nil || !bytes.Equal(after, before) {
					t.Errorf("%s changed: %d bytes, %v", keep, len(after), err)
				}
			}
			if after, _ := os.ReadFile(e.nvmeFile); !bytes.Equal(after, nvmeBefore) {
				t.Error("the slot's NVMe changed")
			}
			assertUntouched(t, e, "vm-1")
			if exists(filepath.Join(e.ciDir, "vm-1")) || exists(e.p.telemetryPath("vm-1")) {
				t.Error("a refused provision made files")
			}
		})
	}
}

// TestReleaseRefusesForeignDevices: a release that would rebind or wipe a
// device outside the rule (named in params, in a lease written before the
// rule, or leased to another VM) is refused before the VM is stopped, and
// nothing is unbound or zeroed.
func TestReleaseRefusesForeignDevices(t *testing.T) {
	tests := []struct {
		name  string
		setup func(*testing.T, *env) (task.VMReleaseParams, string)
		code  string
		field string
		msg   string
	}{
		{"wipe an arbitrary file under /dev", func(t *testing.T, e *env) (task.VMReleaseParams, string) {
			dev := filepath.Join(e.roots.Dev, "xyz")
			writeFile(t, dev, bytes.Repeat([]byte{0xcd}, 4096))
			return task.VMReleaseParams{VMName: "vm-1", Wipe: true, Slots: []task.VMReleaseSlot{{SlotID: "slot-0", NVMeDevice: dev}}}, dev
		}, CodeDeviceNotAllowed, "params.slots[0].nvme_device", "xyz is not a device of an approved slot on this host"},
		{"rebind the host's NVMe controller", func(*testing.T, *env) (task.VMReleaseParams, string) {
			return task.VMReleaseParams{VMName: "vm-1", Slots: []task.VMReleaseSlot{{SlotID: "slot-0", PCIAddress: nvmeCtrlAddr}}}, ""
		}, CodeDeviceNotAllowed, "params.slots[0].pci_address", "0000:19:00.0 is not a device of an approved slot on this host"},
		{"rebind the fabric PF", func(*testing.T, *env) (task.VMReleaseParams, string) {
			return task.VMReleaseParams{VMName: "vm-1", Slots: []task.VMReleaseSlot{{SlotID: "slot-0", FabricDevice: pfAddr}}}, ""
		}, CodeDeviceNotAllowed, "params.slots[0].fabric_device", "not the fabric VF of any slot"},
		{"a lease naming a foreign device", func(t *testing.T, e *env) (task.VMReleaseParams, string) {
			if _, err := e.p.acquireLease("vm-1", "alloc-1", task.VMSlot{SlotID: "slot-0", PCIAddress: nvmeCtrlAddr}); err != nil {
				t.Fatal(err)
			}
			return task.VMReleaseParams{VMName: "vm-1"}, ""
		}, CodeDeviceNotAllowed, "leases[slot-0].pci_address", "0000:19:00.0 is not a device of an approved slot on this host"},
		{"wipe the NVMe another VM leases", func(t *testing.T, e *env) (task.VMReleaseParams, string) {
			if _, err := e.p.acquireLease("vm-a", "alloc-a", task.VMSlot{SlotID: "slot-0", PCIAddress: gpuAddr, NVMeDevice: e.nvme}); err != nil {
				t.Fatal(err)
			}
			return task.VMReleaseParams{VMName: "vm-1", Wipe: true,
				Slots: []task.VMReleaseSlot{{SlotID: "slot-x", NVMeDevice: filepath.Join(e.roots.Dev, "nvme0n1")}}}, e.nvmeFile
		}, CodeLeaseConflict, "params.slots[0].nvme_device", "nvme0n1 is leased to vm vm-a (slot slot-0, allocation alloc-a)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{host: bindHost()})
			params, keep := tc.setup(t, e)
			var before []byte
			if keep != "" {
				before, _ = os.ReadFile(keep)
			}
			out, _, err := e.p.Release(context.Background(), params, nil)
			fe := asError(t, err)
			if fe.Code != tc.code || fe.Phase != PhaseDeviceCheck || !reflect.DeepEqual(fieldNames(fe.Fields), []string{tc.field}) ||
				!strings.Contains(fe.Fields[0].Message, tc.msg) || out.FailedPhase != PhaseDeviceCheck || len(out.Wiped) != 0 {
				t.Fatalf("err = %+v, out %+v", fe, out)
			}
			if keep != "" {
				if after, err := os.ReadFile(keep); err != nil || !bytes.Equal(after, before) {
					t.Errorf("%s was changed (%d bytes, %v)", keep, len(after), err)
				}
			}
			for path := range bindFiles() {
				if b, err := os.ReadFile(filepath.Join(e.roots.Base, path)); err != nil || len(b) != 0 {
					t.Errorf("%s = %q, %v; want it unwritten", path, b, err)
				}
			}
			if e.rt.CallCount("stop", "vm-1")+e.rt.CallCount("destroy", "vm-1") != 0 {
				t.Error("a refused release stopped the VM")
			}
		})
	}
}

// TestReleaseRefusesVanishedGPU: when a leased GPU is no longer on the
// host, the release is refused before it stops the VM, and the lease
// stays.
func TestReleaseRefusesVanishedGPU(t *testing.T) {
	e := newEnv(t, envOpts{})
	if _, _, err := e.p.Provision(context.Background(), e.failureParams(), nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.p.pciDev(gpuAddr)); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.p.Release(context.Background(), task.VMReleaseParams{VMName: "vm-1"}, nil)
	fe := asError(t, err)
	if fe.Code != CodeDeviceNotAllowed || !reflect.DeepEqual(fieldNames(fe.Fields),
		[]string{"leases[slot-0].pci_address", "leases[slot-0].fabric_device"}) {
		t.Fatalf("err = %+v", fe)
	}
	if st, err := e.rt.Inspect(context.Background(), "vm-1"); err != nil || st.State != runtime.StateRunning {
		t.Errorf("vm-1 = %+v, %v", st, err)
	}
	if l, err := e.p.readLease("slot-0"); err != nil || l.VMName != "vm-1" {
		t.Errorf("lease = %+v, %v", l, err)
	}
}

// TestCheckDevicesAllows: the slot's devices pass in every spelling that
// resolves to them: the by-id link and the /dev path of the namespace.
func TestCheckDevicesAllows(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, nvme := range []string{e.nvme, e.nvmeFile} {
		refs := provisionRefs([]task.VMSlot{{SlotID: "slot-0", PCIAddress: gpuAddr, FabricDevice: vfAddr, NVMeDevice: nvme}})
		if len(refs) != 3 {
			t.Fatalf("refs = %+v", refs)
		}
		if err := e.p.checkDevices(context.Background(), refs); err != nil {
			t.Errorf("%s: %v", nvme, err)
		}
	}
	if err := e.p.checkDevices(context.Background(), nil); err != nil {
		t.Errorf("no devices: %v", err)
	}
}

// TestDeviceCheckNeedsTopology: when the host cannot be discovered, no
// device is accepted.
func TestDeviceCheckNeedsTopology(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.p.opts.Topology = func(context.Context) (slice.Topology, error) { return slice.Topology{}, errors.New("sysfs unreadable") }
	_, _, err := e.p.Provision(context.Background(), e.slotParams(), nil)
	if fe := asError(t, err); fe.Code != CodeTopologyFailed || fe.Phase != PhaseDeviceCheck || !strings.Contains(fe.Message, "sysfs unreadable") {
		t.Fatalf("err = %+v", fe)
	}
	if exists(e.p.leaseDir()) {
		t.Error("a provision with no topology took leases")
	}
}

// TestCheckDeviceOutsideDeviceDirs: a device that resolves outside the
// device directories is refused even where the topology would allow it.
func TestCheckDeviceOutsideDeviceDirs(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.p.opts.DeviceDirs = []string{filepath.Join(e.roots.Dev, "disk", "by-id")}
	_, err := e.p.checkDevice(e.nvme)
	if fe := asError(t, err); fe.Code != CodeRuntimeInvalid || !strings.HasPrefix(fe.Blocker, "nvme_not_allowed:") {
		t.Fatalf("err = %+v", fe)
	}
}
