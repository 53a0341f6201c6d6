package agent

import (
	"testing"

	"github.com/drover-dev/drover/internal/node/hostinfo"
)

// TestHostRoot: NODE_AGENT_HOST_ROOT points the inventory and the slice
// tasks below it; "/" and "" are the host's own root.
func TestHostRoot(t *testing.T) {
	for _, tc := range []struct {
		root, want string
		inv        hostinfo.Config
	}{
		{"", "", hostinfo.Config{}},
		{"/", "", hostinfo.Config{}},
		{"/host/", "/host", hostinfo.Config{SysRoot: "/host/sys", ProcRoot: "/host/proc", DevRoot: "/host/dev", EtcRoot: "/host/etc"}},
	} {
		c := Config{HostRoot: tc.root}
		if got := c.hostRoot(); got != tc.want {
			t.Errorf("hostRoot(%q) = %q, want %q", tc.root, got, tc.want)
		}
		if got := c.inventoryConfig(); got.SysRoot != tc.inv.SysRoot || got.ProcRoot != tc.inv.ProcRoot ||
			got.DevRoot != tc.inv.DevRoot || got.EtcRoot != tc.inv.EtcRoot {
			t.Errorf("inventoryConfig(%q) = %+v, want %+v", tc.root, got, tc.inv)
		}
	}
	a, err := New(Config{ControlPlaneURL: "https://cp.example:8443", OSFamily: "linux", StateDir: t.TempDir(),
		HostRoot: "/host", Runtime: RuntimeNone})
	if err != nil {
		t.Fatal(err)
	}
	if a.sliceRoot != "/host" || len(a.sliceDevDirs) != 1 || a.sliceDevDirs[0] != "/host/dev" {
		t.Errorf("slice root %q, device dirs %v", a.sliceRoot, a.sliceDevDirs)
	}
}
