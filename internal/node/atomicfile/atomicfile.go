// Package atomicfile replaces a file so that a crash leaves either its old
// or its new content, never a mix: write a temporary file beside it, fsync
// it, rename it over the target, fsync the directory (Windows: a
// write-through move). It owns only that; callers create directories and
// choose modes. Leftover temporary files are named ".<name>.*.tmp".
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// TempSuffix ends the name of every temporary file Write creates, so a
// caller can sweep leftovers of interrupted writes.
const TempSuffix = ".tmp"

// Write replaces path with data, mode perm (applied explicitly, not through
// the umask). The directory must exist.
func Write(path string, data []byte, perm os.FileMode) (err error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+name+".*"+TempSuffix)
	if err != nil {
		return fmt.Errorf("create temp for %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return fmt.Errorf("chmod temp for %s: %w", path, err)
	}
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err = rename(tmp, path); err != nil {
		return err
	}
	if err = SyncDir(dir); err != nil {
		return fmt.Errorf("fsync dir of %s: %w", path, err)
	}
	return nil
}
