package guestssh

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// ProbeLimits bound the performance probe; the zero value means
// DefaultProbeLimits.
type ProbeLimits struct {
	// CPULoopIterations is the awk busy loop's length.
	CPULoopIterations int
	// MemoryMiB is what dd copies from /dev/zero to /dev/null.
	MemoryMiB int
	// DiskMiB is what dd writes (conv=fsync) to a temporary file in the
	// first writable of /var/tmp, /tmp and the user's home, removed
	// afterwards.
	DiskMiB int
}

// DefaultProbeLimits keep the probe to seconds even under TCG.
var DefaultProbeLimits = ProbeLimits{CPULoopIterations: 100000, MemoryMiB: 256, DiskMiB: 32}

// Probe is the performance probe's figures, each with its unit in its
// name. A figure the guest could not measure is 0 and named in Skipped.
// Elapsed times come from the guest's clock (/proc/uptime, 10 ms
// resolution); an interval below the resolution counts as 10 ms, so a
// throughput is then a lower bound.
type Probe struct {
	CPULoopIterations int      `json:"cpu_loop_iterations"`
	CPULoopMS         int64    `json:"cpu_loop_ms"`
	CPUIterationsPerS float64  `json:"cpu_iterations_per_s"`
	MemoryCopiedMiB   int      `json:"memory_copied_mib"`
	MemoryMS          int64    `json:"memory_ms"`
	MemoryMiBPerS     float64  `json:"memory_mib_per_s"`
	DiskWrittenMiB    int      `json:"disk_written_mib"`
	DiskMS            int64    `json:"disk_ms"`
	DiskWriteMiBPerS  float64  `json:"disk_write_mib_per_s"`
	DiskPath          string   `json:"disk_path,omitempty"`
	GPUsVisible       int      `json:"gpus_visible"`
	GPUs              []string `json:"gpus"`
	GPUSource         string   `json:"gpu_source"`
	Skipped           []string `json:"skipped"`
}

func (l ProbeLimits) withDefaults() ProbeLimits {
	if l.CPULoopIterations <= 0 {
		l.CPULoopIterations = DefaultProbeLimits.CPULoopIterations
	}
	if l.MemoryMiB <= 0 {
		l.MemoryMiB = DefaultProbeLimits.MemoryMiB
	}
	if l.DiskMiB <= 0 {
		l.DiskMiB = DefaultProbeLimits.DiskMiB
	}
	return l
}

// probeScript times each part with /proc/uptime (centiseconds).
func probeScript(l ProbeLimits) string {
	return fmt.Sprintf(`
cs() { awk '{printf "%%d\n", $1*100}' /proc/uptime; }
t0=$(cs); awk -v n=%d 'BEGIN{for(i=0;i<n;i++)s+=i*2; print "cpu_sum=" s}'; t1=$(cs)
echo "cpu_cs=$((t1-t0))"
if command -v dd >/dev/null 2>&1; then
	t0=$(cs); dd if=/dev/zero of=/dev/null bs=1048576 count=%d 2>/dev/null && { t1=$(cs); echo "mem_cs=$((t1-t0))"; }
	d=
	for c in /var/tmp /tmp "$HOME"; do
		if [ -d "$c" ] && [ -w "$c" ]; then d=$c; break; fi
	done
	[ -n "$d" ] && f=$(mktemp "$d/drover-probe.XXXXXX") && {
		t0=$(cs); dd if=/dev/zero of="$f" bs=1048576 count=%d conv=fsync 2>/dev/null && { t1=$(cs); echo "disk_cs=$((t1-t0))"; echo "disk_path=$d"; }
		rm -f "$f"
	}
fi
if command -v nvidia-smi >/dev/null 2>&1; then
	echo "gpu_source=nvidia-smi"
	nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu=/'
else
	echo "gpu_source=dev"
	ls /dev/ 2>/dev/null | grep '^nvidia[0-9][0-9]*$' | sed 's/^/gpu=/'
fi
`, l.CPULoopIterations, l.MemoryMiB, l.DiskMiB)
}

// RunProbe runs the bounded probe over c (ctx bounds it as a whole).
func RunProbe(ctx context.Context, c *Conn, l ProbeLimits) (Probe, error) {
	l = l.withDefaults()
	out, err := c.Run(ctx, probeScript(l))
	if err != nil {
		return Probe{}, fmt.Errorf("guest performance probe: %w", err)
	}
	return ParseProbe(out, l), nil
}

// ParseProbe reads probeScript's output for limits l.
func ParseProbe(out []byte, l ProbeLimits) Probe {
	l = l.withDefaults()
	p := Probe{GPUs: []string{}, Skipped: []string{}}
	elapsed := func(v string) (int64, bool) {
		cs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || cs < 0 {
			return 0, false
		}
		return max(cs, 1) * 10, true
	}
	perS := func(n float64, ms int64) float64 { return float64(int64(n*1000/float64(ms)*10)) / 10 }
	var gpus []string
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && k == "gpu" {
			gpus = append(gpus, strings.TrimSpace(v))
		}
	}
	kv := keyValues(out)
	if ms, ok := elapsed(kv["cpu_cs"]); ok && kv["cpu_sum"] != "" {
		p.CPULoopIterations, p.CPULoopMS = l.CPULoopIterations, ms
		p.CPUIterationsPerS = perS(float64(l.CPULoopIterations), ms)
	} else {
		p.Skipped = append(p.Skipped, "cpu: awk busy loop did not run")
	}
	if ms, ok := elapsed(kv["mem_cs"]); ok {
		p.MemoryCopiedMiB, p.MemoryMS, p.MemoryMiBPerS = l.MemoryMiB, ms, perS(float64(l.MemoryMiB), ms)
	} else {
		p.Skipped = append(p.Skipped, "memory: no dd in the guest, or dd failed")
	}
	if ms, ok := elapsed(kv["disk_cs"]); ok {
		p.DiskWrittenMiB, p.DiskMS, p.DiskWriteMiBPerS = l.DiskMiB, ms, perS(float64(l.DiskMiB), ms)
		p.DiskPath = kv["disk_path"]
	} else {
		p.Skipped = append(p.Skipped, "disk: no dd, or no writable /var/tmp, /tmp or home in the guest")
	}
	p.GPUSource = kv["gpu_source"]
	if gpus != nil {
		p.GPUs = gpus
	}
	p.GPUsVisible = len(p.GPUs)
	return p
}
