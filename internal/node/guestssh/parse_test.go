package guestssh

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestParseTelemetry(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want Telemetry
		err  string
	}{
		{"full", "uptime=12.34\nloadavg=0.50 0.25 0.10\nmem_total_kib=246000\nmem_available_kib=200000\ncpus=2\ngpus=1\ngpu_source=nvidia-smi\n",
			Telemetry{UptimeSeconds: 12.34, Load1: 0.5, Load5: 0.25, Load15: 0.1, MemoryTotalBytes: 246000 << 10,
				MemoryAvailableBytes: 200000 << 10, CPUs: 2, GPUs: 1, GPUSource: "nvidia-smi"}, ""},
		{"missing memavailable", "uptime=1\nloadavg=0 0 0\nmem_total_kib=1\ncpus=1\ngpus=0\ngpu_source=dev\n",
			Telemetry{UptimeSeconds: 1, MemoryTotalBytes: 1024, CPUs: 1, GPUSource: "dev"}, "mem_available_kib missing"},
		{"garbage load", "uptime=1\nloadavg=x\nmem_total_kib=1\nmem_available_kib=1\ncpus=1\ngpus=0\n",
			Telemetry{}, `loadavg "x"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTelemetry([]byte(tc.out))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseProbe(t *testing.T) {
	l := ProbeLimits{CPULoopIterations: 1000, MemoryMiB: 100, DiskMiB: 10}
	tests := []struct {
		name                 string
		out                  string
		cpuMS, memMS, diskMS int64
		memRate, diskRate    float64
		gpus                 []string
		skipped              int
	}{
		{"all parts", "cpu_sum=1\ncpu_cs=50\nmem_cs=20\ndisk_cs=100\ndisk_path=/tmp\ngpu_source=nvidia-smi\ngpu=NVIDIA H100, 81559 MiB\n",
			500, 200, 1000, 500, 10, []string{"NVIDIA H100, 81559 MiB"}, 0},
		{"below the clock's resolution", "cpu_sum=1\ncpu_cs=0\nmem_cs=0\ndisk_cs=0\ngpu_source=dev\n",
			10, 10, 10, 10000, 1000, []string{}, 0},
		{"no dd", "cpu_sum=1\ncpu_cs=3\ngpu_source=dev\ngpu=nvidia0\ngpu=nvidia1\n", 30, 0, 0, 0, 0, []string{"nvidia0", "nvidia1"}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := ParseProbe([]byte(tc.out), l)
			if p.CPULoopMS != tc.cpuMS || p.MemoryMS != tc.memMS || p.DiskMS != tc.diskMS || p.MemoryMiBPerS != tc.memRate ||
				p.DiskWriteMiBPerS != tc.diskRate || !slices.Equal(p.GPUs, tc.gpus) || p.GPUsVisible != len(tc.gpus) ||
				len(p.Skipped) != tc.skipped {
				t.Fatalf("got %+v", p)
			}
		})
	}
}

// TestScriptsParse runs every script through sh -n, and the telemetry
// and probe scripts for real on this host (they need no privilege).
func TestScriptsParse(t *testing.T) {
	scripts := map[string]string{
		"provision":   provisionScript(UserRequest{AllocationID: "a1", Username: "o'neil", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA x", "ssh-ed25519 BBBB y"}}),
		"deprovision": deprovisionScript("a1", "bob", true),
		"telemetry":   telemetryScript,
		"probe":       probeScript(ProbeLimits{CPULoopIterations: 10, MemoryMiB: 1, DiskMiB: 1}),
	}
	for name, s := range scripts {
		if out, err := exec.Command("sh", "-n", "-c", s).CombinedOutput(); err != nil {
			t.Errorf("%s: sh -n: %v: %s", name, err, out)
		}
	}
	out, err := exec.Command("sh", "-c", telemetryScript).Output()
	if err != nil {
		t.Fatal(err)
	}
	if tel, err := ParseTelemetry(out); err != nil || tel.CPUs < 1 || tel.MemoryTotalBytes <= 0 {
		t.Errorf("telemetry on this host: %+v, %v", tel, err)
	}
	out, err = exec.Command("sh", "-c", scripts["probe"]).Output()
	if err != nil {
		t.Fatal(err)
	}
	if p := ParseProbe(out, ProbeLimits{CPULoopIterations: 10, MemoryMiB: 1, DiskMiB: 1}); len(p.Skipped) != 0 || p.DiskWrittenMiB != 1 {
		t.Errorf("probe on this host: %+v", p)
	}
}
