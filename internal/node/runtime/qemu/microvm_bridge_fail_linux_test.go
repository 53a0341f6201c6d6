package qemu

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/volume"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/vishvananda/netlink"
)

// TestRealMicroVMBridgeSetupFailed: network_setup_failed from the real
// paths of mode bridge, in a network namespace of its own, the message
// naming the failing step; a failed Create leaves no instance, lease or
// tap behind.
func TestRealMicroVMBridgeSetupFailed(t *testing.T) {
	kit, child := inOwnNetNS(t)
	if !child {
		return
	}
	ctx := context.Background()
	fixed := []api.PortForward{{Name: "http", GuestPort: 8080, HostPort: 18080}}
	cases := []struct {
		name, bridge, cidr string
		// setup prepares the host and other instances; op is the failing
		// call on instance "victim".
		setup   func(t *testing.T, g *bridgeRig, r *Runtime)
		op      func(g *bridgeRig, r *Runtime) error
		wantMsg string
		created bool // the victim exists after the failure (a failed Start)
	}{{
		name: "bridge name taken by a non-bridge link", bridge: "drbrq1", cidr: "10.76.1.0/24",
		setup: func(t *testing.T, _ *bridgeRig, _ *Runtime) {
			la := netlink.NewLinkAttrs()
			la.Name = "drbrq1"
			veth := &netlink.Veth{LinkAttrs: la, PeerName: "drbrq1p"}
			if err := netlink.LinkAdd(veth); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = netlink.LinkDel(veth) })
		},
		op: func(g *bridgeRig, r *Runtime) error {
			_, err := r.Create(ctx, g.spec("victim"))
			return err
		},
		wantMsg: "create bridge: drbrq1 exists and is a veth, not a bridge",
	}, {
		// A /29 has five addresses after the gateway.
		name: "CIDR exhausted", bridge: "drbrq2", cidr: "10.76.2.0/29",
		setup: func(t *testing.T, g *bridgeRig, r *Runtime) {
			for _, id := range []string{"fill1", "fill2", "fill3", "fill4", "fill5"} {
				if _, err := r.Create(ctx, g.spec(id)); err != nil {
					t.Fatal(err)
				}
				destroyAtEnd(t, r, id)
			}
		},
		op: func(g *bridgeRig, r *Runtime) error {
			_, err := r.Create(ctx, g.spec("victim"))
			return err
		},
		wantMsg: "allocate address: no free address in 10.76.2.0/29 (5 leases)",
	}, {
		name: "host port forwarded by another instance", bridge: "drbrq3", cidr: "10.76.3.0/24",
		setup: func(t *testing.T, g *bridgeRig, r *Runtime) {
			if _, err := r.Create(ctx, g.spec("holder", fixed...)); err != nil {
				t.Fatal(err)
			}
			destroyAtEnd(t, r, "holder")
			if _, err := r.Start(ctx, "holder"); err != nil {
				t.Fatal(err)
			}
		},
		op: func(g *bridgeRig, r *Runtime) error {
			if _, err := r.Create(ctx, g.spec("victim", fixed...)); err != nil {
				return err
			}
			_, err := r.Start(ctx, "victim")
			return err
		},
		wantMsg: "start victim: network_setup_failed: forwards: host port tcp/18080 is forwarded to instance holder",
		created: true,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newBridgeRig(t, kit, c.bridge, c.cidr)
			r, m := g.agent(t)
			c.setup(t, g, r)
			destroyAtEnd(t, r, "victim")
			err := c.op(g, r)
			var re *runtime.Error
			if !errors.As(err, &re) || re.Reason != api.ReasonNetworkSetupFailed || !strings.Contains(err.Error(), c.wantMsg) {
				t.Fatalf("got %v, want network_setup_failed with %q", err, c.wantMsg)
			}
			t.Logf("%v", err)
			st, ierr := r.Inspect(ctx, "victim")
			switch {
			case c.created && (ierr != nil || st.State != runtime.StateCreated):
				t.Errorf("after the failed start: %+v %v, want created", st.State, ierr)
			case !c.created && ierr == nil:
				t.Errorf("the failed create left an instance: %s", st.State)
			}
			if _, ok, _ := m.Lease("victim"); ok != c.created {
				t.Errorf("victim has a lease: %v, want %v", ok, c.created)
			}
			if c.created {
				return
			}
			if ipamHas(t, g.netDir, "victim") || link(t, netsetup.TapName("victim")) != nil {
				t.Errorf("the failed create leaked: lease %v, taps %v", ipamHas(t, g.netDir, "victim"), taps(t))
			}
		})
	}

	// A create that fails after the lease (here at its volume, which
	// another instance holds) frees the lease and the tap too.
	t.Run("create failing after the lease", func(t *testing.T) {
		g := newBridgeRig(t, kit, "drbrq4", "10.76.4.0/24")
		r, m := g.agent(t)
		vm, err := volume.New(volume.Options{Dir: filepath.Join(g.root, "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		r.opts.MicroVM.Volumes = vm
		vol := runtime.Volume{Source: "data", Target: "/data", SizeGiB: 1}
		holder := g.spec("holder")
		holder.Volumes = []runtime.Volume{vol}
		if _, err := r.Create(ctx, holder); err != nil {
			t.Fatal(err)
		}
		destroyAtEnd(t, r, "holder")
		victim := g.spec("victim")
		victim.Volumes = []runtime.Volume{vol}
		destroyAtEnd(t, r, "victim")
		if _, err := r.Create(ctx, victim); runtime.ReasonOf(err, "") != api.ReasonVolumeAttachFailed {
			t.Fatalf("create with a held volume: %v, want volume_attach_failed", err)
		}
		if _, ok, _ := m.Lease("victim"); ok || link(t, netsetup.TapName("victim")) != nil || instRules(t, m, "victim") != 0 {
			t.Fatalf("the failed create leaked: lease %v, taps %v", ok, taps(t))
		}
		if l, ok, _ := m.Lease("holder"); !ok || l.IP.String() != "10.76.4.2" {
			t.Fatalf("holder's lease %+v %v", l, ok)
		}
	})
}
