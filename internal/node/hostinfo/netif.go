package hostinfo

// Network interfaces from <sys>/class/net on Linux and from package net
// elsewhere.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// ARPHRD link types of <sys>/class/net/<if>/type.
const (
	arphrdEther      = 1
	arphrdInfiniband = 32
	arphrdLoopback   = 772
)

// ScanNICs lists <sys>/class/net interfaces but loopback, sorted by name.
// The speed file fails to read (EINVAL) or holds -1 on a down link; both
// give 0.
func ScanNICs(sysRoot string) ([]api.NIC, error) {
	root := join(sysRoot, "class", "net")
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return []api.NIC{}, nil
	}
	if err != nil {
		return []api.NIC{}, fmt.Errorf("list net interfaces: %w", err)
	}
	out := []api.NIC{}
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		typ, _ := readInt(filepath.Join(dir, "type"))
		if typ == arphrdLoopback || e.Name() == "lo" {
			continue
		}
		n := api.NIC{Name: e.Name(), LinkType: linkType(typ)}
		n.MAC, _ = readTrim(filepath.Join(dir, "address"))
		n.OperState, _ = readTrim(filepath.Join(dir, "operstate"))
		n.Up = n.OperState == "up"
		if s, err := readInt(filepath.Join(dir, "speed")); err == nil && s > 0 {
			n.SpeedMbps = s
		}
		n.MTU, _ = readInt(filepath.Join(dir, "mtu"))
		n.Driver = linkBase(filepath.Join(dir, "device", "driver"))
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			n.Virtual = strings.Contains(filepath.ToSlash(real), "/devices/virtual/")
		}
		if !n.Virtual {
			n.PCIAddress = pciAddressOf(dir)
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func linkType(t int) string {
	switch t {
	case arphrdEther:
		return "ethernet"
	case arphrdInfiniband:
		return "infiniband"
	case 0:
		return ""
	}
	return "other"
}

// portableNICs lists interfaces through package net (no speed or driver).
func portableNICs() ([]api.NIC, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return []api.NIC{}, fmt.Errorf("list net interfaces: %w", err)
	}
	out := []api.NIC{}
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 {
			continue
		}
		n := api.NIC{Name: i.Name, MAC: i.HardwareAddr.String(), MTU: i.MTU, OperState: "down"}
		if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagRunning != 0 {
			n.OperState, n.Up = "up", true
		}
		if len(i.HardwareAddr) == 6 {
			n.LinkType = "ethernet"
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
