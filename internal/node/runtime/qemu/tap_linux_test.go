package qemu

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestTapAttach: a Linux bridge enslaves the tap with iproute2; a device
// that is no Linux bridge (an Open vSwitch bridge's internal port) gets it
// as an OVS port. Real Open vSwitch is not run here.
func TestTapAttach(t *testing.T) {
	net := t.TempDir()
	for _, d := range []string{"br0/bridge", "ovsbr0"} {
		if err := os.MkdirAll(filepath.Join(net, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		bridge, kind string
		want         [][]string
	}{
		{"br0", linuxBridge, [][]string{{"ip", "link", "set", "dev", "tap1", "master", "br0", "up"}}},
		{"ovsbr0", ovsBridge, [][]string{{"ovs-vsctl", "--may-exist", "add-port", "ovsbr0", "tap1"}, {"ip", "link", "set", "dev", "tap1", "up"}}},
		// A missing bridge: iproute2 names it in its error.
		{"nosuch", linuxBridge, [][]string{{"ip", "link", "set", "dev", "tap1", "master", "nosuch", "up"}}},
	} {
		kind := bridgeKind(net, c.bridge)
		if kind != c.kind {
			t.Errorf("%s: kind %s, want %s", c.bridge, kind, c.kind)
		}
		if got := attachCommands(kind, "tap1", c.bridge); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: commands %q, want %q", c.bridge, got, c.want)
		}
	}
}
