//go:build linux

package slicevm

import (
	"context"
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernelZero asks the kernel to zero [0, size) of a block device with
// BLKZEROOUT, wipeChunk*256 bytes at a time so that ctx is honoured.
func kernelZero(ctx context.Context, f *os.File, size int64) (int64, error) {
	const chunk = wipeChunk * 256 // 1 GiB
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return off, err
		}
		n := min(chunk, size-off)
		rng := [2]uint64{uint64(off), uint64(n)}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&rng[0])))
		if errno != 0 {
			if off == 0 && (errors.Is(errno, unix.ENOTTY) || errors.Is(errno, unix.EOPNOTSUPP) || errors.Is(errno, unix.EINVAL)) {
				return 0, errNoKernelZero
			}
			return off, errno
		}
		off += n
	}
	return size, nil
}
