package slice

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"

	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json")

func phases() []string {
	return []string{PhaseHost, PhaseCommands, PhaseNetwork, PhasePCI, PhaseNVMe, PhaseSlots}
}

// fakeClock advances 3ms per reading.
func fakeClock() func() time.Time {
	t := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	return func() time.Time { t = t.Add(3 * time.Millisecond); return t }
}

func testDiscoverer(r hostinfotest.Roots, lookPath func(string) (string, error)) *Discoverer {
	return NewDiscoverer(Config{
		SysRoot: r.Sys, ProcRoot: r.Proc, DevRoot: r.Dev, RootDir: r.Root,
		PCIIDsPath: "testdata/pci.ids", Getenv: func(string) string { return "" },
		LookPath: lookPath, HostID: "gpu-host-01", GOOS: "linux", GOARCH: "amd64", Now: fakeClock(),
	})
}

// TestDiscoverGolden compares the exact output on fake hosts with
// testdata/<name>.golden.json; go test -update rewrites them.
func TestDiscoverGolden(t *testing.T) {
	tests := []struct {
		name         string
		host         hostinfotest.Host
		lookPath     func(string) (string, error)
		params       string
		wantSlots    int
		wantBlockers []string // codes, in order
	}{
		{"gpu_host_8", gpuHost8(), missingCommands(), `{}`, 8, []string{}},
		{"iommu_off", iommuOffHost(), missingCommands(), `{"ovs_bridge":"br-slice","private_cidr":"192.168.77.0/24"}`, 0,
			[]string{BlockerIOMMUDisabled}},
		// The seed's tools (cloud-localds, virt-install, virsh, ovs-vsctl,
		// findmnt) are notices, never blockers; Drover's own (qemu-img,
		// qemu-system-x86_64) are blockers.
		{"missing_modules_commands", bareHost(), missingCommands("cloud-localds", "virt-install", "virsh", "ovs-vsctl",
			"findmnt", "qemu-img"), ``, 0,
			[]string{BlockerVFIOModulesMissing, "command_missing:qemu-img", BlockerOVSBridgeMissing}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := testDiscoverer(tc.host.Build(t), tc.lookPath)
			params, err := DecodeParams(json.RawMessage(tc.params))
			if err != nil {
				t.Fatal(err)
			}
			var seen []string
			topo, timings, err := d.Discover(context.Background(), params, func(phase string, dur time.Duration, err error) {
				if err != nil || dur != 3*time.Millisecond {
					t.Errorf("phase %s: %s, %v", phase, dur, err)
				}
				seen = append(seen, phase)
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(seen, phases()) || len(timings) != len(phases()) || timings[PhaseSlots+"_ms"] != 3 {
				t.Errorf("phases %v, timings %v", seen, timings)
			}
			if !topo.ApprovalRequired {
				t.Error("approval_required is false")
			}
			codes := []string{}
			for _, b := range topo.CandidateSummary.Blockers {
				codes = append(codes, b.Code)
			}
			for _, n := range topo.CandidateSummary.Notices {
				if rest, ok := strings.CutPrefix(n.Code, NoticeCommandAbsentPrefix); !ok || !slices.Contains(SeedCommands(), rest) {
					t.Errorf("notice %+v", n)
				}
			}
			for c, cmd := range topo.Prerequisites.RequiredCommands {
				if cmd.Required != slices.Contains(RequiredCommands("amd64"), c) {
					t.Errorf("required_commands[%s] %+v", c, cmd)
				}
			}
			if !reflect.DeepEqual(codes, tc.wantBlockers) || topo.CandidateSummary.SchedulableSlots != tc.wantSlots {
				t.Errorf("blockers %v, schedulable %d; want %v, %d", codes, topo.CandidateSummary.SchedulableSlots, tc.wantBlockers, tc.wantSlots)
			}
			got, err := json.MarshalIndent(topo, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			testutil.CheckGolden(t, filepath.Join("testdata", tc.name+".golden.json"), append(got, '\n'), *update)
		})
	}
}

// TestGPUHost8Pairing spells out the property the golden file holds: every
// slot pairs devices on the GPU's NUMA node, none reused, OS disk unused.
func TestGPUHost8Pairing(t *testing.T) {
	topo, _, err := testDiscoverer(gpuHost8().Build(t), missingCommands()).Discover(context.Background(), Params{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.CandidateSlots) != 8 || !topo.CandidateSummary.HostReady {
		t.Fatalf("summary %+v", topo.CandidateSummary)
	}
	used := map[string]bool{}
	for i, s := range topo.CandidateSlots {
		if s.NVMeDevice == nil || s.FabricDevice == nil || s.PrivateIP == nil || !s.Schedulable {
			t.Fatalf("slot %d incomplete: %+v", i, s)
		}
		if *s.NVMeNUMA != s.NUMANode || *s.FabricNUMA != s.NUMANode {
			t.Errorf("slot %d crosses NUMA nodes: %+v", i, s)
		}
		for _, k := range []string{*s.NVMeDevice, *s.FabricDevice, s.MACAddress, *s.PrivateIP} {
			if used[k] {
				t.Errorf("slot %d reuses %s", i, k)
			}
			used[k] = true
		}
		if want := fmt.Sprintf("10.77.0.%d", 10+i); *s.PrivateIP != want {
			t.Errorf("slot %d ip %s, want %s", i, *s.PrivateIP, want)
		}
		if strings.Contains(*s.NVMeDevice, "S6EUNE0R000008") || strings.Contains(*s.NVMeDevice, "0080025384500000001") {
			t.Errorf("slot %d got the OS disk %s", i, *s.NVMeDevice)
		}
	}
}

func TestDecodeParams(t *testing.T) {
	tests := []struct {
		raw     string
		want    Params
		wantErr string
	}{
		{"", Params{OVSBridge: "br-slice", PrivateCIDR: "10.77.0.0/24"}, ""},
		{`{"ovs_bridge":"br-gpu"}`, Params{OVSBridge: "br-gpu", PrivateCIDR: "10.77.0.0/24"}, ""},
		{`{"private_cidr":"10.77.0.1/24"}`, Params{}, "params.private_cidr: must be a network address (10.77.0.0/24)"},
		{`{"bogus":true}`, Params{}, "params.bogus: unknown parameter"},
	}
	for _, tc := range tests {
		got, err := DecodeParams(json.RawMessage(tc.raw))
		var pe *ParamsError
		switch {
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("DecodeParams(%q) = %+v, %v", tc.raw, got, err)
		case tc.wantErr != "" && (!errors.As(err, &pe) || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("DecodeParams(%q) err = %v, want %q", tc.raw, err, tc.wantErr)
		}
	}
}
