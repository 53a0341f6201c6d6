package exepages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Trim unmaps the read-only, never-written mappings of the running
// executable (identified by the device and inode of /proc/self/exe, so a
// binary replaced on disk since start is still recognised).
func Trim() (Result, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return Result{}, fmt.Errorf("exepages: stat /proc/self/exe: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return Result{}, fmt.Errorf("exepages: %w", err)
	}
	maps, err := parseSmaps(f)
	f.Close()
	if err != nil {
		return Result{}, fmt.Errorf("exepages: /proc/self/smaps: %w", err)
	}
	major, minor := unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev))
	var res Result
	for _, m := range maps {
		if m.major != major || m.minor != minor || m.inode != st.Ino {
			continue
		}
		if !m.droppable(major, minor, st.Ino) {
			res.Skipped++
			continue
		}
		// The range is the kernel's own mapping of our executable, not Go
		// memory: madvise takes it as a plain address.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), unix.MADV_DONTNEED); errno != 0 {
			return res, fmt.Errorf("exepages: madvise %x-%x: %w", m.start, m.end, errno)
		}
		res.Mappings++
		res.Bytes += m.rss
	}
	return res, nil
}
