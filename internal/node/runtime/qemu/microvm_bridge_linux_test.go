package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/vishvananda/netlink"
)

// testDNS are the resolvers the rigs give their guests (not the default,
// so the guest's /etc/resolv.conf shows the setting arrived, every one).
var testDNS = []string{"192.0.2.53", "192.0.2.54"}

// bridgeRig is an agent's microVM side inside the test's network
// namespace: a runtime root and a netsetup state directory that outlive
// the runtimes and managers made over them (an agent restart makes new
// ones).
type bridgeRig struct {
	kit          bridgeKit
	root, netDir string
	bridge, cidr string
	readyIn      time.Duration
}

func newBridgeRig(t *testing.T, kit bridgeKit, bridge, cidr string) *bridgeRig {
	root := shortDir(t)
	return &bridgeRig{kit: kit, root: root, netDir: filepath.Join(root, "net"), bridge: bridge, cidr: cidr,
		readyIn: 4 * time.Minute}
}

// agent makes a Runtime and its netsetup Manager over the rig's state, as
// the QEMU factory does at agent start.
func (g *bridgeRig) agent(t *testing.T) (*Runtime, *netsetup.Manager) {
	t.Helper()
	m, err := netsetup.New(netsetup.Config{Bridge: g.bridge, CIDR: g.cidr, DNS: testDNS, StateDir: g.netDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	r := newTestRuntime(t, g.root, []string{filepath.Dir(g.kit.Rootfs)}, func(o *Options) {
		o.QEMUBinary, o.QEMUImg = g.kit.QEMU, g.kit.QEMUImg
		o.MicroVM = &MicroVMOptions{Kernel: g.kit.Kernel, Initrd: g.kit.Initrd, Net: m}
	})
	return r, m
}

// spec is the test HTTP server on guest port 8080 in mode bridge, Ready by
// HTTP on the lease's address.
func (g *bridgeRig) spec(id string, fwds ...api.PortForward) runtime.Spec {
	if len(fwds) == 0 {
		fwds = []api.PortForward{{Name: "http", GuestPort: 8080}}
	}
	return runtime.Spec{ID: id, Owner: "test", Image: runtime.Image{URL: "file://" + g.kit.Rootfs, SHA256: g.kit.RootfsSHA256},
		Command: []string{"/testserver"}, Env: map[string]string{"PORT": "8080"}, Ports: fwds,
		Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 256},
		Readiness: runtime.Readiness{Readiness: api.Readiness{TCPPort: 8080, HTTPPath: "/health", Timeout: api.Duration(g.readyIn)}},
		VM:        &runtime.VMSpec{MicroVM: true, Network: runtime.VMNetwork{Mode: api.NetworkBridge}}}
}

// getOK GETs /health at addr and wants "ok".
func getOK(t *testing.T, what, addr string) {
	t.Helper()
	c := http.Client{Timeout: 20 * time.Second}
	resp, err := c.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "ok" {
		t.Fatalf("%s: HTTP %d %q", what, resp.StatusCode, b)
	}
}

// link is the device name in the test's namespace, nil when there is none.
func link(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// taps lists the netsetup taps (dv…) in the test's namespace.
func taps(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, netsetup.TapPrefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// instRules counts the nftables rules tagged for instance id.
func instRules(t *testing.T, m *netsetup.Manager, id string) int {
	t.Helper()
	tags, err := m.RuleTags()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range tags {
		if strings.HasSuffix(s, " drover:inst:"+id) {
			n++
		}
	}
	return n
}

// ipamHas says whether the lease file names id.
func ipamHas(t *testing.T, dir, id string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "ipam.json"))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), strconv.Quote(id))
}

// bootReady creates and starts id and waits for Ready (by HTTP on the
// lease's address: mode bridge has no user-mode forward to fall back on).
func bootReady(t *testing.T, r *Runtime, s runtime.Spec) runtime.Status {
	t.Helper()
	ctx := context.Background()
	if _, err := r.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	return startReady(t, r, s.ID)
}

func startReady(t *testing.T, r *Runtime, id string) runtime.Status {
	t.Helper()
	t0 := time.Now()
	if _, err := r.Start(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	st := waitReadyStatus(t, r, id, 4*time.Minute)
	t.Logf("%s: start → Ready through the bridge in %v", id, time.Since(t0).Round(time.Millisecond))
	return st
}

// TestRealMicroVMBridge boots the test HTTP server as a microVM under TCG
// in network mode bridge, in a network namespace of its own: the guest
// configures the leased address (drover-init, from the config drive) and
// answers on it through the bridge, the readiness probe reaches Ready
// there, a DNAT forward carries a host port to it; Destroy frees the tap,
// the lease and the rules. Then an agent crash: the runtime is dropped
// and QEMU killed, a new runtime and Manager recover the instance with its
// address and tap and start it again; a second crash that also loses the
// instance's directory (QEMU left running) leaks nothing once Recover ran.
func TestRealMicroVMBridge(t *testing.T) {
	kit, child := inOwnNetNS(t)
	if !child {
		return
	}
	ctx := context.Background()
	g := newBridgeRig(t, kit, "drbrq0", "10.77.0.0/24")
	r, m := g.agent(t)

	// Boot, Ready through the bridge, the guest on its lease.
	const id = "brvm1"
	s := g.spec(id)
	// The guest's resolver and routes on the console, then the server.
	s.Command = []string{"/bin/sh", "-c", "cat /etc/resolv.conf /proc/net/route; exec /testserver"}
	if _, err := r.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r, id)
	lease, ok, err := m.Lease(id)
	if err != nil || !ok || lease.IP.String() != "10.77.0.2" || lease.Gateway.String() != "10.77.0.1" {
		t.Fatalf("lease after create: %+v %v %v", lease, ok, err)
	}
	_, args, err := r.CommandLine(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(args, " ")
	if !strings.Contains(line, "tap,id=n0,ifname="+lease.Tap+",") || !strings.Contains(line, "mac="+lease.MAC) {
		t.Fatalf("command line lacks the lease's tap and MAC: %s", line)
	}
	st := startReady(t, r, id)
	getOK(t, "the guest on its lease", net.JoinHostPort(lease.IP.String(), "8080"))
	hostPort := st.Ports["http"]
	if hostPort == 0 {
		t.Fatalf("no host port for the forward: %v", st.Ports)
	}
	getOK(t, "the DNAT forward from the host's port", net.JoinHostPort(lease.Gateway.String(), strconv.Itoa(hostPort)))
	if err := r.Probe(ctx, id); err != nil {
		t.Errorf("probe: %v", err)
	}
	// drover-init set the lease's resolvers and its default route via the
	// gateway (/proc/net/route: destination 0, gateway little-endian hex).
	gw := lease.Gateway.As4()
	route := fmt.Sprintf("eth0\t00000000\t%02X%02X%02X%02X", gw[3], gw[2], gw[1], gw[0])
	resolv := "nameserver " + strings.Join(testDNS, "\nnameserver ") + "\n"
	if log := strings.ReplaceAll(serialLog(t, st), "\r\n", "\n"); !strings.Contains(log, resolv) || !strings.Contains(log, route) {
		t.Errorf("the guest lacks %q or a default route via %s (%q):\n%s", resolv, lease.Gateway, route, log)
	}
	br, tap := link(t, g.bridge), link(t, lease.Tap)
	if br == nil || tap == nil || tap.Attrs().MasterIndex != br.Attrs().Index || tap.Attrs().OperState == netlink.OperDown {
		t.Fatalf("tap %s on %s: %v %v", lease.Tap, g.bridge, tap, br)
	}
	if n := instRules(t, m, id); n != 2 { // prerouting and output DNAT
		t.Errorf("%d DNAT rules for %s, want 2", n, id)
	}

	// Destroy frees the tap, the lease and the rules.
	if err := r.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ipamHas(t, g.netDir, id) || link(t, lease.Tap) != nil || instRules(t, m, id) != 0 {
		t.Fatalf("after destroy: lease %v, taps %v, rules %d", ipamHas(t, g.netDir, id), taps(t), instRules(t, m, id))
	}

	// Agent crash with the VM killed too: a new agent recovers the
	// instance, keeps its address and tap, and starts it again.
	const id2 = "brvm2"
	st = bootReady(t, r, g.spec(id2))
	lease2, _, _ := m.Lease(id2)
	if lease2.IP != lease.IP {
		t.Errorf("the freed address %s was not reused: %s", lease.IP, lease2.IP)
	}
	crash(t, r, m, id2, st.PID)
	r2, m2 := g.agent(t)
	destroyAtEnd(t, r2, id2)
	list, err := r2.Recover(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id2 || list[0].State == runtime.StateRunning {
		t.Fatalf("recover after the crash: %+v %v", list, err)
	}
	if l, ok, _ := m2.Lease(id2); !ok || l.IP != lease2.IP || link(t, lease2.Tap) == nil {
		t.Fatalf("after recover: lease %+v %v, taps %v", l, ok, taps(t))
	}
	st = startReady(t, r2, id2)
	getOK(t, "the restarted guest on its lease", net.JoinHostPort(lease2.IP.String(), "8080"))

	// Agent crash that also loses the instance's directory, QEMU still
	// running: Recover kills that QEMU and Reconcile frees the lease, the
	// tap and the rules.
	pid, qmp := st.PID, filepath.Join(r2.instDir, id2, qmpSock)
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	_ = m2.Close()
	if err := os.RemoveAll(filepath.Join(r2.instDir, id2)); err != nil {
		t.Fatal(err)
	}
	r3, m3 := g.agent(t)
	if list, err := r3.Recover(ctx); err != nil || len(list) != 0 {
		t.Fatalf("recover without the instance's directory: %+v %v", list, err)
	}
	if !waitGone(ctx, pid, qmp, time.Minute) {
		t.Errorf("QEMU %d outlived its instance directory", pid)
	}
	if ipamHas(t, g.netDir, id2) || len(taps(t)) != 0 || instRules(t, m3, id2) != 0 {
		t.Fatalf("leaked after recover: lease %v, taps %v, rules %d", ipamHas(t, g.netDir, id2), taps(t), instRules(t, m3, id2))
	}
}

// crash plays an agent that dies with its VM: the runtime lets go of its
// instances without stopping them and QEMU is killed.
func crash(t *testing.T, r *Runtime, m *netsetup.Manager, id string, pid int) {
	t.Helper()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	_ = m.Close()
	qmp := filepath.Join(r.instDir, id, qmpSock)
	if !processAlive(pid, qmp) {
		t.Fatalf("QEMU %d of %s is not running", pid, id)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitGone(context.Background(), pid, qmp, time.Minute) {
		t.Fatalf("QEMU %d survives SIGKILL", pid)
	}
}
