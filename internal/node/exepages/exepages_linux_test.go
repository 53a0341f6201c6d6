package exepages

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestTrim trims this test binary's own pages: its read-only mappings'
// resident bytes fall, its writable data is left alone, and the process
// goes on running the code it just unmapped.
func TestTrim(t *testing.T) {
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
	after := exeResident(t)
	t.Logf("read-only resident %d → %d KiB; writable %d → %d KiB; %+v",
		before.readOnly>>10, after.readOnly>>10, before.writable>>10, after.writable>>10, res)
	if after.readOnly >= before.readOnly {
		t.Fatalf("read-only resident bytes %d after trimming, %d before", after.readOnly, before.readOnly)
	}
	if after.writable < before.writable/2 {
		t.Fatalf("writable data resident %d after, %d before: it must not be dropped", after.writable, before.writable)
	}
}

type resident struct{ readOnly, writable int64 }

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
		} else {
			r.readOnly += m.rss
		}
	}
	return r
}
