//go:build !windows

package atomicfile

import (
	"fmt"
	"os"
)

// syncDir fsyncs a directory so that a rename in it is durable.
func SyncDir(dir string) error {
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
func rename(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("rename %s: %w", from, err)
	}
	return nil
}
