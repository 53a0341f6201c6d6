//go:build dragonfly

package diag

// DragonFly BSD host facts straight from sysctl and statfs: gopsutil
// compiles there but returns ErrNotImplemented.

import (
	"context"
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

func hostKernelVersion(_ context.Context) (string, error) {
	v, err := unix.Sysctl("kern.osrelease")
	if err != nil {
		return "", fmt.Errorf("sysctl kern.osrelease: %w", err)
	}
	return v, nil
}

// sysctlUint reads a 4- or 8-byte unsigned sysctl.
func sysctlUint(name string) (uint64, error) {
	b, err := unix.SysctlRaw(name)
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: %w", name, err)
	}
	switch len(b) {
	case 4:
		return uint64(binary.LittleEndian.Uint32(b)), nil
	case 8:
		return binary.LittleEndian.Uint64(b), nil
	}
	return 0, fmt.Errorf("sysctl %s: unexpected %d-byte value", name, len(b))
}

func hostMemory(_ context.Context) (memInfo, error) {
	total, err := sysctlUint("hw.physmem")
	if err != nil {
		return memInfo{}, err
	}
	page, err := sysctlUint("vm.stats.vm.v_page_size")
	if err != nil {
		return memInfo{}, err
	}
	free, err := sysctlUint("vm.stats.vm.v_free_count")
	if err != nil {
		return memInfo{}, err
	}
	// Inactive and cached pages can be reclaimed; a missing counter counts 0.
	inactive, _ := sysctlUint("vm.stats.vm.v_inactive_count")
	cache, _ := sysctlUint("vm.stats.vm.v_cache_count")
	return memInfo{total: total, free: free * page, available: (free + inactive + cache) * page}, nil
}

func hostFSUsage(_ context.Context, path string) (fsUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fsUsage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := uint64(st.Bsize)
	u := fsUsage{total: uint64(st.Blocks) * bs, used: uint64(st.Blocks-st.Bfree) * bs}
	if st.Bavail > 0 {
		u.free = uint64(st.Bavail) * bs
	}
	return u, nil
}
