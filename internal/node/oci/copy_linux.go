//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CopyForFirecracker gives an instance its own writable copy of the root
// filesystem at dst (Firecracker boots a raw drive and has no backing
// files): a reflink (FICLONE, copy-on-write on btrfs and XFS) when src
// and dst share such a filesystem, else a sparse copy (holes stay holes).
// It writes a temporary file beside dst and renames it. reflinked says
// which. Failures are *runtime.Error with reason rootfs_build_failed.
func CopyForFirecracker(ctx context.Context, rootfsPath, dst string) (reflinked bool, err error) {
	id := filepath.Base(filepath.Dir(dst))
	src, err := os.Open(rootfsPath)
	if err != nil {
		return false, overlayError(id, fmt.Errorf("root filesystem: %w", err))
	}
	defer func() { _ = src.Close() }()
	fi, err := src.Stat()
	if err != nil {
		return false, overlayError(id, err)
	}
	out, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*.tmp")
	if err != nil {
		return false, overlayError(id, err)
	}
	defer func() {
		if err != nil {
			_ = out.Close()
			_ = os.Remove(out.Name())
		}
	}()
	if cerr := unix.IoctlFileClone(int(out.Fd()), int(src.Fd())); cerr == nil {
		reflinked = true
	} else if err = sparseCopy(ctx, out, src, fi.Size()); err != nil {
		return false, overlayError(id, fmt.Errorf("copy %s: %w", rootfsPath, err))
	}
	if err = out.Chmod(0o600); err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(out.Name(), dst)
	}
	if err != nil {
		return false, overlayError(id, err)
	}
	return reflinked, nil
}

// sparseCopy copies src's data extents (SEEK_DATA/SEEK_HOLE) and sets
// dst's size, leaving holes unwritten.
func sparseCopy(ctx context.Context, dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if _, err := io.Copy(io.NewOffsetWriter(dst, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}
