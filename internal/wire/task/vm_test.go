package task

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	testSSHKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOuQ4ruXNBrGJtrDdhNLziqmo76C7m8/YwZ8DYataZU8 op@example"
	testSHA    = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

// provisionJSON renders a valid slice.vm_provision params object with the
// given fields replaced (nil deletes a field).
func provisionJSON(t *testing.T, over map[string]any) string {
	t.Helper()
	m := map[string]any{
		"allocation_id": "alloc-1",
		"vm_name":       "vm-1",
		"image_path":    "/var/lib/drover/images/ubuntu.qcow2",
		"image_sha256":  testSHA,
		"slots": []map[string]any{{
			"slot_id": "slot-0", "slot_index": 0, "pci_address": "0000:18:00.0",
			"fabric_device": "0000:1a:00.2", "nvme_device": "/dev/disk/by-id/nvme-a",
			"mac_address": "02:aa:00:00:00:01", "private_ip": "10.77.0.10",
		}},
	}
	for k, v := range over {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func slot(over map[string]any) map[string]any {
	s := map[string]any{"slot_id": "slot-0", "slot_index": 0, "pci_address": "0000:18:00.0"}
	for k, v := range over {
		s[k] = v
	}
	return s
}

func TestDecodeVMProvisionParams(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	type fe = api.FieldError
	tests := []struct {
		name string
		over map[string]any
		raw  string // used instead of over when set
		want []fe
	}{
		{name: "valid with slot", over: nil},
		{name: "valid slot-less with url", over: map[string]any{"slots": nil, "image_path": nil,
			"image_url": "https://images.example/u.qcow2", "vcpus": 4, "memory_mib": 4096,
			"boot": map[string]any{"kernel": map[string]any{"url": "file:///var/lib/drover/images/vmlinuz", "sha256": testSHA},
				"cmdline": "console=ttyS0"},
			"network": map[string]any{"mode": "user", "forwards": []any{map[string]any{"name": "ssh", "guest_port": 22}}},
			"accel":   "tcg", "ssh_public_keys": []string{testSSHKey}, "driver_strategy": "none",
			"default_username": "ops", "graceful_timeout_seconds": 30, "readiness_timeout_seconds": 60}},
		{name: "tap network", over: map[string]any{"network": map[string]any{"mode": "tap", "bridge": "br-slice", "mac": "02:00:00:00:00:09"}}},
		{name: "missing everything", raw: `{}`, want: []fe{
			{Field: "params.allocation_id", Message: "is required"},
			{Field: "params.vm_name", Message: "is required"},
			{Field: "params.image_path", Message: "one of image_path or image_url is required"},
			{Field: "params.image_sha256", Message: "is required"}}},
		{name: "bad names", over: map[string]any{"vm_name": "VM 1", "allocation_id": "-x"}, want: []fe{
			{Field: "params.allocation_id", Message: "must be 1-128 characters of A-Z a-z 0-9 . _ : -, starting with a letter or digit"},
			{Field: "params.vm_name", Message: "must be 1-63 characters of a-z 0-9 _ -, starting with a letter or digit"}}},
		{name: "both image sources", over: map[string]any{"image_url": "https://x/y"},
			want: []fe{{Field: "params.image_url", Message: "give image_path or image_url, not both"}}},
		{name: "relative image path", over: map[string]any{"image_path": "images/u.qcow2"},
			want: []fe{{Field: "params.image_path", Message: `must be an absolute path (e.g. "/var/lib/x" or "C:\data\x")`}}},
		{name: "image path dotdot", over: map[string]any{"image_path": "/var/lib/drover/../../etc/shadow"},
			want: []fe{{Field: "params.image_path", Message: `must not contain ".." elements`}}},
		{name: "ftp url", over: map[string]any{"image_path": nil, "image_url": "ftp://x/y"},
			want: []fe{{Field: "params.image_url", Message: "must be an http, https or file URL"}}},
		{name: "relative file url", over: map[string]any{"image_path": nil, "image_url": "file://host/x"},
			want: []fe{{Field: "params.image_url", Message: "must be file:///absolute/path"}}},
		{name: "short digest", over: map[string]any{"image_sha256": "abc"},
			want: []fe{{Field: "params.image_sha256", Message: "must be a SHA-256 digest: 64 hex characters"}}},
		{name: "bad strategy user key", over: map[string]any{"driver_strategy": "apt", "default_username": "root",
			"ssh_public_keys": []string{testSSHKey, "ssh-rsa nope", testSSHKey + "\nssh-ed25519 x"}}, want: []fe{
			{Field: "params.driver_strategy", Message: "must be one of cloud-init, preinstalled, none"},
			{Field: "params.default_username", Message: "must not be root"},
			{Field: "params.ssh_public_keys[1]", Message: `must be an SSH public key in authorized_keys form, e.g. "ssh-ed25519 AAAA... user@host"`},
			{Field: "params.ssh_public_keys[2]", Message: "must be a single authorized_keys line"}}},
		{name: "bad username", over: map[string]any{"default_username": "Ops"},
			want: []fe{{Field: "params.default_username", Message: "must be a Linux user name: 1-32 characters of a-z 0-9 _ -, starting with a letter or _"}}},
		{name: "bad slot fields", over: map[string]any{"slots": []any{slot(map[string]any{
			"slot_id": "", "slot_index": -1, "pci_address": "18:00.0", "fabric_device": "0000:1A:00.2",
			"nvme_device": "nvme0n1", "numa_node": -2, "vcpu_count": 5000, "memory_mib": 64,
			"mac_address": "01:00:00:00:00:01", "private_ip": "fd00::1"})}}, want: []fe{
			{Field: "params.slots[0].slot_id", Message: "is required"},
			{Field: "params.slots[0].slot_index", Message: "must be >= 0"},
			{Field: "params.slots[0].pci_address", Message: `must be a PCI address in lowercase domain:bus:device.function form, e.g. "0000:3b:00.0"`},
			{Field: "params.slots[0].fabric_device", Message: `must be a PCI address in lowercase domain:bus:device.function form, e.g. "0000:3b:00.0"`},
			{Field: "params.slots[0].nvme_device", Message: `must be an absolute path (e.g. "/var/lib/x" or "C:\data\x")`},
			{Field: "params.slots[0].numa_node", Message: "must be >= -1"},
			{Field: "params.slots[0].vcpu_count", Message: "must be between 1 and 1024"},
			{Field: "params.slots[0].memory_mib", Message: "must be between 128 and 16777216"},
			{Field: "params.slots[0].mac_address", Message: "must be a unicast MAC address"},
			{Field: "params.slots[0].private_ip", Message: `must be an IPv4 address, e.g. "10.77.0.10"`}}},
		{name: "mac without ip", over: map[string]any{"slots": []any{slot(map[string]any{"mac_address": "02:00:00:00:00:01"})}},
			want: []fe{{Field: "params.slots[0].mac_address", Message: "give mac_address and private_ip together (the DHCP reservation)"}}},
		{name: "duplicate slots", over: map[string]any{"slots": []any{
			slot(map[string]any{"nvme_device": "/dev/a"}),
			slot(map[string]any{"pci_address": "0000:18:00.0", "fabric_device": "0000:18:00.0", "nvme_device": "/dev/a"})}}, want: []fe{
			{Field: "params.slots[1].slot_id", Message: "duplicates slots[0].slot_id"},
			{Field: "params.slots[1].slot_index", Message: "duplicates slots[0].slot_index"},
			{Field: "params.slots[1].pci_address", Message: "duplicates slots[0].pci_address"},
			{Field: "params.slots[1].fabric_device", Message: "duplicates slots[0].pci_address"},
			{Field: "params.slots[1].nvme_device", Message: "duplicates slots[0].nvme_device"}}},
		{name: "too many slots", over: map[string]any{"slots": make([]any, MaxVMSlots+1)},
			want: []fe{{Field: "params.slots", Message: "at most 16 slots"}}},
		{name: "sizes with slots, tcg with slots", over: map[string]any{"vcpus": 2, "memory_mib": 1024, "accel": "tcg"}, want: []fe{
			{Field: "params.vcpus", Message: "must be 0 with slots: set slots[].vcpu_count"},
			{Field: "params.memory_mib", Message: "must be 0 with slots: set slots[].memory_mib"},
			{Field: "params.accel", Message: "slots (VFIO passthrough) need kvm"}}},
		{name: "slot-less sizes out of range", over: map[string]any{"slots": nil, "vcpus": -1, "memory_mib": 64, "accel": "xen"}, want: []fe{
			{Field: "params.vcpus", Message: "must be between 1 and 1024"},
			{Field: "params.memory_mib", Message: "must be between 128 and 16777216"},
			{Field: "params.accel", Message: "must be one of kvm, nvmm, hvf, tcg"}}},
		{name: "bridge and timeouts", over: map[string]any{"ovs_bridge": "br slice", "graceful_timeout_seconds": 29,
			"readiness_timeout_seconds": 901, "readiness_marker": "a\nb"}, want: []fe{
			{Field: "params.ovs_bridge", Message: "must be a network interface name: 1-15 characters of A-Z a-z 0-9 . _ -, not starting with -"},
			{Field: "params.graceful_timeout_seconds", Message: "must be between 30 and 900"},
			{Field: "params.readiness_marker", Message: "must be at most 256 printable characters"},
			{Field: "params.readiness_timeout_seconds", Message: "must be between 5 and 900"}}},
		{name: "graceful too long", over: map[string]any{"graceful_timeout_seconds": 901},
			want: []fe{{Field: "params.graceful_timeout_seconds", Message: "must be between 30 and 900"}}},
		{name: "bad boot", over: map[string]any{"boot": map[string]any{"kernel": map[string]any{"url": ""},
			"initrd": map[string]any{"url": "https://x/i", "sha256": "zz"}, "cmdline": "a\x00"}}, want: []fe{
			{Field: "params.boot.kernel.url", Message: "is required"},
			{Field: "params.boot.kernel.sha256", Message: "is required"},
			{Field: "params.boot.initrd.sha256", Message: "must be a SHA-256 digest: 64 hex characters"},
			{Field: "params.boot.cmdline", Message: "must be at most 4096 printable characters"}}},
		{name: "bad network", over: map[string]any{"network": map[string]any{"mode": "user", "bridge": "br0", "mac": "zz",
			"forwards": []any{map[string]any{"name": "ssh", "guest_port": 0, "host_port": 70000}, map[string]any{"name": "ssh", "guest_port": 22}}}}, want: []fe{
			{Field: "params.network.bridge", Message: "only with mode tap"},
			{Field: "params.network.mac", Message: `must be a MAC address, e.g. "02:00:00:00:00:01"`},
			{Field: "params.network.forwards[0].guest_port", Message: "must be between 1 and 65535"},
			{Field: "params.network.forwards[0].host_port", Message: "must be between 0 (any free port) and 65535"},
			{Field: "params.network.forwards[1].name", Message: "duplicate forward name"}}},
		{name: "tap without bridge", over: map[string]any{"network": map[string]any{"mode": "tap",
			"forwards": []any{map[string]any{"name": "ssh", "guest_port": 22}}}}, want: []fe{
			{Field: "params.network.bridge", Message: "is required"},
			{Field: "params.network.forwards", Message: "only with mode user"}}},
		{name: "bad network mode", over: map[string]any{"network": map[string]any{"mode": "macvtap"}},
			want: []fe{{Field: "params.network.mode", Message: "must be user or tap"}}},
		{name: "unknown field", over: map[string]any{"disk": 1}, want: []fe{{Field: "params.disk", Message: "unknown parameter"}}},
		{name: "unknown slot field", over: map[string]any{"slots": []any{slot(map[string]any{"gpu": 1})}},
			want: []fe{{Field: "params.slots[0].gpu", Message: "unknown parameter"}}},
		{name: "slot index not a number", over: map[string]any{"slots": []any{slot(map[string]any{"slot_index": "1"})}},
			want: []fe{{Field: "params.slots[0].slot_index", Message: "must be a JSON number, not string"}}},
		{name: "slots not an array", over: map[string]any{"slots": 5},
			want: []fe{{Field: "params.slots", Message: "must be a JSON array, not number"}}},
		{name: "slot not an object", over: map[string]any{"slots": []any{"slot-0"}},
			want: []fe{{Field: "params.slots[0]", Message: "must be a JSON object"}}},
		{name: "wrong type", over: map[string]any{"image_trusted": "yes"},
			want: []fe{{Field: "params.image_trusted", Message: "must be a JSON boolean, not string"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.raw
			if raw == "" {
				raw = provisionJSON(t, tc.over)
			}
			got, gotFE := DecodeVMProvisionParams(json.RawMessage(raw))
			if !reflect.DeepEqual(gotFE, tc.want) {
				t.Fatalf("field errors:\n got %+v\nwant %+v", gotFE, tc.want)
			}
			if rfe := r.Validate(TypeVMProvision, json.RawMessage(raw)); !reflect.DeepEqual(rfe, tc.want) {
				t.Errorf("Registry.Validate = %+v, want %+v", rfe, tc.want)
			}
			if tc.want == nil && got.VMName == "" {
				t.Errorf("valid params decoded empty: %+v", got)
			}
		})
	}
}

func TestVMProvisionDefaults(t *testing.T) {
	p, fe := DecodeVMProvisionParams(json.RawMessage(strings.Replace(provisionJSON(t, map[string]any{
		"slots": []any{slot(nil), slot(map[string]any{"slot_id": "slot-1", "slot_index": 1, "pci_address": "0000:2a:00.0",
			"vcpu_count": 4, "memory_mib": 8192, "mac_address": "02:AA:00:00:00:02", "private_ip": "10.77.0.11"})}}),
		testSHA, strings.ToUpper(testSHA), 1)))
	if fe != nil {
		t.Fatal(fe)
	}
	if p.DriverStrategy != DriverCloudInit || p.DefaultUsername != "drover" || p.GracefulTimeoutSeconds != 60 ||
		p.ReadinessMarker != "DROVER-READY vm-1" || p.ReadinessTimeoutSeconds != 600 || p.ImageSHA256 != testSHA {
		t.Errorf("defaults = %+v", p)
	}
	if p.Slots[0].VCPUCount != 12 || p.Slots[0].MemoryMiB != 65536 || p.Slots[1].MACAddress != "02:aa:00:00:00:02" {
		t.Errorf("slot defaults = %+v", p.Slots)
	}
	if p.TotalVCPUs() != 16 || p.TotalMemoryMiB() != 65536+8192 || p.VCPUs != 0 || p.Network != nil {
		t.Errorf("totals = %d, %d", p.TotalVCPUs(), p.TotalMemoryMiB())
	}
	bare, fe := DecodeVMProvisionParams(json.RawMessage(provisionJSON(t, map[string]any{"slots": nil})))
	if fe != nil || bare.TotalVCPUs() != DefaultVMVCPUs || bare.TotalMemoryMiB() != DefaultVMMemoryMiB {
		t.Errorf("slot-less = %+v, %v", bare, fe)
	}
}

func TestDecodeVMReleaseParams(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	type fe = api.FieldError
	pciMsg := `must be a PCI address in lowercase domain:bus:device.function form, e.g. "0000:3b:00.0"`
	tests := []struct {
		name string
		raw  string
		want []fe
	}{
		{"minimal", `{"vm_name":"vm-1"}`, nil},
		{"full", `{"vm_name":"vm-1","allocation_id":"a-1","wipe":true,"graceful_timeout_seconds":900,
			"slots":[{"slot_id":"slot-0","pci_address":"0000:18:00.0","fabric_device":"0000:1a:00.2","nvme_device":"/dev/nvme0n1"}]}`, nil},
		{"empty", `{}`, []fe{{Field: "params.vm_name", Message: "is required"}}},
		{"bad everything", `{"vm_name":"a/b","allocation_id":"a b","graceful_timeout_seconds":10,
			"slots":[{"slot_id":"","pci_address":"x","fabric_device":"y","nvme_device":"z"},{"slot_id":"s"},{"slot_id":"s"}]}`, []fe{
			{Field: "params.vm_name", Message: "must be 1-63 characters of a-z 0-9 _ -, starting with a letter or digit"},
			{Field: "params.allocation_id", Message: "must be 1-128 characters of A-Z a-z 0-9 . _ : -, starting with a letter or digit"},
			{Field: "params.slots[0].slot_id", Message: "is required"},
			{Field: "params.slots[0].pci_address", Message: pciMsg},
			{Field: "params.slots[0].fabric_device", Message: pciMsg},
			{Field: "params.slots[0].nvme_device", Message: `must be an absolute path (e.g. "/var/lib/x" or "C:\data\x")`},
			{Field: "params.slots[2].slot_id", Message: "duplicate slot_id"},
			{Field: "params.graceful_timeout_seconds", Message: "must be between 30 and 900"}}},
		{"unknown", `{"vm_name":"v","force":true}`, []fe{{Field: "params.force", Message: "unknown parameter"}}},
		{"wipe not bool", `{"vm_name":"v","wipe":1}`, []fe{{Field: "params.wipe", Message: "must be a JSON boolean, not number"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, gotFE := DecodeVMReleaseParams(json.RawMessage(tc.raw))
			if !reflect.DeepEqual(gotFE, tc.want) {
				t.Fatalf("field errors:\n got %+v\nwant %+v", gotFE, tc.want)
			}
			if rfe := r.Validate(TypeVMRelease, json.RawMessage(tc.raw)); !reflect.DeepEqual(rfe, tc.want) {
				t.Errorf("Registry.Validate = %+v, want %+v", rfe, tc.want)
			}
			if tc.want == nil && got.GracefulTimeoutSeconds == 0 {
				t.Errorf("no default graceful timeout: %+v", got)
			}
		})
	}
	for _, typ := range []string{TypeVMProvision, TypeVMRelease} {
		if s, ok := r.Lookup(typ); !ok || s.Timeout != 20*60e9 {
			t.Errorf("Lookup(%s) = %+v, %v", typ, s, ok)
		}
	}
}
