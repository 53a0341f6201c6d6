package hostinfo

// System memory from <proc>/meminfo and NUMA nodes from
// <sys>/devices/system/node.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Meminfo is system memory in bytes.
type Meminfo struct {
	Total, Free, Available, SwapTotal uint64
}

// API converts m to the wire type.
func (m Meminfo) API() api.MemoryInfo {
	return api.MemoryInfo{TotalBytes: m.Total, AvailableBytes: m.Available, FreeBytes: m.Free,
		SwapTotalBytes: m.SwapTotal, TotalMiB: int(m.Total >> 20), AvailableMiB: int(m.Available >> 20)}
}

// ReadMeminfo parses a /proc/meminfo file. MemAvailable (Linux >= 3.14)
// falls back to MemFree+Buffers+Cached on older kernels.
func ReadMeminfo(path string) (Meminfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Meminfo{}, fmt.Errorf("read meminfo: %w", err)
	}
	kv := parseKB(b, "")
	m := Meminfo{Total: kv["MemTotal"], Free: kv["MemFree"], SwapTotal: kv["SwapTotal"]}
	if v, ok := kv["MemAvailable"]; ok {
		m.Available = v
	} else {
		m.Available = kv["MemFree"] + kv["Buffers"] + kv["Cached"]
	}
	if _, ok := kv["MemTotal"]; !ok {
		return Meminfo{}, fmt.Errorf("meminfo %s: no MemTotal line", path)
	}
	return m, nil
}

// parseKB reads "Key: N kB" lines (after an optional per-line prefix such
// as "Node 0 "), in bytes.
func parseKB(b []byte, prefix string) map[string]uint64 {
	kv := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimPrefix(strings.TrimSpace(sc.Text()), prefix)
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && strings.EqualFold(f[1], "kB") {
			n <<= 10
		}
		kv[strings.TrimSpace(key)] = n
	}
	return kv
}

// ReadNUMANodes lists <sys>/devices/system/node/nodeN sorted by id. No
// directory (a kernel without NUMA) is an empty list.
func ReadNUMANodes(sysRoot string) ([]api.NUMANode, error) {
	root := join(sysRoot, "devices", "system", "node")
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return []api.NUMANode{}, nil
	}
	if err != nil {
		return []api.NUMANode{}, fmt.Errorf("list numa nodes: %w", err)
	}
	out := []api.NUMANode{}
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), "node")
		if !ok {
			continue
		}
		id, err := strconv.Atoi(s)
		if err != nil {
			continue
		}
		dir := filepath.Join(root, e.Name())
		n := api.NUMANode{ID: id}
		n.CPUs, _ = readTrim(filepath.Join(dir, "cpulist"))
		if b, err := os.ReadFile(filepath.Join(dir, "meminfo")); err == nil {
			n.TotalBytes = parseKB(b, "Node "+s+" ")["MemTotal"]
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
