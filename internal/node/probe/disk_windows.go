//go:build windows

package probe

import "golang.org/x/sys/windows"

// statfs returns total, available and used bytes of path's volume.
func statfs(path string) (total, avail, used uint64, err error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return 0, 0, 0, err
	}
	var freeToCaller, totalBytes, totalFree uint64
	if err := windows.GetDiskFreeSpaceEx(p, &freeToCaller, &totalBytes, &totalFree); err != nil {
		return 0, 0, 0, err
	}
	return totalBytes, freeToCaller, totalBytes - totalFree, nil
}
