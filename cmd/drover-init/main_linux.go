//go:build linux

// Command drover-init is Drover's init for microVMs (internal/node/guestinit):
// as PID 1 it boots the workload. Run by hand, "drover-init initramfs
// -modules /lib/modules/<version> -o initrd.img" writes the initramfs the
// microVM runtime boots (this binary as /init, plus the kernel's virtio,
// ext4 and button modules); see docs/runbooks/microvms.md.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/drover-dev/drover/internal/node/guestinit"
)

func main() {
	if os.Getpid() == 1 {
		guestinit.Main()
	}
	if len(os.Args) < 2 || os.Args[1] != "initramfs" {
		fmt.Fprintln(os.Stderr, "usage: drover-init initramfs -modules DIR -o FILE (as PID 1 it boots the guest)")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("initramfs", flag.ExitOnError)
	mods := fs.String("modules", "", "the kernel's lib/modules/<version> (\"\": drivers built in)")
	out := fs.String("o", "initrd.img", "output file")
	_ = fs.Parse(os.Args[2:])
	self, err := os.Executable()
	if err == nil {
		var b []byte
		if b, err = os.ReadFile(self); err == nil {
			var img []byte
			if img, err = guestinit.InitramfsBytes(b, *mods); err == nil {
				err = os.WriteFile(*out, img, 0o644)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-init:", err)
		os.Exit(1)
	}
}
