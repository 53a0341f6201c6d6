package runtime

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Options is what the agent gives a Factory: the settings every adapter may
// need. An adapter uses the ones it needs and ignores the rest; what only
// one runtime needs is that runtime's own Setting (see Entry).
type Options struct {
	// Root is the runtime's own state directory (NODE_AGENT_RUNTIME_DIR);
	// the image cache and the slice state live beside it, not in it.
	Root string
	// Images fetches and verifies base images, kernels and initrds.
	Images *image.Cache
	// Accel is the accelerator the agent proved and selected at start
	// (kvm, nvmm, hvf, tcg); "" when none works here. An adapter that
	// needs one refuses to build without it.
	Accel string
	// OnOrphanRemoved is called with the path of every file the runtime
	// removed because no instance owned it (the agent counts them).
	OnOrphanRemoved func(path string)
	// GPUs returns the host's discovered GPUs (the last host inventory);
	// nil when the agent has none to give. A runtime that maps GPUs itself
	// (containers) refuses one the host does not have.
	GPUs func() []api.GPU
	// OCICacheMaxBytes bounds the OCI image cache of a runtime that pulls
	// OCI images itself (NODE_AGENT_OCI_CACHE_MAX_GIB; 0: the cache's
	// default).
	OCICacheMaxBytes int64
	// MicroVMBridge and MicroVMCIDR are the bridge and per-host IPv4 CIDR
	// of microVM networking, MicroVMDNS the resolvers its guests get
	// (NODE_AGENT_MICROVM_BRIDGE, _CIDR, _DNS; empty: the defaults of
	// internal/node/netsetup).
	MicroVMBridge, MicroVMCIDR string
	MicroVMDNS                 []string
	// HostRoot is the host's / as the agent sees it (NODE_AGENT_HOST_ROOT;
	// "" is /): a runtime that boots from host block devices named by
	// path takes them below its dev/.
	HostRoot string
	Log      *slog.Logger
}

// Factory builds one adapter. It may create the adapter's state
// directories; it starts no instance (the agent calls Recover next).
type Factory func(ctx context.Context, opts Options) (Runtime, error)

// Registry maps a runtime name (NODE_AGENT_RUNTIME) to its entry. Each
// binary builds its own, so a runtime it does not register is not linked
// into it: drover-agent registers qemu, `drover dev` qemu and mock, and
// tests whatever they use.
type Registry map[string]Entry

// Names returns the registered names, sorted.
func (r Registry) Names() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// What an adapter may offer beyond Runtime. The agent checks for each with a
// type assertion, so it needs no adapter's package.
type (
	// OrphanSweeper is a runtime that can leave files no instance owns
	// (QEMU's disk overlays, after a crash between two steps). The agent
	// runs RunOrphanLoop while it runs instances; it returns when ctx ends.
	OrphanSweeper interface {
		RunOrphanLoop(ctx context.Context, every time.Duration)
	}
	// Releaser is a runtime holding resources of its own (monitor
	// connections, watchers). The agent calls Close when it stops: it lets
	// go of every instance without stopping it, since instances outlive
	// the agent and the next one re-adopts them (Recover).
	Releaser interface {
		Close() error
	}
)
