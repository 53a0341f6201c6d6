//go:build windows

package hostinfo

// Windows host facts straight from kernel32/ntdll and the registry through
// x/sys/windows. gopsutil's windows build pulls in WMI (yusufpapurcu/wmi,
// go-ole), which the agent does not need for these numbers.

import (
	"context"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/windows"
	"golang.org/x/sys/windows/registry"

	"github.com/drover-dev/drover/internal/wire/api"
)

// KernelVersion is "major.minor.build".
func KernelVersion(context.Context) (string, error) {
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

// Memory is system memory. Windows has no separate "free" figure:
// available physical memory is both free and standby (reclaimable) pages.
func Memory(context.Context) (Meminfo, error) {
	proc := windows.NewLazySystemDLL("kernel32.dll").NewProc("GlobalMemoryStatusEx")
	if err := proc.Find(); err != nil {
		return Meminfo{}, fmt.Errorf("GlobalMemoryStatusEx: %w", err)
	}
	var ms memoryStatusEx
	ms.Length = uint32(unsafe.Sizeof(ms))
	r, _, err := proc.Call(uintptr(unsafe.Pointer(&ms)))
	if r == 0 {
		return Meminfo{}, fmt.Errorf("GlobalMemoryStatusEx: %w", err)
	}
	return Meminfo{Total: ms.TotalPhys, Free: ms.AvailPhys, Available: ms.AvailPhys}, nil
}

// FSUsageOf measures the volume holding path.
func FSUsageOf(_ context.Context, path string) (FSUsage, error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return FSUsage{}, fmt.Errorf("filesystem usage of %s: %w", path, err)
	}
	var avail, total, totalFree uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &totalFree); err != nil {
		return FSUsage{}, fmt.Errorf("GetDiskFreeSpaceEx %s: %w", path, err)
	}
	return FSUsage{Total: total, Free: avail, Used: total - totalFree}, nil
}

func hostCPU(context.Context) (api.CPUInfo, error) {
	c := api.CPUInfo{Virtualization: []string{}, Threads: runtime.NumCPU(), Sockets: 1}
	c.Cores = c.Threads
	k, err := registry.OpenKey(registry.LOCAL_MACHINE, `HARDWARE\DESCRIPTION\System\CentralProcessor\0`, registry.QUERY_VALUE)
	if err != nil {
		return c, fmt.Errorf("cpu registry key: %w", err)
	}
	defer k.Close()
	c.Model, _, _ = k.GetStringValue("ProcessorNameString")
	c.Vendor, _, _ = k.GetStringValue("VendorIdentifier")
	return c, nil
}

// hostMounts lists fixed drives ("C:\").
func hostMounts(context.Context) ([]Mount, error) {
	mask, err := windows.GetLogicalDrives()
	if err != nil {
		return nil, fmt.Errorf("GetLogicalDrives: %w", err)
	}
	var out []Mount
	for i := 0; i < 26; i++ {
		if mask&(1<<i) == 0 {
			continue
		}
		root := string(rune('A'+i)) + `:\`
		p, _ := windows.UTF16PtrFromString(root)
		if windows.GetDriveType(p) != windows.DRIVE_FIXED {
			continue
		}
		fsName := make([]uint16, windows.MAX_PATH+1)
		fsType := "ntfs"
		if err := windows.GetVolumeInformation(p, nil, 0, nil, nil, nil, &fsName[0], uint32(len(fsName))); err == nil {
			fsType = windows.UTF16ToString(fsName)
		}
		out = append(out, Mount{Device: root[:2], MountPoint: root, FSType: fsType})
	}
	return out, nil
}
