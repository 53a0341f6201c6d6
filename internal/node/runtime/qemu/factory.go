package qemu

import (
	"context"
	"errors"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Name is the adapter's registry name (NODE_AGENT_RUNTIME=qemu).
const Name = "qemu"

var (
	_ runtime.Factory       = Factory
	_ runtime.OrphanSweeper = (*Runtime)(nil)
	_ runtime.Releaser      = (*Runtime)(nil)
)

// Factory builds the QEMU runtime from the agent's options; register it as
// runtime.Registry{qemu.Name: qemu.Factory}. It refuses to build without a
// working accelerator.
func Factory(ctx context.Context, o runtime.Options) (runtime.Runtime, error) {
	if o.Accel == "" {
		return nil, errors.New("no working accelerator for QEMU (is qemu-system installed? see docs/runbooks/accelerators.md)")
	}
	r, err := New(ctx, Options{Root: o.Root, Images: o.Images, Accel: o.Accel, QEMUBinary: o.QEMUBinary,
		OnOrphanRemoved: o.OnOrphanRemoved, Log: o.Log})
	if err != nil {
		return nil, err
	}
	return r, nil
}
