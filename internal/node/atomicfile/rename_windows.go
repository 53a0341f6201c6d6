//go:build windows

package atomicfile

import (
	"fmt"

	"golang.org/x/sys/windows"
)

// syncDir is a no-op: Windows has no directory fsync. rename asks for
// MOVEFILE_WRITE_THROUGH instead, which returns only once the move is on
// disk.
func SyncDir(string) error { return nil }

// rename atomically replaces to with from and flushes the move.
func rename(from, to string) error {
	f, err := windows.UTF16PtrFromString(from)
	if err != nil {
		return fmt.Errorf("rename %s: %w", from, err)
	}
	t, err := windows.UTF16PtrFromString(to)
	if err != nil {
		return fmt.Errorf("rename %s: %w", to, err)
	}
	if err := windows.MoveFileEx(f, t, windows.MOVEFILE_REPLACE_EXISTING|windows.MOVEFILE_WRITE_THROUGH); err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	return nil
}
