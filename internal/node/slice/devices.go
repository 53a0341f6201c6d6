package slice

// GPUs, fabric adapters and NVMe namespaces, from internal/node/hostinfo's
// sysfs readers.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/drover-dev/drover/internal/node/hostinfo"
	"github.com/drover-dev/drover/internal/wire/api"
)

// isSliceGPU: NVIDIA and AMD GPUs; Intel display functions are host
// graphics, not slice GPUs.
func isSliceGPU(d hostinfo.PCIDev) bool {
	return d.IsGPU() && (d.Vendor == hostinfo.VendorNVIDIA || d.Vendor == hostinfo.VendorAMD)
}

func (d *Discoverer) pciDevices(ctx context.Context, s *scan) error {
	pci, err := hostinfo.ScanPCI(ctx, d.cfg.SysRoot)
	if err != nil {
		return err
	}
	s.pci, s.byAddr = pci, hostinfo.IndexPCI(pci)
	var names *hostinfo.PCINames
	if len(pci) > 0 {
		// No pci.ids only costs the model names.
		names, _ = hostinfo.LoadPCINames(hostinfo.FindPCIIDs(d.cfg.PCIIDsPath, d.cfg.Getenv, d.cfg.RootDir))
	}
	groups := map[int][]string{}
	for _, p := range pci {
		if p.IOMMUGroup >= 0 {
			groups[p.IOMMUGroup] = append(groups[p.IOMMUGroup], p.Address)
		}
	}
	nics, err := hostinfo.ScanNICs(d.cfg.SysRoot)
	if err != nil {
		return err
	}
	for _, p := range pci {
		switch {
		case isSliceGPU(p):
			f := p.API(names)
			members := groups[p.IOMMUGroup]
			if members == nil {
				members = []string{}
			}
			s.topo.GPUDevices = append(s.topo.GPUDevices, GPUDevice{PCIAddress: p.Address,
				Vendor: hostinfo.VendorShortName(p.Vendor), VendorID: f.VendorID, DeviceID: f.DeviceID,
				Model: model(f.DeviceName, p), Driver: p.Driver, NUMANode: p.NUMANode, IOMMUGroup: f.IOMMUGroup,
				IOMMUGroupDevices: members})
		case p.IsFabric() && p.PhysFn == "":
			s.topo.FabricDevices = append(s.topo.FabricDevices, d.fabric(p, names, s.byAddr, nics))
		}
	}
	if len(s.topo.GPUDevices) == 0 {
		s.host = append([]Blocker{{Code: BlockerNoGPUs,
			Message: "no NVIDIA or AMD GPU on the PCI bus: this host has nothing to slice"}}, s.host...)
	}
	return nil
}

func model(name string, p hostinfo.PCIDev) string {
	if name != "" {
		return name
	}
	return fmt.Sprintf("%s 0x%04x", hostinfo.VendorShortName(p.Vendor), p.Device)
}

func (d *Discoverer) fabric(p hostinfo.PCIDev, names *hostinfo.PCINames, byAddr map[string]hostinfo.PCIDev, nics []api.NIC) FabricDevice {
	f := p.API(names)
	fd := FabricDevice{PCIAddress: p.Address, VendorID: f.VendorID, DeviceID: f.DeviceID, Model: model(f.DeviceName, p),
		Driver: p.Driver, NUMANode: p.NUMANode, IOMMUGroup: f.IOMMUGroup, Interfaces: []FabricInterface{},
		SRIOVTotalVFs: p.SRIOVTotalVFs, SRIOVNumVFs: p.SRIOVNumVFs, VFs: []FabricVF{}}
	for _, n := range nics {
		if n.PCIAddress == p.Address {
			fd.Interfaces = append(fd.Interfaces, FabricInterface{Name: n.Name, LinkType: n.LinkType,
				OperState: n.OperState, SpeedMbps: n.SpeedMbps})
		}
	}
	for _, vf := range p.VFs {
		v := FabricVF{Index: vf.Index, PCIAddress: vf.Address, NUMANode: p.NUMANode}
		if fn, ok := byAddr[vf.Address]; ok {
			v.Driver, v.IOMMUGroup = fn.Driver, fn.IOMMUGroupPtr()
			if fn.NUMANode >= 0 {
				v.NUMANode = fn.NUMANode
			}
		}
		fd.VFs = append(fd.VFs, v)
	}
	return fd
}

func (d *Discoverer) nvmeDevices(ctx context.Context, s *scan) error {
	mounts, merr := hostinfo.ReadMounts(filepath.Join(d.cfg.ProcRoot, "self", "mounts"))
	swaps, serr := hostinfo.ReadSwaps(filepath.Join(d.cfg.ProcRoot, "swaps"))
	s.mountOK = merr == nil && serr == nil
	if !s.mountOK {
		s.host = append(s.host, Blocker{Code: BlockerMountStateUnknown,
			Message: fmt.Sprintf("cannot tell which NVMe namespaces are in use (%v): none is proposed", firstErr(merr, serr))})
	}
	_, nvme, err := hostinfo.ScanBlock(ctx, d.cfg.SysRoot, d.cfg.DevRoot, append(mounts, swaps...), s.byAddr)
	if err != nil {
		return err
	}
	for _, n := range nvme {
		s.topo.NVMeDevices = append(s.topo.NVMeDevices, NVMeDevice{Name: n.Name, Path: d.devPath(n.Path), ByIDPath: d.devPath(n.ByIDPath),
			Model: n.Model, Serial: n.Serial, SizeBytes: n.SizeBytes, PCIAddress: n.PCIAddress, NUMANode: n.NUMANode,
			IOMMUGroup: n.IOMMUGroup, InUse: !s.mountOK || len(n.MountPoints) > 0 || len(n.Holders) > 0,
			MountPoints: n.MountPoints, Holders: n.Holders})
	}
	return nil
}

// devPath names a host device path ("/dev/...") as Config.DevPath says.
func (d *Discoverer) devPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "/dev/"); ok && d.cfg.DevPath != "/dev" {
		return filepath.Join(d.cfg.DevPath, rest)
	}
	return p
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
