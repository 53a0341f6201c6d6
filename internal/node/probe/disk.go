package probe

import (
	"fmt"
	"os"
	"path/filepath"
)

// DiskUsage is one filesystem's usage, as df shows it.
type DiskUsage struct {
	Path        string  `json:"path"`
	UsedPercent float64 `json:"used_percent"`
	TotalBytes  uint64  `json:"total_bytes"`
	FreeBytes   uint64  `json:"free_bytes"` // available to unprivileged users
}

// Usage measures the filesystem holding path.
func Usage(path string) (DiskUsage, error) {
	total, free, used, err := statfs(path)
	if err != nil {
		return DiskUsage{}, fmt.Errorf("filesystem usage of %s: %w", path, err)
	}
	u := DiskUsage{Path: path, TotalBytes: total, FreeBytes: free}
	if used+free > 0 {
		u.UsedPercent = float64(used) * 100 / float64(used+free)
	}
	return u, nil
}

// Writable proves dir takes a write: it writes, syncs and removes a probe
// file.
func Writable(dir string) error {
	f, err := os.CreateTemp(dir, ".drover-probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_, werr := f.Write([]byte("drover-agent write probe\n"))
	if werr == nil {
		werr = f.Sync()
	}
	cerr := f.Close()
	rerr := os.Remove(filepath.Clean(name))
	switch {
	case werr != nil:
		return fmt.Errorf("write %s: %w", name, werr)
	case cerr != nil:
		return fmt.Errorf("close %s: %w", name, cerr)
	case rerr != nil:
		return fmt.Errorf("remove %s: %w", name, rerr)
	}
	return nil
}
