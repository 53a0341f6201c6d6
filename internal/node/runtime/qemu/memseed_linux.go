package qemu

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// memSeeds: a seed that holds secrets is built in memory (a sealed memfd)
// and handed to QEMU as an inherited file descriptor; it never touches
// the agent's disk.
const memSeeds = true

// newMemFile is an empty memfd that can be sealed.
func newMemFile(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate("drover-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return os.NewFile(uintptr(fd), "memfd:drover-"+name), nil
}

// sealMemFile forbids any further change to f's size or bytes, and any
// further seal.
func sealMemFile(f *os.File) error {
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return fmt.Errorf("seal memfd: %w", err)
	}
	return nil
}

// reopenReadOnly opens f again read-only: QEMU takes, for a readonly
// drive, an fd of that access mode from the fd set.
func reopenReadOnly(f *os.File) (*os.File, error) {
	return os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), os.O_RDONLY, 0)
}

// tmpfsMagic is statfs's f_type of a tmpfs.
const tmpfsMagic = 0x01021994

// tmpfsWorkspace returns a new 0700 directory on a tmpfs (the ISO library
// stages the seed's files there while it packs them into a memfd) and its
// removal. /dev/shm is tried first, then $XDG_RUNTIME_DIR and /run.
func tmpfsWorkspace() (string, func(), error) {
	for _, base := range []string{"/dev/shm", os.Getenv("XDG_RUNTIME_DIR"), "/run"} {
		var fs unix.Statfs_t
		if base == "" || unix.Statfs(base, &fs) != nil || int64(fs.Type) != tmpfsMagic {
			continue
		}
		dir, err := os.MkdirTemp(base, "drover-seed-*")
		if err != nil {
			continue
		}
		return dir, func() { _ = os.RemoveAll(dir) }, nil
	}
	return "", nil, errors.New("no tmpfs to stage the seed in (/dev/shm, $XDG_RUNTIME_DIR, /run)")
}
