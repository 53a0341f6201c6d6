package hostinfo

// CPU facts from <proc>/cpuinfo and <sys>/devices/system/cpu.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// cpuinfoEntry is one "processor" block of /proc/cpuinfo.
type cpuinfoEntry map[string]string

func parseCPUInfo(b []byte) []cpuinfoEntry {
	var out []cpuinfoEntry
	cur := cpuinfoEntry{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20) // flags lines are long
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = cpuinfoEntry{}
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		cur[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// armImplementers names the common ARM implementer codes.
func armImplementer(code string) string {
	switch strings.ToLower(code) {
	case "0x41":
		return "ARM"
	case "0x42":
		return "Broadcom"
	case "0x48":
		return "HiSilicon"
	case "0x4e":
		return "NVIDIA"
	case "0x51":
		return "Qualcomm"
	case "0x61":
		return "Apple"
	case "0xc0":
		return "Ampere"
	}
	return "implementer " + code
}

// ReadCPU reads model, vendor, topology and virtualisation flags. Topology
// comes from sysfs when it is there and from cpuinfo otherwise.
func ReadCPU(procRoot, sysRoot string) (api.CPUInfo, error) {
	b, err := os.ReadFile(join(procRoot, "cpuinfo"))
	if err != nil {
		return api.CPUInfo{Virtualization: []string{}}, fmt.Errorf("read cpuinfo: %w", err)
	}
	entries := parseCPUInfo(b)
	cpu := api.CPUInfo{Virtualization: []string{}}
	var flags map[string]bool
	type coreKey struct{ pkg, core string }
	pkgs, cores := map[string]bool{}, map[coreKey]bool{}
	threads := 0
	for _, e := range entries {
		if _, ok := e["processor"]; !ok {
			continue // arm's trailing "Hardware"/"Revision" block
		}
		threads++
		if cpu.Model == "" {
			cpu.Model = firstNonEmpty(e["model name"], e["Model"], e["cpu model"])
			if cpu.Model == "" && e["CPU implementer"] != "" {
				cpu.Model = strings.TrimSpace(armImplementer(e["CPU implementer"]) + " part " + e["CPU part"])
			}
			cpu.Vendor = e["vendor_id"]
		}
		if flags == nil {
			flags = map[string]bool{}
			for _, f := range strings.Fields(firstNonEmpty(e["flags"], e["Features"])) {
				flags[f] = true
			}
		}
		if p, ok := e["physical id"]; ok {
			pkgs[p] = true
			cores[coreKey{p, e["core id"]}] = true
		}
	}
	if cpu.Model == "" {
		for _, e := range entries {
			if m := firstNonEmpty(e["Model"], e["Hardware"]); m != "" {
				cpu.Model = m
				break
			}
		}
	}
	for _, f := range []string{"vmx", "svm"} {
		if flags[f] {
			cpu.Virtualization = append(cpu.Virtualization, f)
		}
	}
	cpu.Hypervisor = flags["hypervisor"]
	cpu.Threads, cpu.Cores, cpu.Sockets = threads, len(cores), len(pkgs)
	if t, c, s, ok := sysTopology(sysRoot); ok {
		cpu.Threads, cpu.Cores, cpu.Sockets = t, c, s
	}
	if cpu.Sockets == 0 && cpu.Threads > 0 {
		cpu.Sockets = 1
	}
	if cpu.Cores == 0 {
		cpu.Cores = cpu.Threads
	}
	return cpu, nil
}

// sysTopology counts online CPUs, cores and packages from
// <sys>/devices/system/cpu/cpuN/topology.
func sysTopology(sysRoot string) (threads, cores, sockets int, ok bool) {
	dirs, _ := filepath.Glob(join(sysRoot, "devices", "system", "cpu", "cpu[0-9]*"))
	type coreKey struct{ pkg, core string }
	pkgs, cs := map[string]bool{}, map[coreKey]bool{}
	for _, d := range dirs {
		pkg, err1 := readTrim(filepath.Join(d, "topology", "physical_package_id"))
		core, err2 := readTrim(filepath.Join(d, "topology", "core_id"))
		if err1 != nil || err2 != nil {
			continue // offline CPUs have no topology
		}
		threads++
		pkgs[pkg] = true
		cs[coreKey{pkg, core}] = true
	}
	return threads, len(cs), len(pkgs), threads > 0
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}
