package diag

import (
	"os"
	"path/filepath"
	"testing"
)

// fakeNet is one net/<if> entry under a fake PCI function.
type fakeNet struct {
	name, operstate, speed string
}

// fakePCI is one <sys>/bus/pci/devices/<addr> directory.
type fakePCI struct {
	addr, vendor, device, class, numa string
	driver                            string // basename of the driver symlink; empty for none
	nets                              []fakeNet
}

// fakeHost describes a fake /sys, /proc and /dev tree.
type fakeHost struct {
	osrelease  string
	meminfo    string
	modules    *string  // nil: no /proc/modules
	sysModules []string // <sys>/module/<name> dirs (built-in modules)
	kvm        bool
	noPCIDir   bool
	pci        []fakePCI
}

type fakeRoots struct{ sys, proc, dev string }

const gpuHostMeminfo = `MemTotal:       528280576 kB
MemFree:        400000000 kB
MemAvailable:   500000000 kB
Buffers:          102400 kB
Cached:          2048000 kB
`

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// build writes h under a fresh t.TempDir() and returns the roots.
func (h fakeHost) build(t *testing.T) fakeRoots {
	t.Helper()
	base := t.TempDir()
	r := fakeRoots{sys: filepath.Join(base, "sys"), proc: filepath.Join(base, "proc"), dev: filepath.Join(base, "dev")}
	for _, d := range []string{r.sys, r.proc, r.dev} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if h.osrelease != "" {
		writeFile(t, filepath.Join(r.proc, "sys", "kernel", "osrelease"), h.osrelease+"\n")
	}
	if h.meminfo != "" {
		writeFile(t, filepath.Join(r.proc, "meminfo"), h.meminfo)
	}
	if h.modules != nil {
		writeFile(t, filepath.Join(r.proc, "modules"), *h.modules)
	}
	for _, m := range h.sysModules {
		if err := os.MkdirAll(filepath.Join(r.sys, "module", m), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if h.kvm {
		writeFile(t, filepath.Join(r.dev, "kvm"), "")
	}
	devs := filepath.Join(r.sys, "bus", "pci", "devices")
	if !h.noPCIDir {
		if err := os.MkdirAll(devs, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range h.pci {
		dir := filepath.Join(devs, d.addr)
		writeFile(t, filepath.Join(dir, "vendor"), d.vendor+"\n")
		writeFile(t, filepath.Join(dir, "device"), d.device+"\n")
		writeFile(t, filepath.Join(dir, "class"), d.class+"\n")
		if d.numa != "" {
			writeFile(t, filepath.Join(dir, "numa_node"), d.numa+"\n")
		}
		if d.driver != "" {
			target := filepath.Join(r.sys, "bus", "pci", "drivers", d.driver)
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(dir, "driver")); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range d.nets {
			writeFile(t, filepath.Join(dir, "net", n.name, "operstate"), n.operstate+"\n")
			if n.speed != "" {
				writeFile(t, filepath.Join(dir, "net", n.name, "speed"), n.speed+"\n")
			}
		}
	}
	return r
}

func strPtr(s string) *string { return &s }
