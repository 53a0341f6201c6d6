package agent

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

func TestStableHash(t *testing.T) {
	base := func() api.Capabilities {
		return api.Capabilities{Hostname: "h", OSFamily: "linux", RAMTotalMB: 1024, Inventory: &api.HostInventory{
			CollectedAt: time.Unix(1, 0),
			Memory:      api.MemoryInfo{TotalBytes: 1 << 30, AvailableBytes: 1 << 29, AvailableMiB: 512},
			Filesystems: []api.Filesystem{{MountPoint: "/", TotalBytes: 1 << 40, UsedBytes: 1 << 30, FreeBytes: 1 << 39, UsedPercent: 0.1}},
		}}
	}
	tests := []struct {
		name    string
		mutate  func(*api.Capabilities)
		changed bool
	}{
		{"collection time", func(c *api.Capabilities) { c.Inventory.CollectedAt = time.Unix(999, 0) }, false},
		{"available memory", func(c *api.Capabilities) { c.Inventory.Memory.AvailableMiB = 100 }, false},
		{"filesystem usage", func(c *api.Capabilities) { c.Inventory.Filesystems[0].UsedBytes = 5 << 30 }, false},
		{"total memory", func(c *api.Capabilities) { c.Inventory.Memory.TotalBytes = 2 << 30 }, true},
		{"new filesystem", func(c *api.Capabilities) {
			c.Inventory.Filesystems = append(c.Inventory.Filesystems, api.Filesystem{MountPoint: "/data"})
		}, true},
		{"accelerator error", func(c *api.Capabilities) { c.AccelError = "selected_accel not supported by host: kvm" }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := base(), base()
			tt.mutate(&b)
			if got := stableHash(a) != stableHash(b); got != tt.changed {
				t.Fatalf("changed = %v, want %v", got, tt.changed)
			}
			// The hash must not modify the capabilities it reads.
			c := base()
			_ = stableHash(c)
			if c.Inventory.Filesystems[0].UsedBytes != 1<<30 || c.Inventory.CollectedAt.IsZero() {
				t.Fatal("stableHash modified its input")
			}
		})
	}
}
