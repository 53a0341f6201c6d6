package hostinfo

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

func TestParseNvidiaSMI(t *testing.T) {
	tests := []struct {
		name    string
		out     string
		want    []NVIDIAGPU
		wantErr string
	}{
		{"two gpus", smiCanned, []NVIDIAGPU{
			{Index: 0, Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, DriverVersion: "550.54.15",
				UUID: "GPU-11111111-2222-3333-4444-555555555555", PCIAddress: "0000:3b:00.0", Source: "nvidia-smi"},
			{Index: 1, Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, DriverVersion: "550.54.15",
				UUID: "GPU-66666666-7777-8888-9999-000000000000", PCIAddress: "0000:86:00.0", Source: "nvidia-smi"},
		}, ""},
		{"empty output", "", nil, ""},
		{"not available fields", "0, NVIDIA A100-SXM4-40GB, [N/A], 535.104.05, [Not Supported], 00000000:07:00.0\n",
			[]NVIDIAGPU{{Index: 0, Name: "NVIDIA A100-SXM4-40GB", DriverVersion: "535.104.05", PCIAddress: "0000:07:00.0", Source: "nvidia-smi"}}, ""},
		{"too few fields", "0, NVIDIA H100\n", nil, "want 6 fields"},
		{"bad index", "x, a, 1, d, u, 00000000:07:00.0\n", nil, "index"},
		{"bad memory", "0, a, lots, d, u, 00000000:07:00.0\n", nil, "memory.total"},
		{"driver error text", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", nil, "want 6 fields"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNvidiaSMI([]byte(tc.out))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseNvidiaSMI = %+v, %v\nwant %+v", got, err, tc.want)
			}
		})
	}
}

func TestNormalizePCIAddress(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:AF:00.1": "0001:af:00.1",
		" 3B:00.0 ":        "3b:00.0",
		"garbage":          "garbage",
	} {
		if got := NormalizePCIAddress(in); got != want {
			t.Errorf("NormalizePCIAddress(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPreferredByID(t *testing.T) {
	tests := []struct {
		links []string
		want  string
	}{
		{nil, ""},
		{[]string{"nvme-SAMSUNG_X_S1", "nvme-SAMSUNG_X_S1_1", "nvme-eui.0025"}, "/dev/disk/by-id/nvme-eui.0025"},
		{[]string{"nvme-SAMSUNG_X_S1_1", "nvme-SAMSUNG_X_S1"}, "/dev/disk/by-id/nvme-SAMSUNG_X_S1"},
		{[]string{"nvme-nvme.144d-533645", "nvme-Model_Serial"}, "/dev/disk/by-id/nvme-nvme.144d-533645"},
		{[]string{"ata-WDC_1", "wwn-0x5000"}, "/dev/disk/by-id/wwn-0x5000"},
		{[]string{"odd-b", "odd-a"}, "/dev/disk/by-id/odd-a"},
	}
	for _, tc := range tests {
		if got := preferredByID(tc.links); got != tc.want {
			t.Errorf("preferredByID(%v) = %q, want %q", tc.links, got, tc.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/data\040disk`: "/data disk",
		`/a\011b`:       "/a\tb",
		`/back\134x`:    `/back\x`,
		`/plain`:        "/plain",
		`/short\04`:     `/short\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadCPU(t *testing.T) {
	arm := "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\n" +
		"processor\t: 1\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
	pi := "processor\t: 0\nFeatures\t: fp\n\nHardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n"
	tests := []struct {
		name    string
		cpuinfo string
		want    api.CPUInfo
	}{
		{"x86 two sockets from cpuinfo", twoSocketCPUInfo, api.CPUInfo{Vendor: "GenuineIntel", Model: "Intel(R) Xeon(R) Platinum 8480+",
			Sockets: 2, Cores: 3, Threads: 4, Virtualization: []string{"vmx"}}},
		{"arm64 neoverse", arm, api.CPUInfo{Model: "ARM part 0xd0c", Sockets: 1, Cores: 2, Threads: 2, Virtualization: []string{}}},
		{"raspberry pi", pi, api.CPUInfo{Model: "Raspberry Pi 4 Model B Rev 1.4", Sockets: 1, Cores: 1, Threads: 1, Virtualization: []string{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "cpuinfo"), []byte(tc.cpuinfo), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ReadCPU(dir, filepath.Join(dir, "no-sys"))
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ReadCPU = %+v, %v\nwant %+v", got, err, tc.want)
			}
		})
	}
	if _, err := ReadCPU(t.TempDir(), ""); err == nil {
		t.Error("ReadCPU without cpuinfo: no error")
	}
}

func TestPCINames(t *testing.T) {
	dir := t.TempDir()
	gz := filepath.Join(dir, "pci.ids.gz")
	src, err := os.ReadFile("testdata/pci.ids")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(gz)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	if _, err := zw.Write(src); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	malformed := filepath.Join(dir, "bad.ids")
	if err := os.WriteFile(malformed, []byte("10de  NVIDIA\n\t23\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name           string
		path           string
		wantErr        bool
		vendor, device string
	}{
		{"plain", "testdata/pci.ids", false, "NVIDIA Corporation", "GH100 [H100 SXM5 80GB]"},
		{"gzip", gz, false, "NVIDIA Corporation", "GH100 [H100 SXM5 80GB]"},
		{"none", "", true, "", ""},
		{"missing file", filepath.Join(dir, "nope"), true, "", ""},
		{"directory", dir, true, "", ""},
		{"malformed", malformed, true, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, err := LoadPCINames(tc.path)
			if (err != nil) != tc.wantErr {
				t.Fatalf("LoadPCINames(%q) err = %v", tc.path, err)
			}
			if tc.path == "" && !errors.Is(err, ErrNoPCIIDs) {
				t.Errorf("err = %v, want ErrNoPCIIDs", err)
			}
			v, d := n.Lookup(VendorNVIDIA, 0x2330)
			if v != tc.vendor || d != tc.device {
				t.Errorf("Lookup = %q, %q", v, d)
			}
			if v, d := n.Lookup(0xffff, 1); v != "" || d != "" {
				t.Errorf("unknown ids named %q %q", v, d)
			}
		})
	}
}

// TestPCINameCache: the cache names what LoadPCINames names, and parses
// pci.ids again only for an id it has not looked up or a changed file.
func TestPCINameCache(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "pci.ids")
	src, err := os.ReadFile("testdata/pci.ids")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	h100, virtio, unknown := [2]uint32{VendorNVIDIA, 0x2330}, [2]uint32{0x1af4, 0x1000}, [2]uint32{0xffff, 1}
	var c PCINameCache
	steps := []struct {
		name       string
		change     func() // before the step
		ids        [][2]uint32
		wantParses int
		want       map[[2]uint32][2]string
	}{
		{"first reading parses", nil, [][2]uint32{h100, unknown}, 1,
			map[[2]uint32][2]string{h100: {"NVIDIA Corporation", "GH100 [H100 SXM5 80GB]"}, unknown: {"", ""}}},
		{"same ids: cached, the unknown one too", nil, [][2]uint32{unknown, h100}, 1,
			map[[2]uint32][2]string{h100: {"NVIDIA Corporation", "GH100 [H100 SXM5 80GB]"}}},
		{"fewer ids: cached", nil, [][2]uint32{h100}, 1,
			map[[2]uint32][2]string{h100: {"NVIDIA Corporation", "GH100 [H100 SXM5 80GB]"}}},
		{"a new id parses again", nil, [][2]uint32{h100, virtio}, 2,
			map[[2]uint32][2]string{virtio: {"Red Hat, Inc.", "Virtio network device"}}},
		{"a changed file parses again", func() {
			changed := strings.Replace(string(src), "GH100 [H100 SXM5 80GB]", "GH100 [H100 SXM5 80GB, renamed]", 1)
			if err := os.WriteFile(path, []byte(changed), 0o644); err != nil {
				t.Fatal(err)
			}
		}, [][2]uint32{h100, virtio}, 3,
			map[[2]uint32][2]string{h100: {"NVIDIA Corporation", "GH100 [H100 SXM5 80GB, renamed]"}}},
	}
	for _, st := range steps {
		if st.change != nil {
			st.change()
		}
		n, err := c.Names(path, st.ids)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if c.parses != st.wantParses {
			t.Errorf("%s: %d parses, want %d", st.name, c.parses, st.wantParses)
		}
		for id, want := range st.want {
			if v, d := n.Lookup(id[0], id[1]); v != want[0] || d != want[1] {
				t.Errorf("%s: Lookup(%04x, %04x) = %q, %q; want %q, %q", st.name, id[0], id[1], v, d, want[0], want[1])
			}
		}
	}
	if _, err := c.Names("", nil); !errors.Is(err, ErrNoPCIIDs) {
		t.Errorf("Names(\"\") err = %v, want ErrNoPCIIDs", err)
	}
	if _, err := c.Names(filepath.Join(dir, "nope"), [][2]uint32{h100}); err == nil {
		t.Error("Names of a missing file: no error")
	}
}

func TestFindPCIIDs(t *testing.T) {
	root := t.TempDir()
	misc := filepath.Join(root, "usr", "share", "misc")
	if err := os.MkdirAll(misc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(misc, "pci.ids"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvPCIIDsPath {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		name, explicit, env, root, want string
	}{
		{"explicit wins", "/x/pci.ids", "/env/pci.ids", root, "/x/pci.ids"},
		{"env next", "", "/env/pci.ids", root, "/env/pci.ids"},
		{"well-known location", "", "", root, filepath.Join(misc, "pci.ids")},
		{"none", "", "", t.TempDir(), ""},
	}
	for _, tc := range tests {
		if got := FindPCIIDs(tc.explicit, env(tc.env), tc.root); got != tc.want {
			t.Errorf("%s: FindPCIIDs = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestNvidiaGPUs(t *testing.T) {
	fromNVML := []NVIDIAGPU{{Index: 0, Name: "NVIDIA H200", PCIAddress: "0000:3b:00.0", Source: "nvml"}}
	nvmlOK := func(context.Context) ([]NVIDIAGPU, error) { return fromNVML, nil }
	nvmlNotBuilt := func(context.Context) ([]NVIDIAGPU, error) { return nil, ErrNVMLNotBuilt }
	nvmlNoLib := func(context.Context) ([]NVIDIAGPU, error) {
		return nil, errors.New("nvml init: ERROR_LIBRARY_NOT_FOUND")
	}
	smi := func(out string, err error) Runner {
		return func(context.Context, string, ...string) ([]byte, error) { return []byte(out), err }
	}
	smiMissing := fmt.Errorf("nvidia-smi: %w", exec.ErrNotFound)
	tests := []struct {
		name     string
		nvml     func(context.Context) ([]NVIDIAGPU, error)
		run      Runner
		wantN    int
		wantSrc  string
		wantErrs []string
	}{
		{"nvml answers", nvmlOK, smi("", smiMissing), 1, "nvml", nil},
		{"default build uses nvidia-smi", nvmlNotBuilt, smi(smiCanned, nil), 2, "nvidia-smi", nil},
		{"nvml without driver falls back", nvmlNoLib, smi(smiCanned, nil), 2, "nvidia-smi", nil},
		{"neither: smi's error alone in the default build", nvmlNotBuilt, smi("", smiMissing), 0, "", []string{"executable file not found"}},
		{"neither: both errors", nvmlNoLib, smi("", smiMissing), 0, "", []string{"ERROR_LIBRARY_NOT_FOUND", "executable file not found"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nvidiaGPUs(context.Background(), tc.nvml, tc.run)
			if len(got) != tc.wantN || (tc.wantN > 0 && got[0].Source != tc.wantSrc) {
				t.Errorf("gpus = %+v", got)
			}
			for _, w := range tc.wantErrs {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to mention %q", err, w)
				}
			}
			if tc.wantErrs == nil && err != nil {
				t.Errorf("err = %v", err)
			}
			if len(tc.wantErrs) == 1 && strings.Contains(err.Error(), "nvml") {
				t.Errorf("err = %v mentions nvml in a build without it", err)
			}
		})
	}
}

func TestReadMountInfo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mountinfo")
	data := "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme8n1p2 rw\n" +
		"40 22 259:5 / /mnt/my\\040data rw - xfs /dev/nvme0n1p1 rw\n" +
		"garbage line\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMountInfo(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{{Device: "/dev/nvme8n1p2", MountPoint: "/", FSType: "ext4"},
		{Device: "/dev/nvme0n1p1", MountPoint: "/mnt/my data", FSType: "xfs"}}
	if !slices.Equal(got, want) {
		t.Errorf("ReadMountInfo = %+v, want %+v", got, want)
	}
	if got := unescapeMount(`/mnt/a\040b\\`); got != `/mnt/a b\\` {
		t.Errorf("unescapeMount = %q", got)
	}
	if _, err := ReadMountInfo(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing file: no error")
	}
}
