package qemu

import (
	"context"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/vmcgroup"
)

// TestFactory: the registry entry refuses to build without an
// accelerator and otherwise passes the agent's options and its own
// NODE_AGENT_QEMU_BINARY through.
func TestFactory(t *testing.T) {
	root := shortDir(t)
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(root, "images"), Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	opts := runtime.Options{Root: root, Images: cache, Log: discardLog(), OnOrphanRemoved: func(string) {}}
	set := runtime.Values{"BINARY": "/opt/qemu/qemu-system-x86_64"}
	fakeCgroups(t, nil)
	if _, err := Entry().Build(context.Background(), opts, set); err == nil || !strings.Contains(err.Error(), "no working accelerator") {
		t.Fatalf("Factory without an accelerator = %v, want a no working accelerator error", err)
	}
	opts.Accel = "tcg"
	rt, err := Entry().Build(context.Background(), opts, set)
	if err != nil {
		t.Fatalf("Factory: %v", err)
	}
	r, ok := rt.(*Runtime)
	if !ok {
		t.Fatalf("Factory built a %T, want *qemu.Runtime", rt)
	}
	defer r.Close()
	if r.Name() != Name || r.opts.Root != root || r.opts.Accel != "tcg" || r.opts.QEMUBinary != set["BINARY"] ||
		r.opts.Images != cache || r.opts.OnOrphanRemoved == nil {
		t.Errorf("options not passed through: %+v", r.opts)
	}
}

// fakeCgroups points the factory's cgroup manager at a directory of the
// test's (a v2-like tree under t.TempDir; fail: New fails with it).
func fakeCgroups(t *testing.T, fail error) (parents *[]string) {
	t.Helper()
	dir := t.TempDir()
	var got []string
	old := newCgroups
	newCgroups = func(o vmcgroup.Options) (*vmcgroup.Manager, error) {
		got = append(got, o.Parent)
		if fail != nil {
			return nil, fail
		}
		return vmcgroup.New(vmcgroup.Options{Root: dir, Parent: o.Parent})
	}
	t.Cleanup(func() { newCgroups = old })
	return &got
}

// TestFactoryCgroups: the factory gives the runtime a memory cgroup
// manager under NODE_AGENT_QEMU_CGROUP_PARENT (default drover), none
// without one, and builds without one (a warning) where the host has no
// memory controller.
func TestFactoryCgroups(t *testing.T) {
	root := shortDir(t)
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(root, "images"), Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	opts := runtime.Options{Root: root, Images: cache, Log: discardLog(), Accel: "tcg"}
	build := func(set runtime.Values) *Runtime {
		t.Helper()
		rt, err := Entry().Build(context.Background(), opts, set)
		if err != nil {
			t.Fatal(err)
		}
		r := rt.(*Runtime)
		t.Cleanup(func() { r.Close() })
		return r
	}
	parents := fakeCgroups(t, nil)
	if r := build(nil); r.opts.Cgroups == nil || filepath.Base(r.opts.Cgroups.Dir()) != vmcgroup.DefaultParent {
		t.Errorf("default: Cgroups = %+v, want a manager under %q", r.opts.Cgroups, vmcgroup.DefaultParent)
	}
	if r := build(runtime.Values{"CGROUP_PARENT": "drover-x"}); r.opts.Cgroups == nil || filepath.Base(r.opts.Cgroups.Dir()) != "drover-x" {
		t.Errorf("CGROUP_PARENT=drover-x: Cgroups = %+v", r.opts.Cgroups)
	}
	if r := build(runtime.Values{"CGROUP_PARENT": CgroupsOff}); r.opts.Cgroups != nil || len(*parents) != 2 {
		t.Errorf("CGROUP_PARENT=none: Cgroups = %+v, managers made for %v", r.opts.Cgroups, *parents)
	}
	fakeCgroups(t, vmcgroup.ErrUnsupported)
	if r := build(nil); r.opts.Cgroups != nil {
		t.Errorf("unsupported host: Cgroups = %+v", r.opts.Cgroups)
	}
	if _, err := ParseConfig(runtime.Values{"CGROUP_PARENT": "a/b"}); err == nil {
		t.Error("CGROUP_PARENT a/b accepted")
	}
}

// TestFactoryOCICacheBound: NODE_AGENT_OCI_CACHE_MAX_GIB (the agent's
// runtime.Options.OCICacheMaxBytes) bounds the microVM mode's OCI store;
// 0 leaves the store's default.
func TestFactoryOCICacheBound(t *testing.T) {
	fakeCgroups(t, nil)
	root := shortDir(t)
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(root, "images"), Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	set := runtime.Values{"MICROVM_KERNEL": "/k/vmlinux", "MICROVM_INITRD": "/k/initrd"}
	for _, max := range []int64{3 << 30, 0} {
		opts := runtime.Options{Root: root, Images: cache, Log: discardLog(), Accel: "tcg", OCICacheMaxBytes: max}
		rt, err := Entry().Build(context.Background(), opts, set)
		if err != nil {
			t.Fatal(err)
		}
		r := rt.(*Runtime)
		r.Close()
		want := max
		if want == 0 {
			want = oci.DefaultMaxBytes
		}
		if r.opts.MicroVM == nil || r.opts.MicroVM.OCI.MaxBytes() != want {
			t.Fatalf("OCICacheMaxBytes %d: microVM OCI store %+v, want its bound %d", max, r.opts.MicroVM, want)
		}
		if r.opts.MicroVM.Net == nil && goruntime.GOOS == "linux" {
			t.Error("the microVM mode has no network manager (netsetup) on linux")
		}
		if r.opts.MicroVM.Volumes == nil {
			t.Error("the microVM mode keeps no volumes")
		} else if fi, err := os.Stat(filepath.Join(root, "volumes")); err != nil || !fi.IsDir() {
			t.Errorf("volumes directory under the runtime root: %v", err)
		}
	}
}

// TestSettings: qemu owns NODE_AGENT_QEMU_BINARY (-qemu-binary), whose
// default is the host architecture's qemu-system binary, and the microVM
// kernel and initrd (NODE_AGENT_QEMU_MICROVM_KERNEL, _INITRD), which go
// together as absolute paths.
func TestSettings(t *testing.T) {
	e := Entry()
	if len(e.Settings) != 4 || runtime.EnvKey(Name, e.Settings[0].Name) != "NODE_AGENT_QEMU_BINARY" ||
		runtime.EnvKey(Name, e.Settings[1].Name) != "NODE_AGENT_QEMU_MICROVM_KERNEL" ||
		runtime.FlagName(Name, e.Settings[0].Name) != "qemu-binary" {
		t.Fatalf("settings = %+v, want NODE_AGENT_QEMU_BINARY alone", e.Settings)
	}
	c, err := ParseConfig(runtime.Values{"BINARY": e.Settings[0].Default})
	if err != nil || !strings.HasPrefix(c.Binary, "qemu-system-") {
		t.Errorf("default config = %+v, %v; want qemu-system-<arch>", c, err)
	}
	for _, v := range []runtime.Values{{"MICROVM_KERNEL": "/k"}, {"MICROVM_KERNEL": "k", "MICROVM_INITRD": "/i"}} {
		if _, err := ParseConfig(v); err == nil {
			t.Errorf("%v accepted", v)
		}
	}
	if c, err := ParseConfig(runtime.Values{"MICROVM_KERNEL": "/k", "MICROVM_INITRD": "/i"}); err != nil || c.MicroVMInitrd != "/i" {
		t.Errorf("microvm config %+v, %v", c, err)
	}
}
