package qemu

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// setupTap creates the tap device name (unless it exists) and enslaves it,
// up, to bridge, with iproute2.
// A tap it created is removed again when enslaving fails.
func setupTap(ctx context.Context, name, bridge string) error {
	created := false
	if err := exec.CommandContext(ctx, "ip", "link", "show", "dev", name).Run(); err != nil {
		if err := ipCmd(ctx, "tuntap", "add", "dev", name, "mode", "tap"); err != nil {
			return err
		}
		created = true
	}
	err := ipCmd(ctx, "link", "set", "dev", name, "master", bridge, "up")
	if err != nil && created {
		_ = ipCmd(context.WithoutCancel(ctx), "link", "del", "dev", name)
	}
	return err
}

// removeTap deletes the tap device; a missing one is fine.
func removeTap(ctx context.Context, name string) error {
	if err := exec.CommandContext(ctx, "ip", "link", "show", "dev", name).Run(); err != nil {
		return nil
	}
	return ipCmd(ctx, "link", "del", "dev", name)
}

func ipCmd(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
