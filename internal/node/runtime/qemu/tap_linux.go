package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// setupTap creates the tap device name (unless it exists) and attaches it,
// up, to bridge: a Linux bridge enslaves it with iproute2; any other
// device of that name (an Open vSwitch bridge's internal port: no
// bridge/ directory in sysfs) gets it as an OVS port with ovs-vsctl, which
// OVS needs (it refuses `ip link set master`). A tap it created is
// removed again when attaching fails.
func setupTap(ctx context.Context, name, bridge string) error {
	created := false
	if err := exec.CommandContext(ctx, "ip", "link", "show", "dev", name).Run(); err != nil {
		if err := ipCmd(ctx, "tuntap", "add", "dev", name, "mode", "tap"); err != nil {
			return err
		}
		created = true
	}
	var err error
	for _, c := range attachCommands(bridgeKind("/sys/class/net", bridge), name, bridge) {
		if err = runCmd(ctx, c); err != nil {
			break
		}
	}
	if err != nil && created {
		_ = ipCmd(context.WithoutCancel(ctx), "link", "del", "dev", name)
	}
	return err
}

// Bridge kinds a tap is attached to.
const (
	linuxBridge = "linux"
	ovsBridge   = "ovs"
)

// bridgeKind is linuxBridge when sysfs (under netDir) shows bridge as a
// Linux bridge, else ovsBridge: a name that exists but is no Linux bridge
// is an Open vSwitch bridge's port, and a missing one fails either way
// with the tool's own message.
func bridgeKind(netDir, bridge string) string {
	if _, err := os.Stat(filepath.Join(netDir, bridge, "bridge")); err == nil {
		return linuxBridge
	}
	if _, err := os.Stat(filepath.Join(netDir, bridge)); err != nil {
		return linuxBridge
	}
	return ovsBridge
}

// attachCommands are the commands that attach tap, up, to a bridge of
// kind.
func attachCommands(kind, tap, bridge string) [][]string {
	if kind == ovsBridge {
		return [][]string{
			{"ovs-vsctl", "--may-exist", "add-port", bridge, tap},
			{"ip", "link", "set", "dev", tap, "up"},
		}
	}
	return [][]string{{"ip", "link", "set", "dev", tap, "master", bridge, "up"}}
}

// removeTap deletes the tap device, and its OVS port record when it was
// on an Open vSwitch bridge (OVS keeps the port otherwise); a missing tap
// is fine.
func removeTap(ctx context.Context, name string) error {
	if err := exec.CommandContext(ctx, "ip", "link", "show", "dev", name).Run(); err != nil {
		return nil
	}
	if master, err := os.Readlink(filepath.Join("/sys/class/net", name, "master")); err == nil &&
		filepath.Base(master) == "ovs-system" {
		if err := runCmd(ctx, []string{"ovs-vsctl", "--if-exists", "del-port", name}); err != nil {
			return err
		}
	}
	return ipCmd(ctx, "link", "del", "dev", name)
}

func ipCmd(ctx context.Context, args ...string) error {
	return runCmd(ctx, append([]string{"ip"}, args...))
}

// runCmd runs argv, its output in the error.
func runCmd(ctx context.Context, argv []string) error {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
