package agent

// The slice network of GPU slice VMs: the DHCP reservations slicevm
// writes, pruned at start of VMs that are gone, and, with
// NODE_AGENT_SLICE_CIDR, the bridge, NAT and the DHCP server answering
// them (internal/node/slicedhcp, internal/node/netsetup).

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/slicedhcp"
	"github.com/drover-dev/drover/internal/node/slicevm"
)

// sliceNATTable is the nftables table of the slice network's NAT rules.
const sliceNATTable = "drover_slice"

// sliceSubnet is NODE_AGENT_SLICE_CIDR as a prefix (invalid: not set;
// Validate checked it).
func (c Config) sliceSubnet() netip.Prefix {
	p, err := netip.ParsePrefix(c.SliceCIDR)
	if err != nil {
		return netip.Prefix{}
	}
	return p.Masked()
}

// openSliceDHCP opens the store of the slots' DHCP reservations under
// root/slices (where slicevm keeps its state) and drops the reservations
// of VMs the runtime no longer has: what a crash between dhcp_reservation
// and the VM's creation, or during a release, leaves behind. It runs
// before any task does.
func (a *Agent) openSliceDHCP(ctx context.Context, rt runtime.Runtime, root string) (*slicedhcp.Store, error) {
	st, err := slicedhcp.OpenStore(filepath.Join(root, "slices", "dhcp-hosts.d"), a.cfg.sliceSubnet())
	if err != nil {
		return nil, fmt.Errorf("slice dhcp reservations: %w", err)
	}
	if len(st.VMs()) == 0 {
		return st, nil
	}
	list, err := rt.List(ctx)
	if err != nil {
		a.log.Warn("slice dhcp: cannot list instances; keeping every reservation", "err", err)
		return st, nil
	}
	live := map[string]bool{}
	for _, s := range list {
		if s.Owner == slicevm.Owner {
			live[s.ID] = true
		}
	}
	dropped, err := st.Prune(func(vm string) bool { return live[vm] })
	if len(dropped) > 0 {
		a.log.Info("slice dhcp: dropped the reservations of VMs that are gone", "vms", dropped)
	}
	if err != nil {
		a.log.Warn("slice dhcp: dropping stale reservations", "err", err)
	}
	for _, err := range st.Bad() {
		a.log.Warn("slice dhcp: unreadable reservation file (serves nothing)", "err", err)
	}
	return st, nil
}

// runSliceNetwork makes the slice network and serves DHCP on it until ctx
// ends, when NODE_AGENT_SLICE_CIDR is set. A failure is logged and
// retried (a bridge that appears later, port 67 freed); it never stops
// the agent.
func (a *Agent) runSliceNetwork(ctx context.Context, st *slicedhcp.Store, root string) {
	subnet := a.cfg.sliceSubnet()
	if !subnet.IsValid() || st == nil {
		return
	}
	bo := newBackoff(5*time.Second, 5*time.Minute)
	for ctx.Err() == nil {
		err := a.serveSliceNetwork(ctx, st, root, subnet)
		if ctx.Err() != nil {
			return
		}
		wait := bo.next()
		a.log.Error("slice network: DHCP for slice VMs is not served", "bridge", a.cfg.SliceBridge, "cidr", subnet,
			"err", err, "retry_in", wait)
		if sleepUntil(ctx, a.now, a.now().Add(wait)) != nil {
			return
		}
	}
}

func (a *Agent) serveSliceNetwork(ctx context.Context, st *slicedhcp.Store, root string, subnet netip.Prefix) error {
	m, err := netsetup.New(netsetup.Config{Bridge: a.cfg.SliceBridge, CIDR: subnet.String(), DNS: a.cfg.microVMDNS(),
		StateDir: filepath.Join(root, "slices", "net"), Table: sliceNATTable})
	if err != nil {
		return err
	}
	defer func() { _ = m.Close() }()
	if err := m.EnsureNetwork(ctx); err != nil {
		return err
	}
	var dns []netip.Addr
	for _, d := range a.cfg.microVMDNS() {
		if ad, err := netip.ParseAddr(d); err == nil {
			dns = append(dns, ad)
		}
	}
	if len(dns) == 0 {
		dns = []netip.Addr{netip.MustParseAddr(netsetup.DefaultDNS)}
	}
	srv, err := slicedhcp.NewServer(slicedhcp.Config{Interface: a.cfg.SliceBridge, Subnet: subnet, DNS: dns, Log: a.log}, st)
	if err != nil {
		return err
	}
	done, err := srv.Start(ctx)
	if err != nil {
		return err
	}
	return <-done
}
