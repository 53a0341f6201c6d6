//go:build unix

package osuser

import (
	"io/fs"
	"syscall"
)

// fileOwner returns fi's owner uid.
func fileOwner(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
