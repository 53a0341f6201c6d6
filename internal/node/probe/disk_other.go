//go:build !linux && !darwin && !dragonfly && !freebsd && !windows

package probe

import "errors"

// statfs is not implemented on this OS.
func statfs(string) (total, avail, used uint64, err error) {
	return 0, 0, 0, errors.ErrUnsupported
}
