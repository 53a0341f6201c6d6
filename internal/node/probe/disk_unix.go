//go:build linux || darwin || dragonfly || freebsd

package probe

import "golang.org/x/sys/unix"

// statfs returns total, available and used bytes of path's filesystem.
func statfs(path string) (total, avail, used uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, 0, err
	}
	bs := uint64(st.Bsize) //nolint:gosec // block sizes are positive
	blocks, free, bavail := uint64(st.Blocks), uint64(st.Bfree), uint64(st.Bavail)
	return blocks * bs, bavail * bs, (blocks - free) * bs, nil
}
