package dashboard

import (
	"fmt"
	"html"
	"html/template"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// invView is a host's inventory as the host page's device tables show it.
type invView struct {
	CPU      api.CPUInfo
	CPUFlags string // the virtualisation flags, "none" when neither
	Memory   memView
	GPUs     []gpuView
	NICs     []nicView
	Disks    []diskView
	IOMMU    []iommuView
	Warnings []api.InventoryWarning
}

type memView struct{ Total, Available, Swap string }

type gpuView struct{ Address, PCIID, Name, Driver, IOMMU, NUMA string }

type nicView struct{ Name, MAC, Speed, Driver, PCI, State string }

// diskView is a whole disk or an NVMe namespace.
type diskView struct{ Name, Kind, Model, Size, PCI, IOMMU, Use string }

type iommuView struct {
	ID      int
	Devices []string // "0000:3b:00.0 (GPU NVIDIA H100)"
}

// humanBytes is n in binary units with one decimal, "—" for 0.
func humanBytes(n uint64) string {
	if n == 0 {
		return "—"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v, i = v/1024, i+1
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[i]
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func groupOf(g *int) string {
	if g == nil {
		return "—"
	}
	return strconv.Itoa(*g)
}

func numaOf(n int) string {
	if n < 0 {
		return "—"
	}
	return strconv.Itoa(n)
}

// pciID is "vendor:device" without the 0x prefixes, as lspci -nn prints it.
func pciID(f api.PCIFunction) string {
	v, d := strings.TrimPrefix(f.VendorID, "0x"), strings.TrimPrefix(f.DeviceID, "0x")
	if v == "" && d == "" {
		return "—"
	}
	return v + ":" + d
}

// inventoryView builds the device tables of inv; nil when there is none.
func inventoryView(inv *api.HostInventory) *invView {
	if inv == nil {
		return nil
	}
	v := &invView{CPU: inv.CPU, CPUFlags: strings.Join(inv.CPU.Virtualization, ", "), Warnings: inv.Warnings,
		Memory: memView{Total: humanBytes(inv.Memory.TotalBytes), Available: humanBytes(inv.Memory.AvailableBytes),
			Swap: humanBytes(inv.Memory.SwapTotalBytes)}}
	if v.CPUFlags == "" {
		v.CPUFlags = "none"
	}
	names := map[string]string{} // PCI address → what it is, for the IOMMU groups
	for _, g := range inv.GPUs {
		name := g.Model
		if name == "" {
			name = strings.TrimSpace(g.VendorName + " " + g.DeviceName)
		}
		if name == "" {
			name = g.Vendor
		}
		v.GPUs = append(v.GPUs, gpuView{Address: g.Address, PCIID: pciID(g.PCIFunction), Name: orDash(name),
			Driver: orDash(g.Driver), IOMMU: groupOf(g.IOMMUGroup), NUMA: numaOf(g.NUMANode)})
		names[g.Address] = "GPU " + name
	}
	for _, n := range inv.NICs {
		speed := "—"
		if n.SpeedMbps > 0 {
			speed = fmt.Sprintf("%d Mb/s", n.SpeedMbps)
		}
		state := orDash(n.OperState)
		if n.Virtual {
			state += " (virtual)"
		}
		v.NICs = append(v.NICs, nicView{Name: n.Name, MAC: orDash(n.MAC), Speed: speed, Driver: orDash(n.Driver),
			PCI: orDash(n.PCIAddress), State: state})
		if n.PCIAddress != "" {
			names[n.PCIAddress] = "NIC " + n.Name
		}
	}
	for _, f := range inv.Fabric {
		names[f.Address] = strings.TrimSpace("fabric " + f.DeviceName)
	}
	nvme := map[string]bool{}
	for _, n := range inv.NVMe {
		nvme[n.Name] = true
		use := "free"
		if len(n.MountPoints) > 0 || len(n.Holders) > 0 {
			use = "in use: " + strings.Join(append(append([]string{}, n.MountPoints...), n.Holders...), ", ")
		}
		v.Disks = append(v.Disks, diskView{Name: n.Name, Kind: "nvme", Model: orDash(n.Model), Size: humanBytes(n.SizeBytes),
			PCI: orDash(n.PCIAddress), IOMMU: groupOf(n.IOMMUGroup), Use: use})
		if n.PCIAddress != "" {
			names[n.PCIAddress] = "NVMe " + n.Name
		}
	}
	for _, d := range inv.Disks {
		if nvme[d.Name] {
			continue
		}
		v.Disks = append(v.Disks, diskView{Name: d.Name, Kind: orDash(d.Kind), Model: orDash(d.Model),
			Size: humanBytes(d.SizeBytes), PCI: orDash(d.PCIAddress), IOMMU: "—", Use: "—"})
	}
	for _, g := range inv.IOMMUGroups {
		iv := iommuView{ID: g.ID}
		for _, a := range g.Devices {
			if n := names[a]; n != "" {
				a += " (" + n + ")"
			}
			iv.Devices = append(iv.Devices, a)
		}
		v.IOMMU = append(v.IOMMU, iv)
	}
	return v
}

// Capacity chart geometry: one row per resource, its numbers above a
// stacked bar of reserved, allocated and free out of the total.
const (
	capW    = 420
	capRowH = 46
	capBarH = 14
)

// capSeg is one segment of a stacked bar.
type capSeg struct {
	class, label string
	n            int
}

// capacityChart draws c as an inline SVG: per resource (vCPU, memory,
// disk, GPUs) a stacked bar of reserved / allocated / free scaled to the
// total, each segment titled and the numbers written out above it (text,
// not colour alone). Nil: empty.
func capacityChart(c *api.CapacityReport) template.HTML {
	if c == nil {
		return ""
	}
	rows := []struct {
		name, unit string
		total      int
		segs       []capSeg
	}{
		{"vCPU", "", c.Total.VCPUs, segs(c.Reserved.VCPUs, c.Allocated.VCPUs, c.Free.VCPUs)},
		{"Memory", " MiB", c.Total.MemoryMiB, segs(c.Reserved.MemoryMiB, c.Allocated.MemoryMiB, c.Free.MemoryMiB)},
		{"Disk", " GiB", c.Total.DiskGiB, segs(c.Reserved.DiskGiB, c.Allocated.DiskGiB, c.Free.DiskGiB)},
		{"GPUs", "", c.Total.GPUs, segs(c.Reserved.GPUs, c.Allocated.GPUs, c.Free.GPUs)},
	}
	ht := len(rows) * capRowH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="capacity-chart" class="chart capacity" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-labelledby="capacity-chart-title">`,
		capW, ht, capW, ht)
	b.WriteString(`<title id="capacity-chart-title">Capacity: reserved, allocated and free out of the total, per resource</title>`)
	for i, r := range rows {
		y := i * capRowH
		text := fmt.Sprintf("%s: %d%s total · %d reserved · %d allocated · %d free", r.name, r.total, r.unit,
			r.segs[0].n, r.segs[1].n, r.segs[2].n)
		fmt.Fprintf(&b, `<g class="resource" data-resource="%s"><text x="0" y="%d" class="label">%s</text>`,
			strings.ToLower(r.name), y+14, html.EscapeString(text))
		fmt.Fprintf(&b, `<rect x="0" y="%d" width="%d" height="%d" class="track"/>`, y+20, capW, capBarH)
		// An over-committed resource (allocated beyond the total) scales
		// to its sum, so the bar never runs past its track.
		scale := max(r.total, r.segs[0].n+r.segs[1].n+r.segs[2].n)
		x := 0
		for _, s := range r.segs {
			w := 0
			if scale > 0 && s.n > 0 {
				w = max(1, s.n*capW/scale)
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" class="cap-%s" data-n="%d"><title>%s %s: %d%s</title></rect>`,
				x, y+20, w, capBarH, s.class, s.n, html.EscapeString(r.name), s.label, s.n, r.unit)
			x += w
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built here, every label escaped
}

func segs(reserved, allocated, free int) []capSeg {
	return []capSeg{{"reserved", "reserved", reserved}, {"allocated", "allocated", allocated}, {"free", "free", free}}
}
