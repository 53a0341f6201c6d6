package hostinfo

// NVIDIA GPU detail (model, memory, driver, UUID): NVML when built with the
// "nvml" tag and cgo (nvml.go), else nvidia-smi through the Runner.

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// NVIDIAGPU is what NVML or nvidia-smi reports for one GPU.
type NVIDIAGPU struct {
	Index         int
	Name          string
	MemoryMiB     int
	DriverVersion string
	UUID          string
	PCIAddress    string // normalised: "0000:3b:00.0"
	Source        string // "nvml" | "nvidia-smi"
}

// NvidiaSMIArgs are the arguments of the one nvidia-smi query hostinfo runs.
func NvidiaSMIArgs() []string {
	return []string{"--query-gpu=index,name,memory.total,driver_version,uuid,pci.bus_id", "--format=csv,noheader,nounits"}
}

// QueryNvidiaSMI runs nvidia-smi through run and parses its answer.
func QueryNvidiaSMI(ctx context.Context, run Runner) ([]NVIDIAGPU, error) {
	out, err := run(ctx, "nvidia-smi", NvidiaSMIArgs()...)
	if err != nil {
		return nil, err
	}
	return ParseNvidiaSMI(out)
}

// ParseNvidiaSMI parses the CSV of NvidiaSMIArgs. "[N/A]"-style values
// become empty or zero.
func ParseNvidiaSMI(out []byte) ([]NVIDIAGPU, error) {
	r := csv.NewReader(strings.NewReader(string(out)))
	r.TrimLeadingSpace = true
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("parse nvidia-smi output: %w", err)
	}
	var gpus []NVIDIAGPU
	for _, rec := range recs {
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if len(rec) != 6 {
			return nil, fmt.Errorf("parse nvidia-smi output: want 6 fields, got %d in %q", len(rec), strings.Join(rec, ","))
		}
		for i := range rec {
			rec[i] = smiValue(rec[i])
		}
		g := NVIDIAGPU{Name: rec[1], DriverVersion: rec[3], UUID: rec[4], PCIAddress: NormalizePCIAddress(rec[5]),
			Source: "nvidia-smi"}
		if g.Index, err = strconv.Atoi(rec[0]); err != nil {
			return nil, fmt.Errorf("parse nvidia-smi output: index %q: %w", rec[0], err)
		}
		if rec[2] != "" {
			mem, err := strconv.ParseFloat(rec[2], 64)
			if err != nil {
				return nil, fmt.Errorf("parse nvidia-smi output: memory.total %q: %w", rec[2], err)
			}
			g.MemoryMiB = int(mem)
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}

func smiValue(s string) string {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") { // [N/A], [Not Supported]
		return ""
	}
	return s
}

// NormalizePCIAddress turns nvidia-smi's and NVML's "00000000:3B:00.0" into
// sysfs's "0000:3b:00.0"; other input is lower-cased.
func NormalizePCIAddress(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return s
	}
	n, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", n, rest)
}

// nvidiaGPUs asks NVML (when built in) and falls back to nvidia-smi.
func nvidiaGPUs(ctx context.Context, nvml func(context.Context) ([]NVIDIAGPU, error), run Runner) ([]NVIDIAGPU, error) {
	gpus, nvmlErr := nvml(ctx)
	if nvmlErr == nil {
		return gpus, nil
	}
	gpus, err := QueryNvidiaSMI(ctx, run)
	if err != nil && !errors.Is(nvmlErr, ErrNVMLNotBuilt) {
		return nil, errors.Join(nvmlErr, err)
	}
	return gpus, err
}

// ErrNVMLNotBuilt is NVML's answer in a build without the nvml tag and cgo.
var ErrNVMLNotBuilt = errors.New("nvml: not built in (build with -tags nvml and cgo)")

// nvidia fills in NVIDIA detail. On Linux it asks only when the PCI scan
// found NVIDIA GPUs, and complains only when one of them is bound to the
// nvidia driver (GPUs bound to vfio-pci are invisible to the driver). Other
// OSes have no PCI scan: whatever NVIDIA reports is the GPU list.
func (c *collector) nvidia(ctx context.Context) {
	inv := c.inv
	linux := c.cfg.GOOS == "linux"
	want, driverBound := !linux, false
	for _, g := range inv.GPUs {
		if g.Vendor == "nvidia" {
			want = true
			driverBound = driverBound || g.Driver == "nvidia"
		}
	}
	if !want {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommandTimeout)
	defer cancel()
	details, err := nvidiaGPUs(ctx, c.cfg.NVML, c.cfg.Run)
	if err != nil {
		if driverBound || (!linux && !errors.Is(err, exec.ErrNotFound)) {
			c.warn("gpus", err)
		}
		return
	}
	MergeNVIDIA(inv, details)
}

// MergeNVIDIA copies NVIDIA detail onto the GPUs with the same PCI address
// and appends GPUs the PCI scan did not see (non-Linux hosts).
func MergeNVIDIA(inv *api.HostInventory, details []NVIDIAGPU) {
	for _, d := range details {
		idx := d.Index
		found := false
		for i := range inv.GPUs {
			g := &inv.GPUs[i]
			if g.Address != d.PCIAddress {
				continue
			}
			g.Model, g.MemoryMiB, g.DriverVersion, g.UUID, g.Index, g.DetailSource =
				d.Name, d.MemoryMiB, d.DriverVersion, d.UUID, &idx, d.Source
			found = true
			break
		}
		if !found {
			inv.GPUs = append(inv.GPUs, api.GPU{
				PCIFunction: api.PCIFunction{Address: d.PCIAddress, VendorID: "0x10de", NUMANode: -1},
				Vendor:      "nvidia", Model: d.Name, MemoryMiB: d.MemoryMiB, DriverVersion: d.DriverVersion,
				UUID: d.UUID, Index: &idx, DetailSource: d.Source,
			})
		}
	}
}
