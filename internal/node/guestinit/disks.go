package guestinit

import (
	"path"
	"strings"
)

// Kernel command-line parameters that name the root and config disks by
// device path, for VMMs that cannot set a virtio serial (Firecracker: its
// drive ids are not serials the guest sees). QEMU sets the serials
// (RootSerial, ConfigSerial) and passes neither.
const (
	RootParam   = "drover.root"   // drover.root=/dev/vda
	ConfigParam = "drover.config" // drover.config=/dev/vdb
)

// DisksFromCmdline maps RootSerial and ConfigSerial to the device paths
// the kernel command line names with RootParam and ConfigParam. A value
// that is not a plain path under /dev/ is ignored (the disk is then looked
// up by serial).
func DisksFromCmdline(cmdline string) map[string]string {
	disks := map[string]string{}
	for _, f := range strings.Fields(cmdline) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(v, "/dev/") || path.Clean(v) != v || strings.Count(v, "/") != 2 {
			continue
		}
		switch k {
		case RootParam:
			disks[RootSerial] = v
		case ConfigParam:
			disks[ConfigSerial] = v
		}
	}
	return disks
}
