package hostinfo

// Vendor and device names from a pci.ids database, through
// github.com/jaypipes/pcidb (the parser ghw uses, without ghw's other
// dependencies). pcidb is only ever handed a path that exists, so it never
// reaches for the network.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jaypipes/pcidb"
)

// EnvPCIIDsPath names a pci.ids file, as for pcidb and ghw.
const EnvPCIIDsPath = "PCIDB_PATH"

// ErrNoPCIIDs means no pci.ids database was found; names stay empty.
var ErrNoPCIIDs = errors.New("no pci.ids database found (install Debian's pci.ids or hwdata, or set PCIDB_PATH); PCI names omitted")

// PCINames looks up vendor and device names. A nil *PCINames knows none.
type PCINames struct {
	db *pcidb.DB
	// Without db (a PCINameCache's): the names of some ids only.
	vendors map[uint32]string
	devices map[[2]uint32]string
}

// FindPCIIDs returns the pci.ids to use: explicit, else $PCIDB_PATH, else
// the first existing well-known location under dataRoot; "" when none.
func FindPCIIDs(explicit string, getenv func(string) string, dataRoot string) string {
	if explicit != "" {
		return explicit
	}
	if getenv != nil {
		if p := getenv(EnvPCIIDsPath); p != "" {
			return p
		}
	}
	for _, rel := range []string{
		"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids",
		"usr/share/hwdata/pci.ids.gz", "usr/share/misc/pci.ids.gz",
	} {
		p := filepath.Join(dataRoot, filepath.FromSlash(rel))
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// LoadPCINames parses the pci.ids at path. An empty path gives nil and
// ErrNoPCIIDs; callers carry on with hex ids.
func LoadPCINames(path string) (names *PCINames, err error) {
	if path == "" {
		return nil, ErrNoPCIIDs
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("pci.ids: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("pci.ids: %s is not a regular file", path)
	}
	// pcidb indexes past the end of malformed lines; a damaged file must
	// cost the names, not the agent.
	defer func() {
		if v := recover(); v != nil {
			names, err = nil, fmt.Errorf("pci.ids: %s is malformed: %v", path, v)
		}
	}()
	db, err := pcidb.New(pcidb.WithPath(path))
	if err != nil {
		return nil, fmt.Errorf("pci.ids %s: %w", path, err)
	}
	return &PCINames{db: db}, nil
}

// Lookup returns the vendor and device names; "" for unknown ids.
func (n *PCINames) Lookup(vendor, device uint32) (vendorName, deviceName string) {
	if n == nil {
		return "", ""
	}
	if n.db == nil {
		return n.vendors[vendor], n.devices[[2]uint32{vendor, device}]
	}
	v := fmt.Sprintf("%04x", vendor)
	if vv, ok := n.db.Vendors[v]; ok {
		vendorName = vv.Name
	}
	if p, ok := n.db.Products[v+fmt.Sprintf("%04x", device)]; ok {
		deviceName = p.Name
	}
	return vendorName, deviceName
}

// PCINameCache keeps the names of a host's PCI ids across host readings: a
// reading parses pci.ids again only when the file changed (path, size or
// modification time) or the host has an id the last parse did not look
// up. Parsing the whole database allocates ≈ 12 MB, ≈ 6 MB of it live
// until the reading ends, for the few dozen names a host needs; the
// agent reads its host every 5 minutes. The zero value is ready to use
// and safe for concurrent readings.
type PCINameCache struct {
	mu     sync.Mutex
	file   pciIDsFile
	looked map[[2]uint32]bool // the ids names covers, named or not
	names  *PCINames
	parses int
}

// pciIDsFile identifies the pci.ids a cache's names came from.
type pciIDsFile struct {
	path string
	size int64
	mod  time.Time
}

// Names returns the names of ids (vendor, device pairs) from the pci.ids
// at path, parsing it only when the cached ones do not cover them. Errors
// are LoadPCINames's.
func (c *PCINameCache) Names(path string, ids [][2]uint32) (*PCINames, error) {
	if path == "" {
		return nil, ErrNoPCIIDs
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("pci.ids: %w", err)
	}
	f := pciIDsFile{path: path, size: fi.Size(), mod: fi.ModTime()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names != nil && c.file == f && c.covers(ids) {
		return c.names, nil
	}
	full, err := LoadPCINames(path)
	if err != nil {
		return nil, err
	}
	c.parses++
	n := &PCINames{vendors: map[uint32]string{}, devices: map[[2]uint32]string{}}
	looked := make(map[[2]uint32]bool, len(ids))
	for _, id := range ids {
		v, d := full.Lookup(id[0], id[1])
		if v != "" {
			n.vendors[id[0]] = v
		}
		if d != "" {
			n.devices[id] = d
		}
		looked[id] = true
	}
	c.file, c.looked, c.names = f, looked, n
	return n, nil
}

func (c *PCINameCache) covers(ids [][2]uint32) bool {
	for _, id := range ids {
		if !c.looked[id] {
			return false
		}
	}
	return true
}
