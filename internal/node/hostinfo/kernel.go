package hostinfo

// Kernel modules from <proc>/modules and <sys>/module, and the kernel
// command line from <proc>/cmdline.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// LoadedModules reports each named module as loaded when <proc>/modules
// lists it or <sys>/module/<name> exists (built-in modules only show
// there). A missing /proc/modules (kernel without module support) is not
// an error. Names use underscores, as the kernel does ("vfio_pci").
func LoadedModules(procRoot, sysRoot string, names []string) (map[string]bool, error) {
	mods := make(map[string]bool, len(names))
	loaded := map[string]bool{}
	b, err := os.ReadFile(join(procRoot, "modules"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("read modules: %w", err)
	} else {
		err = nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			loaded[f[0]] = true
		}
	}
	for _, name := range names {
		if loaded[name] {
			mods[name] = true
			continue
		}
		_, serr := os.Stat(join(sysRoot, "module", name))
		mods[name] = serr == nil
	}
	return mods, err
}

// KernelCmdline returns the words of <proc>/cmdline.
func KernelCmdline(procRoot string) ([]string, error) {
	s, err := readTrim(join(procRoot, "cmdline"))
	if err != nil {
		return nil, err
	}
	return strings.Fields(s), nil
}
