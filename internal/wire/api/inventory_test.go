package api

import (
	"encoding/json"
	"reflect"
	"regexp"
	"testing"
)

func intPtr(n int) *int { return &n }

func sampleInventory() HostInventory {
	return HostInventory{
		Hostname: "gpu-01",
		OS:       OSInfo{Family: OSLinux, KernelVersion: "6.8.0", Arch: "amd64"},
		CPU:      CPUInfo{Model: "Xeon", Sockets: 2, Cores: 112, Threads: 224, Virtualization: []string{"vmx"}},
		Memory:   MemoryInfo{TotalBytes: 2 << 40, TotalMiB: 2 << 20},
		Filesystems: []Filesystem{
			{MountPoint: "/", TotalBytes: 100 << 30},
			{MountPoint: "/var/lib", TotalBytes: 3500 << 30},
			{MountPoint: `C:\`, TotalBytes: 500 << 30},
		},
		GPUs: []GPU{
			{PCIFunction: PCIFunction{Address: "0000:3b:00.0", VendorID: "0x10de", DeviceID: "0x2330", DeviceName: "GH100 [H100 SXM5 80GB]",
				IOMMUGroup: intPtr(10)}, Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", Index: intPtr(0)},
			{PCIFunction: PCIFunction{Address: "0000:86:00.0", VendorID: "0x10de", DeviceID: "0x2330", DeviceName: "GH100 [H100 SXM5 80GB]"}, Vendor: "nvidia"},
			{PCIFunction: PCIFunction{Address: "0000:c1:00.0", VendorID: "0x1002", DeviceID: "0x74a1"}, Vendor: "amd"},
		},
		Fabric: []FabricDevice{{PCIFunction: PCIFunction{Address: "0000:af:00.0"}, SRIOVTotalVFs: 8,
			VFs: []VirtualFunction{{Index: 0, Address: "0000:af:00.2", IOMMUGroup: intPtr(21)}}}},
		NVMe:        []NVMeNamespace{{Name: "nvme0n1", ByIDPath: "/dev/disk/by-id/nvme-eui.1", MountPoints: []string{}, Holders: []string{}}},
		IOMMUGroups: []IOMMUGroup{{ID: 10, Devices: []string{"0000:3b:00.0"}}},
		Warnings:    []InventoryWarning{{Section: "pci_ids", Message: "none"}},
	}
}

// TestInventoryJSONKeys: every key on the wire is snake_case, the embedded
// PCI identity is flattened, and a round trip loses nothing.
func TestInventoryJSONKeys(t *testing.T) {
	inv := sampleInventory()
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	var raw any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if !snake.MatchString(k) {
					t.Errorf("key %s.%s is not snake_case", path, k)
				}
				walk(path+"."+k, c)
			}
		case []any:
			for _, c := range v {
				walk(path+"[]", c)
			}
		}
	}
	walk("", raw)
	gpu := raw.(map[string]any)["gpus"].([]any)[0].(map[string]any)
	for _, k := range []string{"pci_address", "vendor_id", "device_id", "iommu_group", "numa_node", "model", "index"} {
		if _, ok := gpu[k]; !ok {
			t.Errorf("gpu lacks %q: %v", k, gpu)
		}
	}
	if raw.(map[string]any)["gpus"].([]any)[1].(map[string]any)["iommu_group"] != nil {
		t.Error("iommu_group of a GPU without one is not null")
	}
	var back HostInventory
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, inv) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, inv)
	}
}

func TestInventoryCapabilities(t *testing.T) {
	inv := sampleInventory()
	tests := []struct {
		diskPath string
		wantDisk int
	}{
		{"/var/lib/drover-agent", 3500},
		{"/var/library", 100}, // not below /var/lib
		{"/", 100},
		{`c:\ProgramData\drover-agent`, 500},
		{"relative", 0},
	}
	for _, tc := range tests {
		c := inv.Capabilities(tc.diskPath)
		want := Capabilities{Hostname: "gpu-01", OSFamily: OSLinux, Arch: "amd64", KernelVersion: "6.8.0", CPUCores: 224,
			RAMTotalMB: 2 << 20, DiskTotalGB: tc.wantDisk, GPUCount: 3}
		if !reflect.DeepEqual(c, want) {
			t.Errorf("Capabilities(%q) = %+v\nwant %+v", tc.diskPath, c, want)
		}
		if fe := c.Validate(""); len(fe) != 0 {
			t.Errorf("Capabilities(%q) invalid: %+v", tc.diskPath, fe)
		}
	}
}
