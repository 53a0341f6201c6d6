package hostinfo

// Block devices from <sys>/block, their stable names from
// <dev>/disk/by-id, and mounts from <proc>/self/mounts.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Mount is one line of /proc/self/mounts.
type Mount struct {
	Device, MountPoint, FSType string
}

// ReadMounts parses a /proc/mounts-format file (octal escapes decoded).
func ReadMounts(path string) ([]Mount, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	var out []Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		out = append(out, Mount{Device: unescapeMount(f[0]), MountPoint: unescapeMount(f[1]), FSType: f[2]})
	}
	return out, nil
}

// ReadMountInfo parses a /proc/<pid>/mountinfo file: unlike /proc/mounts
// it shows every mount of the process's namespace with the mount source
// after the " - " separator (octal escapes decoded).
func ReadMountInfo(path string) ([]Mount, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var out []Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(g) >= 2 {
			out = append(out, Mount{Device: unescapeMount(g[1]), MountPoint: unescapeMount(f[4]), FSType: g[0]})
		}
	}
	return out, sc.Err()
}

// ReadSwaps parses a /proc/swaps file into mounts with MountPoint "[swap]"
// and FSType "swap"; a missing file means no swap.
func ReadSwaps(path string) ([]Mount, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read swaps: %w", err)
	}
	var out []Mount
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 { // header: Filename Type Size Used Priority
			continue
		}
		out = append(out, Mount{Device: unescapeMount(f[0]), MountPoint: "[swap]", FSType: "swap"})
	}
	return out, nil
}

// unescapeMount decodes the \NNN octal escapes the kernel writes for
// spaces, tabs, newlines and backslashes.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// PseudoFS reports filesystem types that hold no user data (proc, sysfs,
// cgroups, tmpfs, ...); they are left out of the inventory. overlay stays:
// it is the root filesystem of a containerised agent.
func PseudoFS(fstype string) bool {
	switch fstype {
	case "proc", "sysfs", "devtmpfs", "devpts", "tmpfs", "ramfs", "cgroup", "cgroup2", "securityfs",
		"debugfs", "tracefs", "mqueue", "hugetlbfs", "pstore", "bpf", "configfs", "fusectl", "autofs",
		"binfmt_misc", "rpc_pipefs", "nsfs", "efivarfs", "squashfs", "selinuxfs", "fuse.lxcfs",
		"fuse.portal", "fuse.gvfsd-fuse", "nfsd", "rootfs", "swap", "none", "":
		return true
	}
	return false
}

var (
	nvmeNamespaceRE = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)
	// nvmePathRE matches the hidden per-path nodes of NVMe multipath.
	nvmePathRE   = regexp.MustCompile(`^nvme[0-9]+c[0-9]+n[0-9]+$`)
	pciAddressRE = regexp.MustCompile(`^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
)

// skipBlock reports virtual and stacked block devices that are not disks.
func skipBlock(name string) bool {
	for _, p := range []string{"loop", "ram", "zram", "fd", "sr", "dm-", "md", "nbd", "zd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// ScanBlock lists whole disks and NVMe namespaces, sorted by name. pci
// (from IndexPCI) supplies NUMA node and IOMMU group; mounts mark the
// namespaces in use. Paths in the result are the host's ("/dev/..."),
// whatever devRoot is.
func ScanBlock(ctx context.Context, sysRoot, devRoot string, mounts []Mount, pci map[string]PCIDev) ([]api.Disk, []api.NVMeNamespace, error) {
	disks, nvme := []api.Disk{}, []api.NVMeNamespace{}
	root := join(sysRoot, "block")
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return disks, nvme, nil
	}
	if err != nil {
		return disks, nvme, fmt.Errorf("list block devices: %w", err)
	}
	byID := ByIDLinks(devRoot)
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return disks, nvme, fmt.Errorf("scan block devices: %w", err)
		}
		name := e.Name()
		if skipBlock(name) || nvmePathRE.MatchString(name) {
			continue
		}
		dir := filepath.Join(root, name)
		d := api.Disk{Name: name, Path: "/dev/" + name, Kind: diskKind(name), NUMANode: -1}
		if sectors, err := readUint(filepath.Join(dir, "size")); err == nil {
			d.SizeBytes = sectors * 512
		}
		d.Model, _ = readTrim(filepath.Join(dir, "device", "model"))
		d.Serial, _ = readTrim(filepath.Join(dir, "device", "serial"))
		d.Rotational = readFlag(filepath.Join(dir, "queue", "rotational"))
		d.Removable = readFlag(filepath.Join(dir, "removable"))
		links := byID[name]
		d.ByIDPath = preferredByID(links)
		d.PCIAddress = pciAddressOf(dir)
		iommu := -1
		if fn, ok := pci[d.PCIAddress]; ok {
			d.NUMANode, iommu = fn.NUMANode, fn.IOMMUGroup
		}
		disks = append(disks, d)
		if !nvmeNamespaceRE.MatchString(name) {
			continue
		}
		ns := api.NVMeNamespace{Name: name, Controller: name[:strings.LastIndexByte(name, 'n')], Path: d.Path,
			ByIDPath: d.ByIDPath, ByIDLinks: []string{}, SizeBytes: d.SizeBytes, Model: d.Model, Serial: d.Serial,
			PCIAddress: d.PCIAddress, NUMANode: d.NUMANode, MountPoints: []string{}, Holders: holders(dir, name)}
		if iommu >= 0 {
			ns.IOMMUGroup = &iommu
		}
		for _, l := range links {
			ns.ByIDLinks = append(ns.ByIDLinks, "/dev/disk/by-id/"+l)
		}
		ns.MountPoints = mountPointsOf(name, partitions(dir, name), mounts)
		nvme = append(nvme, ns)
	}
	return disks, nvme, nil
}

func diskKind(name string) string {
	switch {
	case strings.HasPrefix(name, "nvme"):
		return "nvme"
	case strings.HasPrefix(name, "sd"):
		return "scsi"
	case strings.HasPrefix(name, "vd"):
		return "virtio"
	}
	return "other"
}

// pciAddressOf is the last PCI address on the resolved sysfs path of a
// block device (the NVMe controller's function), "" for virtual devices.
func pciAddressOf(blockDir string) string {
	real, err := filepath.EvalSymlinks(blockDir)
	if err != nil {
		return ""
	}
	addr := ""
	for _, el := range strings.Split(filepath.ToSlash(real), "/") {
		if pciAddressRE.MatchString(el) {
			addr = el
		}
	}
	return addr
}

// partitions are the <name>pN / <name>N subdirectories of a block device.
func partitions(dir, name string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), name) && e.Name() != name {
			out = append(out, e.Name())
		}
	}
	return out
}

// holders lists devices stacked on a disk or any of its partitions.
func holders(dir, name string) []string {
	out := []string{}
	for _, d := range append([]string{dir}, prefixAll(dir, partitions(dir, name))...) {
		ents, _ := os.ReadDir(filepath.Join(d, "holders"))
		for _, e := range ents {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

func prefixAll(dir string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = filepath.Join(dir, n)
	}
	return out
}

func mountPointsOf(name string, parts []string, mounts []Mount) []string {
	devs := map[string]bool{"/dev/" + name: true}
	for _, p := range parts {
		devs["/dev/"+p] = true
	}
	out := []string{}
	for _, m := range mounts {
		if devs[m.Device] {
			out = append(out, m.MountPoint)
		}
	}
	sort.Strings(out)
	return out
}

// ByIDLinks maps block device names to the names of the <dev>/disk/by-id
// links that point at them, sorted.
func ByIDLinks(devRoot string) map[string][]string {
	dir := join(devRoot, "disk", "by-id")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	m := map[string][]string{}
	for _, e := range ents {
		if t := linkBase(filepath.Join(dir, e.Name())); t != "" {
			m[t] = append(m[t], e.Name())
		}
	}
	for _, v := range m {
		sort.Strings(v)
	}
	return m
}

// byIDRank orders by-id link kinds from most to least stable: namespace
// identifiers (EUI-64, NGUID/UUID, WWN) before model_serial names.
func byIDRank() []string {
	return []string{"nvme-eui.", "nvme-uuid.", "wwn-", "nvme-nvme.", "nvme-", "scsi-3", "ata-", "scsi-", "virtio-"}
}

// preferredByID picks the most stable link, ties broken by name; "" when
// there is none. The result is the host path /dev/disk/by-id/<link>.
func preferredByID(links []string) string {
	ranks := byIDRank()
	best, bestRank := "", len(ranks)+1
	for _, l := range links {
		r := len(ranks)
		for i, p := range ranks {
			if strings.HasPrefix(l, p) {
				r = i
				break
			}
		}
		if r < bestRank || (r == bestRank && l < best) {
			best, bestRank = l, r
		}
	}
	if best == "" {
		return ""
	}
	return "/dev/disk/by-id/" + best
}

func readUint(path string) (uint64, error) {
	s, err := readTrim(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

func readFlag(path string) bool {
	s, err := readTrim(path)
	return err == nil && s == "1"
}
