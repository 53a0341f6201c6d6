package exepages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Trim unmaps the read-only, never-written mappings of the running
// executable.
func Trim() (Result, error) {
	maps, err := exeMappings()
	if err != nil {
		return Result{}, err
	}
	var res Result
	for _, m := range maps {
		// exeMappings kept only the executable's: droppable then decides
		// on the permissions and private copies alone.
		if !m.droppable(m.major, m.minor, m.inode) {
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

// exeMappings is the running executable's mappings in /proc/self/smaps,
// the executable identified by the device and inode of /proc/self/exe (so
// a binary replaced on disk since start is still recognised).
func exeMappings() ([]mapping, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return nil, fmt.Errorf("exepages: stat /proc/self/exe: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("exepages: %w", err)
	}
	maps, err := parseSmaps(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("exepages: /proc/self/smaps: %w", err)
	}
	major, minor := unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev))
	exe := maps[:0]
	for _, m := range maps {
		if m.of(major, minor, st.Ino) {
			exe = append(exe, m)
		}
	}
	return exe, nil
}
