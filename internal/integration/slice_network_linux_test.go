package integration

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/sliceflow"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// TestSliceWorkflowSliceNetworkTCG is TestSliceWorkflowTCG on the slice
// network, in a network namespace the test makes: the agent runs with
// NODE_AGENT_SLICE_CIDR (its bridge, NAT and DHCP server), reports it in
// its capabilities, and the workflow provisions the VM with a tap on the
// bridge; the guest (qemutest with sshd, KnobDHCP) takes the slot's
// reserved address with its own udhcpc; the allocation turns active with
// that address; a brokered terminal reaches the guest's sshd at it over
// the bridge; the release drops the reservation and leaves nothing.
func TestSliceWorkflowSliceNetworkTCG(t *testing.T) {
	if _, child := testutil.InOwnNetNS(t, 15*time.Minute, nil); !child {
		return
	}
	const cidr, bridge = "10.77.0.0/24", "br-slice"
	e := browserEnv(t)
	n := newSliceNodeWith(t, e, "slice-net", sliceNodeOpts{linuxBridge: true,
		tune: func(c *agent.Config) { c.SliceCIDR, c.SliceBridge = cidr, bridge }})
	slots := n.approveSlots(e)
	var spec struct {
		PrivateIP  string `json:"private_ip"`
		MACAddress string `json:"mac_address"`
	}
	if err := json.Unmarshal(slots[0].Spec, &spec); err != nil || !strings.HasPrefix(spec.PrivateIP, "10.77.0.") {
		t.Fatalf("slot spec %s (%v): want an address in %s", slots[0].Spec, err, cidr)
	}
	const user = "alice"
	req := n.request(user)
	req.Boot.Cmdline += " " + qemutest.KnobDHCP
	a := e.createSlice(req)
	a = e.followSlice(a.ID, 8*time.Minute, nil, settled)
	wf := a.Workflow
	if a.State != api.AllocationActive || wf == nil {
		raw, _ := json.MarshalIndent(a, "", "  ")
		t.Fatalf("allocation not active:\n%s", raw)
	}
	for _, st := range wf.Steps {
		if st.Step == sliceflow.StepLeaseSlots && !strings.Contains(st.Detail, "slice network "+cidr+" on "+bridge) {
			t.Errorf("lease_slots detail %q does not name the slice network", st.Detail)
		}
	}
	pt := e.waitTask(wf.ProvisionTaskID, 10*time.Second)
	p, fe := task.DecodeVMProvisionParams(pt.Params)
	if fe != nil || p.OVSBridge != bridge || len(p.Slots) != 1 || p.Slots[0].PrivateIP != spec.PrivateIP {
		t.Errorf("slice.vm_provision params (%v): %s", fe, pt.Params)
	}
	vm := wf.VM
	if vm == nil || !vm.Ready || vm.PrivateIP != spec.PrivateIP || vm.SSHHost != spec.PrivateIP || vm.SSHPort != 22 {
		t.Fatalf("vm %+v, want ready at %s:22", vm, spec.PrivateIP)
	}
	// The guest's udhcpc leased the slot's address from the agent.
	if log := serialLogs(t, n.rtDir); !strings.Contains(log, qemutest.DHCPBoundMarker+" "+spec.PrivateIP) {
		t.Errorf("the guest's console does not show the DHCP lease of %s:\n%s", spec.PrivateIP, log)
	}
	if r := n.files("slices/dhcp-hosts.d"); len(r) != 1 {
		t.Errorf("DHCP reservations %v, want the slot's", r)
	}

	// The brokered terminal: gateway → node → SSH at the VM's address on
	// the bridge.
	tok := e.mintToken(a.ID, api.TerminalTokenRequest{Cols: 90, Rows: 25})
	br := e.dialTerminal(tok, wsOpts{})
	br.waitReady(90 * time.Second)
	br.send(terminal.ChanStdin, []byte("echo net-$((40+2)); id -un; ifconfig eth0 | grep -c 'inet addr:"+spec.PrivateIP+" '\n"))
	br.readUntil(fmt.Sprintf("net-42\r\n%s\r\n1\r\n", user), 30*time.Second)
	br.send(terminal.ChanStdin, []byte("exit 4\n"))
	if c := br.control(30 * time.Second); c.Type != terminal.TypeExit || c.ExitCode != 4 {
		t.Fatalf("got %+v, want exit 4", c)
	}
	e.waitSessionClosed(tok.SessionID, 10*time.Second)

	var rel api.Allocation
	if st := e.op(http.MethodDelete, "/api/v1/allocations/"+a.ID, nil, &rel); st != http.StatusAccepted {
		t.Fatalf("release: HTTP %d", st)
	}
	rel = e.followSlice(a.ID, 3*time.Minute, nil, settled)
	if rel.State != api.AllocationReleased {
		t.Fatalf("after release: %+v", rel)
	}
	n.noSliceLeftovers(e)
}

// serialLogs is every QEMU serial log under rtDir, concatenated.
func serialLogs(t *testing.T, rtDir string) string {
	t.Helper()
	var b strings.Builder
	_ = filepath.WalkDir(rtDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "serial.log" {
			if data, err := os.ReadFile(p); err == nil {
				b.Write(data)
			}
		}
		return nil
	})
	return b.String()
}
