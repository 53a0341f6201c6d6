package slice

import (
	"context"
	"net/netip"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
)

func TestSlotMAC(t *testing.T) {
	mac := regexp.MustCompile(`^02(:[0-9a-f]{2}){5}$`)
	seen := map[string]string{}
	for _, host := range []string{"gpu-host-01", "gpu-host-02"} {
		for i := 0; i < 64; i++ {
			m := SlotMAC(host, i)
			if !mac.MatchString(m) {
				t.Fatalf("SlotMAC(%q, %d) = %q: not a locally administered unicast MAC", host, i, m)
			}
			if m != SlotMAC(host, i) {
				t.Fatalf("SlotMAC(%q, %d) not deterministic", host, i)
			}
			key := host + "/" + strconv.Itoa(i)
			if prev, dup := seen[m]; dup {
				t.Fatalf("SlotMAC collision %s: %s and %s", m, prev, key)
			}
			seen[m] = key
		}
	}
	if got := SlotMAC("gpu-host-01", 0); got != "02:9f:5b:e0:ae:84" {
		t.Errorf("SlotMAC changed: %s (MACs of existing slots would move)", got)
	}
}

func TestSlotIP(t *testing.T) {
	tests := []struct {
		cidr  string
		index int
		want  string // "" means exhausted
	}{
		{"10.77.0.0/24", 0, "10.77.0.10"},
		{"10.77.0.0/24", 7, "10.77.0.17"},
		{"10.77.0.0/24", 244, "10.77.0.254"},
		{"10.77.0.0/24", 245, ""}, // .255 is broadcast
		{"10.77.0.0/28", 4, "10.77.0.14"},
		{"10.77.0.0/28", 5, ""},
		{"172.16.0.0/16", 300, "172.16.1.54"},
		{"10.77.0.0/24", -1, ""},
	}
	for _, tc := range tests {
		got, ok := SlotIP(netip.MustParsePrefix(tc.cidr), tc.index)
		if (tc.want == "") == ok || (ok && got.String() != tc.want) {
			t.Errorf("SlotIP(%s, %d) = %v, %v; want %q", tc.cidr, tc.index, got, ok, tc.want)
		}
	}
}

func TestPairByNUMA(t *testing.T) {
	tests := []struct {
		name        string
		gpus, cands []int
		want        []int
	}{
		{"same node first", []int{0, 1}, []int{1, 0}, []int{1, 0}},
		{"cross node only when none left", []int{0, 0, 1}, []int{0, 1, 1}, []int{0, 2, 1}},
		{"later gpus keep their node", []int{0, 0, 1, 1}, []int{0, 1, 1}, []int{0, -1, 1, 2}},
		{"unknown matches unknown", []int{-1, -1}, []int{-1, 0}, []int{0, 1}},
		{"none", []int{0}, nil, []int{-1}},
		{"no gpus", nil, []int{0}, []int{}},
	}
	for _, tc := range tests {
		if got := pairByNUMA(tc.gpus, tc.cands); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: pairByNUMA(%v, %v) = %v, want %v", tc.name, tc.gpus, tc.cands, got, tc.want)
		}
	}
}

// readyHost is a ready host with the given GPUs (addr→numa) and one NVMe
// namespace per entry of nvme (numa), controllers at 0000:e<i>:00.0.
func readyHost(gpus [][2]string, nvme []string) hostinfotest.Host {
	h := hostinfotest.Host{
		CPUInfo: intelCPUInfo, Meminfo: meminfo, Modules: allModules(), KVM: true, IPForward: "1",
		Cmdline: "ro intel_iommu=on", Mounts: "/dev/sda1 / ext4 rw 0 0\n", Virtual: ovsBridge(),
		PCI: []hostinfotest.PCI{{Addr: "0000:00:00.0", Vendor: "0x8086", Device: "0x09a2", Class: "0x060000", IOMMUGroup: "0"}},
	}
	for i, g := range gpus {
		h.PCI = append(h.PCI, gpu(g[0], g[1], strconv.Itoa(10+i)))
	}
	for i, numa := range nvme {
		ctrl := "0000:e" + strconv.Itoa(i) + ":00.0"
		h.PCI = append(h.PCI, nvmeCtrl(ctrl, numa, strconv.Itoa(50+i)))
		h.Block = append(h.Block, namespace(i, ctrl))
	}
	return h
}

func TestDiscoverBlockers(t *testing.T) {
	twoGPUs := [][2]string{{"0000:3b:00.0", "0"}, {"0000:3c:00.0", "0"}}
	type slotWant map[int][]string // slot index → blocker codes
	tests := []struct {
		name     string
		host     func() hostinfotest.Host
		lookPath func(string) (string, error)
		goos     string
		params   Params
		wantHost []string
		wantSlot slotWant
	}{
		{"ready", func() hostinfotest.Host { return readyHost(twoGPUs, []string{"0", "0"}) }, nil, "", Params{}, nil, slotWant{}},
		{"nvme on the other node", func() hostinfotest.Host { return readyHost(twoGPUs, []string{"0", "1"}) }, nil, "", Params{},
			nil, slotWant{1: {BlockerGPUNUMAMismatch}}},
		{"no nvme", func() hostinfotest.Host { return readyHost(twoGPUs[:1], nil) }, nil, "", Params{},
			nil, slotWant{0: {BlockerNVMeUnavailable}}},
		{"only nvme is the mounted OS disk", func() hostinfotest.Host {
			h := readyHost(twoGPUs, []string{"0", "0"})
			h.Mounts = "/dev/nvme1n1p1 / ext4 rw 0 0\n"
			h.Block[1].Partitions = []string{"nvme1n1p1"}
			return h
		}, nil, "", Params{}, nil, slotWant{1: {BlockerNVMeMounted}}},
		{"lvm holder and swap count as in use", func() hostinfotest.Host {
			h := readyHost(twoGPUs, []string{"0", "0", "0"})
			h.Block[0].Holders = []string{"dm-0"}
			h.Files = map[string]string{"proc/swaps": swapsHeader + "/dev/nvme1n1 partition 8388604 0 -2\n"}
			return h
		}, nil, "", Params{}, nil, slotWant{1: {BlockerNVMeMounted}}},
		{"no by-id link", func() hostinfotest.Host {
			h := readyHost(twoGPUs[:1], []string{"0"})
			h.Block[0].ByID = nil
			return h
		}, nil, "", Params{}, nil, slotWant{0: {BlockerNVMeByIDMissing}}},
		{"too few VFs", func() hostinfotest.Host {
			h := readyHost(twoGPUs, []string{"0", "0"})
			h.PCI = append(h.PCI, mlxPF("0000:1a:00.0", "0", "70", "ibp26s0", 90, 1)...)
			return h
		}, nil, "", Params{}, nil, slotWant{1: {BlockerFabricVFUnavailable}}},
		{"gpu shares its iommu group", func() hostinfotest.Host {
			h := readyHost(twoGPUs[:1], []string{"0"})
			h.PCI = append(h.PCI,
				hostinfotest.PCI{Addr: "0000:3b:00.1", Vendor: "0x10de", Device: "0x22a3", Class: "0x040300", IOMMUGroup: "10"},
				hostinfotest.PCI{Addr: "0000:3a:00.0", Vendor: "0x1000", Device: "0xc010", Class: "0x060400", IOMMUGroup: "10"},
				hostinfotest.PCI{Addr: "0000:3d:00.0", Vendor: "0x8086", Device: "0x1533", Class: "0x020000", IOMMUGroup: "10"})
			return h
		}, nil, "", Params{}, nil, slotWant{0: {BlockerGPUIOMMUGroupShared}}},
		{"private cidr runs out", func() hostinfotest.Host {
			return readyHost([][2]string{{"0000:31:00.0", "0"}, {"0000:32:00.0", "0"}, {"0000:33:00.0", "0"},
				{"0000:34:00.0", "0"}, {"0000:35:00.0", "0"}, {"0000:36:00.0", "0"}}, []string{"0", "0", "0", "0", "0", "0"})
		}, nil, "", Params{PrivateCIDR: "10.77.0.0/28"}, nil, slotWant{5: {BlockerPrivateIPExhausted}}},
		{"host not ready", func() hostinfotest.Host {
			h := readyHost(twoGPUs[:1], []string{"0"})
			h.KVM, h.CPUInfo, h.IPForward = false, amdCPUInfo[:strings.Index(amdCPUInfo, "flags")], "0"
			h.Virtual = []hostinfotest.Net{{Name: "br-slice", OperState: "up", Bridge: true}}
			h.Files = map[string]string{"root/var/run/reboot-required": "*** System restart required ***"}
			return h
		}, nil, "", Params{}, []string{BlockerKVMUnavailable, BlockerCPUVirtMissing, BlockerRebootRequired,
			BlockerIPForwardDisabled}, slotWant{}}, // a Linux bridge is a notice (ovs_bridge_not_ovs), not a blocker
		{"no gpus", func() hostinfotest.Host { return readyHost(nil, []string{"0"}) }, nil, "", Params{},
			[]string{BlockerNoGPUs}, slotWant{}},
		{"not linux", func() hostinfotest.Host { return hostinfotest.Host{} }, nil, "windows", Params{},
			[]string{BlockerUnsupportedOS}, slotWant{}},
		{"other bridge name", func() hostinfotest.Host { return readyHost(twoGPUs[:1], []string{"0"}) }, nil, "",
			Params{OVSBridge: "br-gpu"}, []string{BlockerOVSBridgeMissing}, slotWant{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lp := tc.lookPath
			if lp == nil {
				lp = missingCommands()
			}
			d := testDiscoverer(tc.host().Build(t), lp)
			if tc.goos != "" {
				d.cfg.GOOS = tc.goos
			}
			topo, _, err := d.Discover(context.Background(), tc.params, nil)
			if err != nil {
				t.Fatal(err)
			}
			gotHost, gotSlot := []string{}, slotWant{}
			for _, b := range topo.CandidateSummary.Blockers {
				if b.Message == "" {
					t.Errorf("blocker %s has no message", b.Code)
				}
				if b.SlotIndex == nil {
					gotHost = append(gotHost, b.Code)
				} else {
					gotSlot[*b.SlotIndex] = append(gotSlot[*b.SlotIndex], b.Code)
				}
			}
			if tc.wantHost == nil {
				tc.wantHost = []string{}
			}
			if !reflect.DeepEqual(gotHost, tc.wantHost) || !reflect.DeepEqual(gotSlot, tc.wantSlot) {
				t.Errorf("host blockers %v, slot blockers %v; want %v, %v\n%+v", gotHost, gotSlot, tc.wantHost, tc.wantSlot,
					topo.CandidateSummary.Blockers)
			}
			sched := 0
			for _, s := range topo.CandidateSlots {
				want := len(gotHost) == 0 && len(gotSlot[s.SlotIndex]) == 0
				if s.Schedulable != want {
					t.Errorf("slot %d schedulable = %v, want %v", s.SlotIndex, s.Schedulable, want)
				}
				if s.Schedulable {
					sched++
				}
			}
			if !topo.ApprovalRequired || topo.CandidateSummary.SchedulableSlots != sched ||
				topo.CandidateSummary.HostReady != (len(gotHost) == 0) {
				t.Errorf("summary %+v", topo.CandidateSummary)
			}
		})
	}
}
