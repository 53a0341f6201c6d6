package guestinit

import (
	"maps"
	"testing"
)

func TestDisksFromCmdline(t *testing.T) {
	for _, c := range []struct {
		name, cmdline string
		want          map[string]string
	}{
		{"firecracker", "console=ttyS0 reboot=k rdinit=/init drover.root=/dev/vda drover.config=/dev/vdb",
			map[string]string{RootSerial: "/dev/vda", ConfigSerial: "/dev/vdb"}},
		{"qemu: serials only", "console=ttyS0 quiet panic=-1 rdinit=/init", map[string]string{}},
		{"not under /dev", "drover.root=/tmp/vda drover.config=vdb", map[string]string{}},
		{"traversal", "drover.root=/dev/../etc/shadow drover.config=/dev/disk/../vdb", map[string]string{}},
		{"nested path", "drover.root=/dev/mapper/root", map[string]string{}},
		{"other drover keys", "drover.volume=/dev/vdc drover.config=/dev/vdc", map[string]string{ConfigSerial: "/dev/vdc"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := DisksFromCmdline(c.cmdline); !maps.Equal(got, c.want) {
				t.Errorf("DisksFromCmdline(%q) = %v, want %v", c.cmdline, got, c.want)
			}
		})
	}
}
