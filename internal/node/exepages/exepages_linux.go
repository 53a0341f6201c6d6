package exepages

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Trim unmaps the read-only, never-written mappings of the running
// executable and then drops the executable's pages that no process maps
// any more from the page cache. Those mappings are marked MADV_RANDOM
// first, so that a later fault reads and maps the one page it needs: with
// read-around and fault-around a fault maps 64–128 KB, and the idle
// agent's scattered code and runtime tables came back as ≈ 9 MB within
// seconds of a trim instead of the ≈ 5 MB it touches.
//
// The cost is a disk read for each page a later fault needs that nobody
// else keeps cached: the working set once after each trim, and code the
// agent has not run since (a first task of a kind) one page at a time.
// Eviction spares pages that are mapped (by this process's threads
// running at the moment, or by another process) or dirty, and is skipped
// for an executable on tmpfs or ramfs, which has no other copy. Where it
// cannot be done (an executable this process may not read), the mappings
// are unmapped all the same and the error says that they were not
// evicted.
func Trim() (Result, error) {
	maps, err := exeMappings()
	if err != nil {
		return Result{}, err
	}
	// Opened first: what runs between the unmapping and the eviction
	// faults its pages back with fault-around, from a still full cache.
	exe, evict, evictErr := openEvictable()
	if exe != nil {
		defer exe.Close()
	}
	var res Result
	for _, m := range maps {
		// exeMappings kept only the executable's: droppable then decides
		// on the permissions and private copies alone.
		if !m.droppable(m.major, m.minor, m.inode) {
			res.Skipped++
			continue
		}
		// MADV_PAGEOUT unmaps and evicts each page at once where the
		// kernel lets this process (5.4 and later, an executable it owns
		// or may write); MADV_DONTNEED unmaps whatever it left.
		if err := madvise(m, unix.MADV_RANDOM); err != nil {
			return res, err
		}
		if evict {
			if err := madvise(m, unix.MADV_PAGEOUT); err != nil && !errors.Is(err, unix.EINVAL) {
				return res, err
			}
		}
		if err := madvise(m, unix.MADV_DONTNEED); err != nil {
			return res, err
		}
		res.Mappings++
		res.Bytes += m.rss
	}
	if res.Mappings == 0 || !evict {
		return res, evictErr
	}
	if err := unix.Fadvise(int(exe.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return res, fmt.Errorf("exepages: evict the executable's pages: %w", err)
	}
	res.Evicted = true
	return res, nil
}

// openEvictable opens the running executable for eviction and says
// whether to evict it: not when it lives in memory (a diskless host's
// tmpfs or ramfs root), where its pages are the file and evicting would
// mean swapping them out, if anything. An executable that cannot be
// opened or examined is trimmed without eviction, and the error says so.
func openEvictable() (*os.File, bool, error) {
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, false, fmt.Errorf("exepages: unmapped, not evicted: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(exe.Fd()), &fs); err != nil {
		exe.Close()
		return nil, false, fmt.Errorf("exepages: unmapped, not evicted: statfs of the executable: %w", err)
	}
	return exe, fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.RAMFS_MAGIC, nil
}

// madvise gives advice for m's range, the kernel's own mapping of our
// executable (not Go memory, so a plain address).
func madvise(m mapping, advice int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), uintptr(advice)); errno != 0 {
		return fmt.Errorf("exepages: madvise(%d) %x-%x: %w", advice, m.start, m.end, errno)
	}
	return nil
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
