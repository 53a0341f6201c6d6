//go:build !windows

package statedir

import (
	"fmt"
	"io/fs"
	"os"
)

// checkDirPerm refuses a state directory that group or others can write:
// they could plant a key or a forged result.
func checkDirPerm(path string, fi fs.FileInfo) error {
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("statedir: %s has mode %#o, want no group/other write (chmod 700): %w", path, fi.Mode().Perm(), ErrInsecure)
	}
	return nil
}

// syncDir fsyncs a directory so that a rename in it is durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// rename atomically replaces to with from; syncDir makes it durable.
func rename(from, to string) error { return os.Rename(from, to) }
