//go:build !windows

package statedir

import (
	"fmt"
	"io/fs"
)

// checkDirPerm refuses a state directory that group or others can write:
// they could plant a key or a forged result.
func checkDirPerm(path string, fi fs.FileInfo) error {
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("statedir: %s has mode %#o, want no group/other write (chmod 700): %w", path, fi.Mode().Perm(), ErrInsecure)
	}
	return nil
}
