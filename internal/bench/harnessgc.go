package bench

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// harnessGCHeadroom is how far the harness's heap may grow during the
// heartbeat phase before its garbage collector runs at all.
const harnessGCHeadroom = 4 << 30

// pauseHarnessGC collects once and then turns this process's garbage
// collector off, bounded by a memory limit of the live heap plus
// harnessGCHeadroom (a quarter of the machine's memory at most), until the
// returned function restores both and reports how many collections ran
// meanwhile.
//
// The harness holds every simulated agent's connection, client and
// goroutine in one heap: at 19,000 agents its collections took whole
// seconds of its share of the cores and stalled thousands of agents at
// once, which the heartbeat latency counted as the server's (a real
// agent is a process of its own with a heap of a few megabytes).
// The server's collector is left as it is.
func pauseHarnessGC(memTotalKB int64) (restore func() HarnessGC) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	headroom := int64(harnessGCHeadroom)
	if memTotalKB > 0 {
		headroom = min(headroom, memTotalKB<<10/4)
	}
	limit := int64(ms.HeapAlloc) + headroom
	percent := debug.SetGCPercent(-1)
	oldLimit := debug.SetMemoryLimit(limit)
	cycles := ms.NumGC
	return func() HarnessGC {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(oldLimit)
		runtime.ReadMemStats(&ms)
		return HarnessGC{Mode: fmt.Sprintf("off during the phase, memory limit %.1f GiB", float64(limit)/(1<<30)),
			Cycles: ms.NumGC - cycles}
	}
}
