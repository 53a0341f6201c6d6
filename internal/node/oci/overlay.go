package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// OverlayName is the file Overlay creates in an instance's directory.
const OverlayName = "rootfs.qcow2"

// Overlay creates instanceDir/rootfs.qcow2, a qcow2 overlay whose backing
// file is the (raw, read-only) root filesystem at rootfsPath, for QEMU to
// boot copy-on-write: `qemu-img create -f qcow2 -F raw -b rootfsPath`.
// qemuImg is the qemu-img binary ("" : from PATH). It is created under a
// temporary name and renamed, so an existing overlay (an instance's
// writes) is only replaced by a whole new one. Failures are *runtime.Error
// with reason rootfs_build_failed.
func Overlay(ctx context.Context, qemuImg, rootfsPath, instanceDir string) (string, error) {
	id := filepath.Base(instanceDir)
	if qemuImg == "" {
		qemuImg = "qemu-img"
	}
	backing, err := filepath.Abs(rootfsPath)
	if err == nil {
		_, err = os.Stat(backing)
	}
	if err != nil {
		return "", overlayError(id, fmt.Errorf("root filesystem: %w", err))
	}
	dst := filepath.Join(instanceDir, OverlayName)
	tmp := filepath.Join(instanceDir, "."+OverlayName+".tmp")
	_ = os.Remove(tmp)
	b, err := exec.CommandContext(ctx, qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", backing, tmp).CombinedOutput()
	if err != nil {
		_ = os.Remove(tmp)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return "", overlayError(id, fmt.Errorf("%s: %w (install qemu-utils)", qemuImg, err))
		}
		return "", overlayError(id, fmt.Errorf("qemu-img create overlay of %s: %w: %s", backing, err, tail(b)))
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return "", overlayError(id, err)
	}
	return dst, nil
}

func overlayError(id string, err error) error {
	return &runtime.Error{Reason: api.ReasonRootfsBuildFailed, Op: "overlay", ID: id, Err: err}
}
