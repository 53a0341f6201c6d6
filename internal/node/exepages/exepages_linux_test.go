package exepages

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestTrim trims this test binary's own pages: its read-only mappings'
// resident bytes fall, they are marked for no read-around, the pages no
// longer mapped leave the page cache, its writable data is left alone,
// and the process goes on running the code it just unmapped.
func TestTrim(t *testing.T) {
	// The whole binary in the page cache, written back (eviction spares
	// dirty pages, and a test binary may just have been written).
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	if err := exe.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, exe); err != nil {
		t.Fatal(err)
	}
	cachedBefore := cached(t, exe)
	// No collection between the trim and the second reading: the GC's
	// own walk over type data would map pages back that the test did not
	// touch itself. One now, so its pages count before.
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	before := exeResident(t)
	if before.readOnly == 0 {
		t.Fatal("no resident read-only pages of the test binary before trimming")
	}
	res, err := Trim()
	if err != nil {
		t.Fatal(err)
	}
	if res.Mappings < 1 || res.Bytes <= 0 {
		t.Fatalf("Trim = %+v, want at least one mapping and some bytes dropped", res)
	}
	if res.Skipped < 1 {
		t.Fatalf("Trim = %+v, want the writable data mapping skipped", res)
	}
	if !res.Evicted {
		t.Fatalf("Trim = %+v, want the unmapped pages evicted", res)
	}
	cachedAfter := cached(t, exe)
	after := exeResident(t)
	t.Logf("read-only resident %d → %d KiB; writable %d → %d KiB; in the page cache %d → %d KiB; %+v",
		before.readOnly>>10, after.readOnly>>10, before.writable>>10, after.writable>>10, cachedBefore>>10, cachedAfter>>10, res)
	// What the process maps again stays cached, and so do 7–35 % of the
	// unmapped pages (by the load and the build; most likely the rest of
	// the large folios that mapped pages are in, which eviction cannot
	// split: not traced). Without eviction none goes.
	mapped := after.readOnly + after.writableFile
	if stale, unmapped := cachedAfter-mapped, cachedBefore-mapped; stale > unmapped*2/3 {
		t.Fatalf("%d KiB of the executable cached but not mapped after trimming, of %d KiB not mapped: want them evicted", stale>>10, unmapped>>10)
	}
	if after.notRandom > 0 {
		t.Fatalf("%d read-only mappings still read around their faults after trimming", after.notRandom)
	}
	if after.readOnly >= before.readOnly {
		t.Fatalf("read-only resident bytes %d after trimming, %d before", after.readOnly, before.readOnly)
	}
	if after.writable < before.writable/2 {
		t.Fatalf("writable data resident %d after, %d before: it must not be dropped", after.writable, before.writable)
	}
}

type resident struct {
	readOnly, writable int64
	writableFile       int64 // of writable: the file's pages, not private copies
	notRandom          int   // read-only mappings without MADV_RANDOM
}

func exeResident(t *testing.T) resident {
	t.Helper()
	maps, err := exeMappings()
	if err != nil {
		t.Fatal(err)
	}
	var r resident
	for _, m := range maps {
		if m.perms[1] == 'w' {
			r.writable += m.rss
			r.writableFile += m.rss - m.anonymous
		} else {
			r.readOnly += m.rss
			if !m.randomRead {
				r.notRandom++
			}
		}
	}
	return r
}

// cached is how many bytes of f are in the page cache (mincore over a
// fresh mapping of it, which reports the cache for a file the caller owns
// or may write).
func cached(t *testing.T, f *os.File) int64 {
	t.Helper()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	page := os.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * int64(page)
}

// TestTrimInMemory runs a copy of this test binary from tmpfs: its
// mappings are trimmed, its pages (the file itself) are not evicted.
func TestTrimInMemory(t *testing.T) {
	if os.Getenv("EXEPAGES_TRIM_CHILD") == "1" {
		res, err := Trim()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("trim: mappings=%d evicted=%v\n", res.Mappings, res.Evicted)
		return
	}
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Skipf("no tmpfs at /dev/shm (%v)", err)
	}
	dir, err := os.MkdirTemp("/dev/shm", "exepages-")
	if err != nil {
		t.Skipf("/dev/shm not writable: %v", err)
	}
	defer os.RemoveAll(dir)
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "exepages.test")
	if err := os.WriteFile(bin, self, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run", "^TestTrimInMemory$", "-test.v")
	cmd.Env = append(os.Environ(), "EXEPAGES_TRIM_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "trim: mappings=") || strings.Contains(string(out), "mappings=0 ") {
		t.Fatalf("child trimmed nothing:\n%s", out)
	}
	if !strings.Contains(string(out), "evicted=false") {
		t.Fatalf("child evicted an executable that lives in tmpfs:\n%s", out)
	}
}
