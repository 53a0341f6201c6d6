package guestssh

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Telemetry is what the guest reports of itself (Collect).
type Telemetry struct {
	// Ready: the last collection succeeded; Error says why not.
	Ready         bool      `json:"ready"`
	Error         string    `json:"error,omitempty"`
	CollectedAt   time.Time `json:"collected_at"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	Load1         float64   `json:"load1"`
	Load5         float64   `json:"load5"`
	Load15        float64   `json:"load15"`
	// MemoryTotalBytes and MemoryAvailableBytes are /proc/meminfo's
	// MemTotal and MemAvailable.
	MemoryTotalBytes     int64 `json:"memory_total_bytes"`
	MemoryAvailableBytes int64 `json:"memory_available_bytes"`
	CPUs                 int   `json:"cpus"`
	// GPUs is what nvidia-smi -L lists when the guest has nvidia-smi
	// (GPUSource "nvidia-smi"), else the number of /dev/nvidia<N> device
	// nodes (GPUSource "dev").
	GPUs      int    `json:"gpus"`
	GPUSource string `json:"gpu_source"`
}

// telemetryScript reads procfs and counts GPUs; it needs no privilege.
const telemetryScript = `
echo "uptime=$(cut -d' ' -f1 /proc/uptime)"
echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
awk '/^MemTotal:/{print "mem_total_kib=" $2} /^MemAvailable:/{print "mem_available_kib=" $2}' /proc/meminfo
echo "cpus=$(grep -c '^processor' /proc/cpuinfo)"
if command -v nvidia-smi >/dev/null 2>&1; then
	echo "gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"; echo "gpu_source=nvidia-smi"
else
	echo "gpus=$(ls /dev/ 2>/dev/null | grep -c '^nvidia[0-9][0-9]*$')"; echo "gpu_source=dev"
fi
`

// Collect reads the guest's telemetry over c, bounded by ctx.
func Collect(ctx context.Context, c *Conn, now time.Time) (Telemetry, error) {
	out, err := c.Run(ctx, telemetryScript)
	if err != nil {
		return Telemetry{CollectedAt: now, Error: err.Error()}, fmt.Errorf("guest telemetry: %w", err)
	}
	t, err := ParseTelemetry(out)
	t.CollectedAt = now
	if err != nil {
		t.Error = err.Error()
		return t, err
	}
	t.Ready = true
	return t, nil
}

// ParseTelemetry reads telemetryScript's key=value lines.
func ParseTelemetry(out []byte) (Telemetry, error) {
	kv := keyValues(out)
	var t Telemetry
	var errs []string
	num := func(key string, f func(string) error) {
		if v, ok := kv[key]; !ok {
			errs = append(errs, key+" missing")
		} else if err := f(v); err != nil {
			errs = append(errs, fmt.Sprintf("%s %q: %v", key, v, err))
		}
	}
	num("uptime", func(v string) (err error) { t.UptimeSeconds, err = strconv.ParseFloat(v, 64); return })
	num("loadavg", func(v string) error {
		f := strings.Fields(v)
		if len(f) != 3 {
			return fmt.Errorf("want 3 fields")
		}
		var err [3]error
		t.Load1, err[0] = strconv.ParseFloat(f[0], 64)
		t.Load5, err[1] = strconv.ParseFloat(f[1], 64)
		t.Load15, err[2] = strconv.ParseFloat(f[2], 64)
		for _, e := range err {
			if e != nil {
				return e
			}
		}
		return nil
	})
	num("mem_total_kib", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		t.MemoryTotalBytes = n << 10
		return err
	})
	num("mem_available_kib", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		t.MemoryAvailableBytes = n << 10
		return err
	})
	num("cpus", func(v string) (err error) { t.CPUs, err = strconv.Atoi(v); return })
	num("gpus", func(v string) (err error) { t.GPUs, err = strconv.Atoi(v); return })
	t.GPUSource = kv["gpu_source"]
	if len(errs) > 0 {
		return t, fmt.Errorf("guest telemetry: %s", strings.Join(errs, "; "))
	}
	return t, nil
}

// keyValues reads key=value lines (the first "=" splits).
func keyValues(out []byte) map[string]string {
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
			kv[k] = strings.TrimSpace(v)
		}
	}
	return kv
}
