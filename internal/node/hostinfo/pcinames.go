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

	"github.com/jaypipes/pcidb"
)

// EnvPCIIDsPath names a pci.ids file, as for pcidb and ghw.
const EnvPCIIDsPath = "PCIDB_PATH"

// ErrNoPCIIDs means no pci.ids database was found; names stay empty.
var ErrNoPCIIDs = errors.New("no pci.ids database found (install Debian's pci.ids or hwdata, or set PCIDB_PATH); PCI names omitted")

// PCINames looks up vendor and device names. A nil *PCINames knows none.
type PCINames struct {
	db *pcidb.DB
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
	if n == nil || n.db == nil {
		return "", ""
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
