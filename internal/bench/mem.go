package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// procStatusKB reads a "Name:   123 kB" field of /proc/<pid>/status
// (pid "self" for this process) in bytes.
func procStatusKB(pid, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return v * 1024, nil
	}
	return 0, fmt.Errorf("/proc/%s/status: no %s", pid, field)
}

// procCPU is the user+system CPU time of pid in seconds (Linux, USER_HZ=100).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may contain spaces; fields after ")" are fixed.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

// stealS is the CPU time the hypervisor gave to other guests since boot,
// all CPUs together, in seconds (the steal column of /proc/stat; 0 where
// there is none). On a shared VM it tells a slow run from a slow build.
func stealS() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line)) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	v, _ := strconv.ParseFloat(f[8], 64)
	return v / 100
}

// selfMem measures this process after a full GC, with the memory the
// runtime freed handed back to the OS so RSS reflects live data.
func selfMem() MemSample {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, _ := procStatusKB("self", "VmRSS")
	return MemSample{RSSBytes: rss, HeapInuseBytes: int64(ms.HeapInuse), StackInuseBytes: int64(ms.StackInuse),
		Goroutines: int64(runtime.NumGoroutine())}
}

// childMem measures the control-plane child: RSS from /proc and the Go
// runtime figures from its Prometheus endpoint.
func childMem(ctx context.Context, pid int, metricsURL string) (MemSample, error) {
	rss, err := procStatusKB(strconv.Itoa(pid), "VmRSS")
	if err != nil {
		return MemSample{}, err
	}
	s := MemSample{RSSBytes: rss}
	m, err := scrapeMetrics(ctx, metricsURL)
	s.HeapInuseBytes = int64(m["go_memstats_heap_inuse_bytes"])
	s.StackInuseBytes = int64(m["go_memstats_stack_inuse_bytes"])
	s.Goroutines = int64(m["go_goroutines"])
	return s, err
}

// runtimeCounters are the child's cumulative Go runtime counters.
type runtimeCounters struct {
	gcCycles, gcPauseS, mallocs, allocBytes float64
}

// childRuntime reads the child's GC and allocation counters from its
// Prometheus endpoint.
func childRuntime(ctx context.Context, metricsURL string) (runtimeCounters, error) {
	m, err := scrapeMetrics(ctx, metricsURL)
	return runtimeCounters{gcCycles: m["go_gc_duration_seconds_count"], gcPauseS: m["go_gc_duration_seconds_sum"],
		mallocs: m["go_memstats_mallocs_total"], allocBytes: m["go_memstats_alloc_bytes_total"]}, err
}

// scrapeMetrics reads the unlabelled samples of a Prometheus text endpoint.
func scrapeMetrics(ctx context.Context, metricsURL string) (map[string]float64, error) {
	m := map[string]float64{}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return m, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			m[name] = v
		}
	}
	return m, sc.Err()
}

// machine describes this host.
func machine() Machine {
	m := Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), LoadAvgStart: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && k == "MemTotal" {
				f := strings.Fields(v)
				if len(f) > 0 {
					m.MemTotalKB, _ = strconv.ParseInt(f[0], 10, 64)
				}
				break
			}
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
