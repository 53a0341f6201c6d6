//go:build windows

package diag

// Windows host facts straight from kernel32/ntdll through x/sys/windows.
// gopsutil's windows build pulls in WMI (yusufpapurcu/wmi, go-ole), which
// the agent does not need for these three numbers.

import (
	"context"
	"fmt"
	"unsafe"

	"golang.org/x/sys/windows"
)

func hostKernelVersion(_ context.Context) (string, error) {
	v := windows.RtlGetVersion()
	if v == nil || v.MajorVersion == 0 {
		return "", fmt.Errorf("RtlGetVersion returned no version")
	}
	return fmt.Sprintf("%d.%d.%d", v.MajorVersion, v.MinorVersion, v.BuildNumber), nil
}

// memoryStatusEx is MEMORYSTATUSEX.
type memoryStatusEx struct {
	Length               uint32
	MemoryLoad           uint32
	TotalPhys            uint64
	AvailPhys            uint64
	TotalPageFile        uint64
	AvailPageFile        uint64
	TotalVirtual         uint64
	AvailVirtual         uint64
	AvailExtendedVirtual uint64
}

func hostMemory(_ context.Context) (memInfo, error) {
	proc := windows.NewLazySystemDLL("kernel32.dll").NewProc("GlobalMemoryStatusEx")
	if err := proc.Find(); err != nil {
		return memInfo{}, fmt.Errorf("GlobalMemoryStatusEx: %w", err)
	}
	var ms memoryStatusEx
	ms.Length = uint32(unsafe.Sizeof(ms))
	r, _, err := proc.Call(uintptr(unsafe.Pointer(&ms)))
	if r == 0 {
		return memInfo{}, fmt.Errorf("GlobalMemoryStatusEx: %w", err)
	}
	// Windows has no separate "free" figure: available physical memory is
	// both free and standby (reclaimable) pages.
	return memInfo{total: ms.TotalPhys, free: ms.AvailPhys, available: ms.AvailPhys}, nil
}

func hostFSUsage(_ context.Context, path string) (fsUsage, error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return fsUsage{}, fmt.Errorf("filesystem usage of %s: %w", path, err)
	}
	var avail, total, totalFree uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &totalFree); err != nil {
		return fsUsage{}, fmt.Errorf("GetDiskFreeSpaceEx %s: %w", path, err)
	}
	return fsUsage{total: total, free: avail, used: total - totalFree}, nil
}
