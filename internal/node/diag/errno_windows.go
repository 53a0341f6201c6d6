//go:build windows

package diag

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// defaultRootPath is the system drive, e.g. `C:\`.
func defaultRootPath() string {
	if d := os.Getenv("SystemDrive"); d != "" {
		return d + `\`
	}
	return `C:\`
}

func isNoSpace(err error) bool {
	return errors.Is(err, windows.ERROR_DISK_FULL) || errors.Is(err, windows.ERROR_HANDLE_DISK_FULL)
}

func isQuota(err error) bool { return errors.Is(err, windows.ERROR_DISK_QUOTA_EXCEEDED) }

func isReadOnly(err error) bool { return errors.Is(err, windows.ERROR_WRITE_PROTECT) }
