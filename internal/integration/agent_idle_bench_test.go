package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// BenchmarkAgentIdle measures issue 19's agent target (idle RSS ≤ 15 MB,
// CPU ≤ 0.2 % of a core at 5 s heartbeats): a real drover-agent process,
// enrolled to an in-process control plane that tells it 5 s heartbeats,
// left idle (no tasks, no instances) and sampled from /proc over
// DROVER_BENCH_IDLE (default 60s) once it is healthy and has reported its
// capacity plus 10 s: VmRSS at the end and its largest 5-second sample in
// the window, VmHWM (the peak since start), and
// utime+stime over the window as a percentage of one core; RssAnon (the
// private part) is reported too. GOMEMLIMIT in the environment reaches the
// agent (the figures with and without a soft limit). Variants: no
// runtime, and the QEMU runtime (its reconcile loop, accelerator verdict
// under TCG) with no instances. The agent is built as scripts/release
// builds it (static, stripped), or DROVER_BENCH_AGENT_BIN names a binary
// (another commit's, for a comparison). docs/performance.md has the
// figures.
//
//	go test ./internal/integration -run '^$' -bench BenchmarkAgentIdle -benchtime 1x -v
func BenchmarkAgentIdle(b *testing.B) {
	window := time.Minute
	if v := os.Getenv("DROVER_BENCH_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("DROVER_BENCH_IDLE: %v", err)
		}
		window = d
	}
	bin := os.Getenv("DROVER_BENCH_AGENT_BIN")
	if bin == "" {
		bin = filepath.Join(b.TempDir(), "drover-agent")
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "../../cmd/drover-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("go build: %v\n%s", err, out)
		}
	}
	for _, rt := range []string{"none", "qemu"} {
		b.Run("runtime="+rt, func(b *testing.B) {
			for range b.N {
				rss, hwm, cpu := agentIdle(b, bin, rt, window)
				b.ReportMetric(float64(rss)/1024, "rss_MiB")
				b.ReportMetric(float64(hwm)/1024, "hwm_MiB")
				b.ReportMetric(cpu, "cpu_%")
				b.Logf("agent idle, runtime %s, %v: VmRSS %d KiB, VmHWM %d KiB, CPU %.3f %% of a core", rt, window, rss, hwm, cpu)
			}
		})
	}
}

// agentIdle runs one agent and samples it; rss and hwm in KiB.
func agentIdle(b *testing.B, bin, rt string, window time.Duration) (rss, hwm int64, cpu float64) {
	e := startEnv(b, openSQLite(b), func(c *server.Config) { c.HeartbeatInterval = 5 * time.Second })
	host := "idle-" + rt
	bt := e.createHost(host)
	dir := b.TempDir()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "NODE_AGENT_ENV_FILE=/dev/null",
		"NODE_AGENT_CONTROL_PLANE_URL="+e.nodeURL, "NODE_AGENT_HOST_ID="+host,
		"NODE_AGENT_BOOTSTRAP_TOKEN="+bt.Token, "NODE_AGENT_CA_HASH="+e.srv.CAHash(),
		"NODE_AGENT_STATE_DIR="+filepath.Join(dir, "state"), "NODE_AGENT_LISTEN=127.0.0.1:0",
		"NODE_AGENT_RUNTIME="+rt, "NODE_AGENT_RUNTIME_DIR="+filepath.Join(dir, "rt"), "NODE_AGENT_QEMU_ACCEL=tcg",
		"NODE_AGENT_QEMU_CGROUP_PARENT=none")
	log, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	e.waitHostStatus(host, api.HostHealthy, 2*time.Minute)
	waitCapacity(b, e, host)
	time.Sleep(10 * time.Second) // start-up work (enrolment, probes, first reports) settles
	pid := cmd.Process.Pid
	t0, c0 := time.Now(), procCPUTicks(b, pid)
	// VmRSS every 5 s: the largest in the window counts as much as the
	// last (the agent re-reads the host, and hands back start-up pages,
	// every 5 minutes; RSS grows back in between).
	var peak int64
	for end := t0.Add(window); time.Now().Before(end); {
		time.Sleep(min(5*time.Second, time.Until(end)))
		peak = max(peak, procStatusKiB(b, pid, "VmRSS:"))
	}
	elapsed, c1 := time.Since(t0), procCPUTicks(b, pid)
	rss, hwm = procStatusKiB(b, pid, "VmRSS:"), procStatusKiB(b, pid, "VmHWM:")
	anon := procStatusKiB(b, pid, "RssAnon:")
	file := procStatusKiB(b, pid, "RssFile:")
	b.ReportMetric(float64(anon)/1024, "anon_MiB")
	b.ReportMetric(float64(file)/1024, "file_MiB")
	b.ReportMetric(float64(peak)/1024, "rss_max_MiB")
	b.Logf("of VmRSS: RssAnon %d KiB (heap, stacks), RssFile %d KiB (the binary's pages, shared and reclaimable); largest VmRSS in the window %d KiB",
		anon, file, peak)
	const userHZ = 100 // USER_HZ, the unit of /proc/<pid>/stat's times on Linux
	cpu = float64(c1-c0) / userHZ / elapsed.Seconds() * 100
	return rss, hwm, cpu
}

// procCPUTicks is utime+stime of pid, in USER_HZ ticks.
func procCPUTicks(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command (in parentheses, which may hold spaces):
	// state is field 3, utime 14 and stime 15.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return ut + st
}

// procStatusKiB is a "Vm...:  N kB" line of /proc/<pid>/status.
func procStatusKiB(b *testing.B, pid int, key string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("%s %q", key, line)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}
