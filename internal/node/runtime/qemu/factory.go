package qemu

import (
	"context"
	"errors"
	goruntime "runtime"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/runtime"
)

// Name is the adapter's registry name (NODE_AGENT_RUNTIME=qemu).
const Name = "qemu"

var (
	_ runtime.OrphanSweeper = (*Runtime)(nil)
	_ runtime.Releaser      = (*Runtime)(nil)
)

// Config is the QEMU runtime's own configuration: its NODE_AGENT_QEMU_*
// settings (Settings), parsed by ParseConfig. The accelerator is not here:
// the agent proves and selects it for the host (NODE_AGENT_QEMU_ACCEL,
// runtime.Options.Accel; docs/adr/0007-runtime-owned-config.md).
type Config struct {
	Binary string // NODE_AGENT_QEMU_BINARY / -qemu-binary
}

// Settings are the keys the QEMU runtime owns.
func Settings() []runtime.Setting {
	return []runtime.Setting{
		{Name: "BINARY", Usage: "QEMU system emulator (default qemu-system-<arch>)",
			Default: accel.QEMUBinary(goruntime.GOARCH)},
	}
}

// ParseConfig builds the Config from the settings' values.
func ParseConfig(v runtime.Values) (Config, error) {
	return Config{Binary: v["BINARY"]}, nil
}

// Entry is the QEMU runtime's registration:
// runtime.Registry{qemu.Name: qemu.Entry()}.
func Entry() runtime.Entry {
	return runtime.WithConfig(ParseConfig, Factory, Settings()...)
}

// Factory builds the QEMU runtime from the agent's options and its own
// config. It refuses to build without a working accelerator.
func Factory(ctx context.Context, o runtime.Options, c Config) (runtime.Runtime, error) {
	if o.Accel == "" {
		return nil, errors.New("no working accelerator for QEMU (is qemu-system installed? see docs/runbooks/accelerators.md)")
	}
	r, err := New(ctx, Options{Root: o.Root, Images: o.Images, Accel: o.Accel, QEMUBinary: c.Binary,
		OnOrphanRemoved: o.OnOrphanRemoved, Log: o.Log})
	if err != nil {
		return nil, err
	}
	return r, nil
}
