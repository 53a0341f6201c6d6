//go:build dragonfly

package hostinfo

// DragonFly BSD host facts straight from sysctl and statfs: gopsutil
// compiles there but returns ErrNotImplemented.

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/drover-dev/drover/internal/wire/api"
)

// KernelVersion is the running kernel's release.
func KernelVersion(context.Context) (string, error) {
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

// Memory is system memory; inactive and cached pages count as available.
func Memory(context.Context) (Meminfo, error) {
	total, err := sysctlUint("hw.physmem")
	if err != nil {
		return Meminfo{}, err
	}
	page, err := sysctlUint("vm.stats.vm.v_page_size")
	if err != nil {
		return Meminfo{}, err
	}
	free, err := sysctlUint("vm.stats.vm.v_free_count")
	if err != nil {
		return Meminfo{}, err
	}
	// A missing counter counts 0.
	inactive, _ := sysctlUint("vm.stats.vm.v_inactive_count")
	cache, _ := sysctlUint("vm.stats.vm.v_cache_count")
	return Meminfo{Total: total, Free: free * page, Available: (free + inactive + cache) * page}, nil
}

// FSUsageOf measures the filesystem holding path.
func FSUsageOf(_ context.Context, path string) (FSUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FSUsage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := uint64(st.Bsize)
	u := FSUsage{Total: uint64(st.Blocks) * bs, Used: uint64(st.Blocks-st.Bfree) * bs}
	if st.Bavail > 0 {
		u.Free = uint64(st.Bavail) * bs
	}
	return u, nil
}

func hostCPU(context.Context) (api.CPUInfo, error) {
	c := api.CPUInfo{Virtualization: []string{}, Threads: runtime.NumCPU(), Sockets: 1}
	c.Cores = c.Threads
	m, err := unix.Sysctl("hw.model")
	c.Model = m
	if err != nil {
		return c, fmt.Errorf("sysctl hw.model: %w", err)
	}
	return c, nil
}

func hostMounts(context.Context) ([]Mount, error) {
	n, err := unix.Getfsstat(nil, unix.MNT_NOWAIT)
	if err != nil {
		return nil, fmt.Errorf("getfsstat: %w", err)
	}
	buf := make([]unix.Statfs_t, n)
	if n, err = unix.Getfsstat(buf, unix.MNT_NOWAIT); err != nil {
		return nil, fmt.Errorf("getfsstat: %w", err)
	}
	out := make([]Mount, 0, n)
	for _, st := range buf[:n] {
		out = append(out, Mount{Device: unix.ByteSliceToString(st.Mntfromname[:]),
			MountPoint: unix.ByteSliceToString(st.Mntonname[:]), FSType: unix.ByteSliceToString(st.Fstypename[:])})
	}
	return out, nil
}
